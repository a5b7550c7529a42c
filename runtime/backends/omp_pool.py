"""The CPU kernels' parallel loops on the OpenMP runtime torch has loaded.

Why: torch's CPU ops run on libgomp, whose worker threads spin for a few milliseconds
after every parallel region (``OMP_WAIT_POLICY`` unset). TVM's own thread pool then
starts its workers on cores those spinning threads hold: in a trainer, where every
``opt.step()`` follows ``loss.backward()``, the step ran 1.2-1.4x slower than torch's
fused one, and TVM's pool, spinning in turn, took cores from the next forward. libgomp
reads its wait policy when it loads, so nothing set from Python after ``import torch``
helps. Running the kernels' parallel loops on the same libgomp team instead means the
spinning threads are the ones that take the work: one pool serves both libraries.

How: a TVM-compiled library calls its parallel loops through one function pointer,
``__TVMBackendParallelLaunch`` (filled from libtvm_runtime when it loads, tvm-notes §7).
``attach`` points it at a small C trampoline (``SOURCE``) that runs the loop body on
``GOMP_parallel`` of the libgomp found in this process, or forwards to TVM's launch
when the pool is "tvm". omp_build.py compiles the trampoline once per compiler into the
cache folder and verifies what it loads (owner, mode, sha256). Where it cannot (no
compiler, a failed build), the kernels stay on TVM's pool, a warning says why once per
process and ``pool()["why"]`` keeps the reason; the next process tries again. Without
libgomp in the process (numpy-only trainers) nothing is compiled or touched.

A forked child (a DataLoader worker) never runs a loop on OpenMP: libgomp's team is
its parent's, and GOMP_parallel would wait for threads the child does not have. The
child is recognised by its pid and by at-fork handlers, in Python and in the
trampoline, and no call (``set_pool``, ``pool``) can undo that.

Which pool runs the kernels never changes their results: elementwise updates do not
depend on the split, and reductions sum a fixed number of chunks (schedule_llvm).

``OPTGEN_CPU_POOL`` chooses: ``auto`` (the default: OpenMP when a libgomp is loaded,
else TVM's; and TVM's while the machine is busy, more runnable threads than cores +
BUSY_SLACK, sampled every 250 ms: OpenMP threads wait for each other by spinning,
TVM's by yielding, which then wins), ``openmp`` (always, where a libgomp
is loaded) or ``tvm``; ``set_pool`` does the same at run time.
"""
from __future__ import annotations

import ctypes
import _ctypes
import os
import sys
import threading
import warnings

from . import omp_build

POOLS = ("auto", "openmp", "tvm")
LAUNCH = "__TVMBackendParallelLaunch"
BARRIER = "__TVMBackendParallelBarrier"   # the trampoline has no barrier: such kernels stay
# tasks per OpenMP thread, taken from a shared counter: a thread that runs takes the work
# of one waiting for a core another process holds (1: one static task per thread)
TASKS_PER_THREAD = 4
NO_GOMP = "no GOMP-ABI OpenMP runtime (libgomp, as torch loads) in this process"
FORKED = ("a forked child of the process that loaded optgen: libgomp's threads are the "
          "parent's")
CHOSEN = "OPTGEN_CPU_POOL or set_cpu_pool chose tvm"
# "auto" steps on TVM's pool while more threads are runnable in the system than the cores
# plus this many: OpenMP only where the machine is otherwise idle, the trainer case of
# a trainer. Measured on the 2-core VM: at load 6-18 the OpenMP route was 1.0-2.2x TVM's
# pool (its waits spin; TVM's yield), never clearly faster (docs/performance.md).
BUSY_SLACK = 1

SOURCE = r"""
/* TVMBackendParallelLaunch on a GOMP-ABI OpenMP runtime (optgen runtime/backends/omp_pool.py) */
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
typedef struct { void* sync_handle; int num_task; } Env;   /* TVMParallelGroupEnv */
typedef int (*Lambda)(int task_id, Env* penv, void* cdata);
typedef int (*Launch)(Lambda f, void* cdata, int num_task);
typedef void (*GompParallel)(void (*fn)(void*), void* data, unsigned nthreads, unsigned flags);
static GompParallel gomp_parallel;
static Launch tvm_launch;
static volatile int use_omp, n_threads = 1, tasks_per_thread = 4;
static volatile long omp_launches;                          /* read by tests */
static volatile int busy, busy_limit, owner_pid, in_child;
static long long next_check_ns;
/* threads runnable in the whole system: /proc/loadavg's fourth field, "runnable/total" */
static int runnable(void) {
  char buf[128];
  int fd = open("/proc/loadavg", O_RDONLY), field = 0, r = 0;
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  char* p = buf;
  while (*p && field < 3) if (*p++ == ' ') field++;
  while (*p >= '0' && *p <= '9') r = r * 10 + (*p++ - '0');
  return r;
}
/* OpenMP threads wait for each other by spinning, not yielding: where more threads are
   runnable than the machine has room for, TVM's pool (which yields) steps faster.
   Sampled at most every 250 ms (a coarse clock read per launch otherwise). */
static int oversubscribed(void) {
  if (busy_limit <= 0) return busy = busy_limit < 0;   /* 0: no check; < 0: always (tests) */
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  long long now = ts.tv_sec * 1000000000LL + ts.tv_nsec;
  if (now >= next_check_ns) {
    next_check_ns = now + 250000000LL;
    busy = runnable() > busy_limit;
  }
  return busy;
}
/* tasks are taken from a counter, several per thread: where another process holds a
   core, the threads that run take the tasks of the one that waits for it */
struct job { Lambda f; void* cdata; int ntask; int next; volatile int err; };
static void body(void* p) {
  struct job* j = (struct job*)p;
  Env env = {0, j->ntask};
  int t;
  while ((t = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->ntask) {
    int r = j->f(t, &env, j->cdata);
    if (r) j->err = r;
  }
}
int optgen_launch(Lambda f, void* cdata, int num_task) {
  /* a forked child (a DataLoader worker) has no OpenMP team of its parent's: TVM's pool */
  if (!use_omp || !gomp_parallel || in_child || getpid() != owner_pid || oversubscribed())
    return tvm_launch(f, cdata, num_task);
  int nt = num_task > 0 ? num_task : n_threads;
  struct job j = {f, cdata, num_task > 0 ? num_task : nt * tasks_per_thread, 0, 0};
  ++omp_launches;
  gomp_parallel(body, &j, (unsigned)nt, 0);
  return j.err;
}
void optgen_set_tvm(void* launch) { if (!tvm_launch) tvm_launch = (Launch)launch; }
void optgen_set_omp(void* gp) { gomp_parallel = (GompParallel)gp; }
long optgen_omp_launches(void) { return omp_launches; }
void optgen_set_mode(int omp, int n, int tasks, int limit) {
  n_threads = n > 0 ? n : 1; tasks_per_thread = tasks > 0 ? tasks : 1;
  busy_limit = limit; next_check_ns = 0; use_omp = omp;
}
/* once, at load: the process whose OpenMP team the launches may use; its forked
   children never (set_mode cannot change either) */
static void forked(void) { in_child = 1; }
void optgen_init(void) {
  if (owner_pid) return;
  owner_pid = getpid();
  pthread_atfork(0, 0, forked);
}
int optgen_busy(void) { return busy; }
"""


_state: dict = {"pool": os.environ.get("OPTGEN_CPU_POOL", "auto") or "auto",
                "pid": os.getpid(), "forked": False}
_pending: list[str] = []    # libraries loaded while their loops were to stay on TVM's pool


_lock = threading.Lock()    # one build per process, whichever thread loads a library first


def _in_child() -> None:
    global _lock
    _state["forked"] = True
    _lock = threading.Lock()    # (a thread of the parent may have held it at the fork)


os.register_at_fork(after_in_child=_in_child)


def _forked() -> bool:
    return _state["forked"] or os.getpid() != _state["pid"]


def _addr(obj) -> int:
    return ctypes.cast(obj, ctypes.c_void_p).value


def _trampoline() -> ctypes.CDLL | None:
    """The trampoline (built and verified on first use), None where it cannot be had:
    then ``_state["failed"]`` says why, and a warning said it once."""
    with _lock:
        if "shim" not in _state:
            _state["shim"] = _load()
    return _state["shim"]


def _load() -> ctypes.CDLL | None:
    shim, note = None, ""
    try:
        if not sys.platform.startswith("linux"):
            raise omp_build.TrampolineError("not Linux")
        shim, note = omp_build.load(SOURCE)
        shim.optgen_init()
        shim.optgen_omp_launches.restype = ctypes.c_long
    except (omp_build.TrampolineError, OSError) as e:   # (OSError: a disk full, ...)
        _state["failed"] = f"the OpenMP trampoline is unavailable: {e}"
        warnings.warn(f"optgen: the CPU kernels' parallel loops stay on TVM's thread pool, "
                      f"not torch's OpenMP runtime: {_state['failed']} (set "
                      "OPTGEN_CPU_POOL=tvm to choose TVM's pool and skip this)",
                      RuntimeWarning, stacklevel=4)
    if note:
        warnings.warn(f"optgen: the cached OpenMP trampoline {note}", RuntimeWarning,
                      stacklevel=4)
    return shim


def _gomp() -> ctypes.CDLL | None:
    """The GOMP-ABI OpenMP runtime this process has loaded (torch's libgomp), if any
    (kept once found: a loaded libgomp stays loaded)."""
    if _state.get("gomp") is not None:
        return _state["gomp"]
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if "/libgomp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if os.path.basename(path).startswith("libgomp"):
            try:
                lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
                lib.GOMP_parallel
                _state["gomp"] = lib
                return lib
            except (OSError, AttributeError):
                continue
    return None


def _decide() -> tuple[str, str, ctypes.CDLL | None]:
    """(the pool attached kernels use, why not OpenMP, libgomp where it is OpenMP)."""
    if _state["pool"] == "tvm":
        return "tvm", CHOSEN, None
    if _forked():
        return "tvm", FORKED, None
    gomp = _gomp()
    if gomp is None:
        return "tvm", NO_GOMP, None
    if _trampoline() is None:
        return "tvm", _state["failed"], None
    return "openmp", "", gomp


def _threads() -> int:
    """The kernels' thread count: set_num_threads's, else TVM_NUM_THREADS (which
    load_tvm_runtime sets to the cores this process may use where it is unset)."""
    if _state.get("threads"):
        return int(_state["threads"])
    try:
        return max(1, int(os.environ.get("TVM_NUM_THREADS", "")))
    except ValueError:
        return len(os.sched_getaffinity(0))


def _apply(shim: ctypes.CDLL) -> str:
    """Point the trampoline at the pool the setting asks for; the pool in use."""
    using, _, gomp = _decide()
    if gomp is not None:
        shim.optgen_set_omp(ctypes.c_void_p(_addr(gomp.GOMP_parallel)))
    n = _threads()
    auto = _state["pool"] == "auto"
    limit = max(n, len(os.sched_getaffinity(0))) + BUSY_SLACK if auto else 0
    shim.optgen_set_mode(int(using == "openmp"), n, TASKS_PER_THREAD, limit)
    return using


def _check_setting() -> None:
    if _state["pool"] not in POOLS:
        raise ValueError(f"OPTGEN_CPU_POOL must be one of {', '.join(POOLS)}, "
                         f"got {_state['pool']!r}")


def attach(library: str) -> bool:
    """Route the parallel loops of the TVM library at ``library`` (already loaded by
    tvm_ffi) through the trampoline; False where they stay on TVM's pool untouched
    (until a ``set_pool`` call finds OpenMP usable)."""
    _check_setting()
    using, _, _ = _decide()
    if using != "openmp":
        if not _forked() and "failed" not in _state and library not in _pending:
            _pending.append(library)      # (set_pool may attach it later)
        return False                      # (numpy-only processes: TVM's pool, untouched)
    return _attach_loaded(library, os.RTLD_LOCAL)


def _attach_loaded(library: str, mode: int) -> bool:
    shim = _trampoline()
    try:
        lib = ctypes.CDLL(library, mode=mode)   # the handle tvm_ffi opened (same path)
    except OSError:                       # (a pending one since unloaded)
        return False
    try:
        return _point(shim, lib)
    finally:
        _ctypes.dlclose(lib._handle)      # only our reference: tvm_ffi's keeps it loaded


def _point(shim: ctypes.CDLL, lib: ctypes.CDLL) -> bool:
    try:
        ptr = ctypes.c_void_p.in_dll(lib, LAUNCH)
    except ValueError:                    # no parallel loop in this library
        return False
    try:
        ctypes.c_void_p.in_dll(lib, BARRIER)
        return False                      # kernels that synchronise inside a launch
    except ValueError:
        pass
    if not ptr.value:
        return False
    if ptr.value != _addr(shim.optgen_launch):
        shim.optgen_set_tvm(ctypes.c_void_p(ptr.value))
    _apply(shim)
    ptr.value = _addr(shim.optgen_launch)
    return True


def set_pool(pool: str) -> str:
    """Choose the pool of the CPU kernels' parallel loops: "auto", "openmp" or "tvm".
    Returns the pool now in use for attached kernels ("openmp" or "tvm")."""
    if pool not in POOLS:
        raise ValueError(f"set_pool: pool must be one of {', '.join(POOLS)}, got {pool!r}")
    _state["pool"] = pool
    using = _decide()[0]
    if using == "openmp":
        while _pending:                   # loaded under "tvm": attach them now
            _attach_loaded(_pending.pop(), os.RTLD_NOLOAD)
    if _state.get("shim") is not None:
        _apply(_state["shim"])
    return using


def pool() -> dict[str, str]:
    """The setting, the pool attached kernels use ("openmp" or "tvm"), why not OpenMP if
    not, and whether "auto" last found the machine oversubscribed (then TVM's runs).
    Changes nothing (it may build the trampoline, to say whether OpenMP can run)."""
    try:
        _check_setting()
    except ValueError as e:
        return {"setting": _state["pool"], "pool": "tvm", "why": str(e),
                "oversubscribed": "false"}
    using, why, _ = _decide()
    shim = _state.get("shim")
    busy = bool(shim.optgen_busy()) if shim is not None and using == "openmp" else False
    return {"setting": _state["pool"], "pool": using, "why": why,
            "oversubscribed": str(busy).lower()}


def omp_launches() -> int:
    """How many parallel loops ran on OpenMP so far in this process (a test's proof)."""
    shim = _state.get("shim")
    return int(shim.optgen_omp_launches()) if shim is not None else 0


def threads_changed(n: int) -> None:
    """Tell the trampoline the new thread count (runtime/threads.py calls this)."""
    _state["threads"] = str(int(n))
    if _state.get("shim") is not None:
        _apply(_state["shim"])
