"""Shared test setup: a fresh artifact cache per test session, and misaligned arrays."""
import os
import re
import shutil
import sys
import tempfile

import numpy as np
import pytest

# Set before optgen builds anything, so every session compiles from scratch into its own cache.
os.environ.setdefault("OPTGEN_CACHE_DIR", tempfile.mkdtemp(prefix="optgen-test-cache-"))
# PoCL's kernel cache (default ~/.cache/pocl: a home that may be read-only or shared).
os.environ.setdefault("POCL_CACHE_DIR", os.path.join(os.environ["OPTGEN_CACHE_DIR"], "pocl"))
# Oclgrind (the OpenCL simulator) reports what it finds (out-of-bounds accesses, races) on
# stderr, where the ``oclgrind_clean`` fixture reads them: not in an OCLGRIND_LOG file,
# which it opens anew, truncated, for every OpenCL context (one per artifact variant),
# losing the reports of all but the last.
os.environ.pop("OCLGRIND_LOG", None)


def oclgrind_reports(text: str) -> list[str]:
    """Oclgrind's reports in captured stderr: a headline (an invalid access, a data race,
    an "Oclgrind - ..." error), then its tab-indented lines."""
    return [b.strip() for b in re.split(r"\n(?=\S)", text)
            if b.startswith(("Oclgrind", "Invalid", "Uninitialized")) or
            re.match(r"[\w-]+ data race", b)]


@pytest.fixture
def oclgrind_clean(capfd):
    """Fails the test when Oclgrind reported anything on stderr while it ran (the rest of
    its output is passed on)."""
    yield
    out, err = capfd.readouterr()
    sys.stdout.write(out)
    sys.stderr.write(err)
    found = oclgrind_reports(err)
    assert not found, "Oclgrind reported errors:\n" + "\n".join(found)[:4000]


def pytest_addoption(parser):
    parser.addoption("--exhaustive", action="store_true", default=False,
                     help="also run the cases the default run samples out of the large "
                          "cross-products (marked 'exhaustive'; tests/run_exhaustive.sh)")


def pytest_collection_modifyitems(config, items):
    """The default run leaves out the cases marked ``exhaustive``: the rest of a sampled
    cross-product (helpers.sampled), which ``--exhaustive`` (or OPTGEN_EXHAUSTIVE=1)
    runs too."""
    if config.getoption("--exhaustive") or os.environ.get("OPTGEN_EXHAUSTIVE") == "1":
        return
    keep, left = [], []
    for item in items:
        (left if item.get_closest_marker("exhaustive") else keep).append(item)
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = keep


def _skip_without_compiler(outcome) -> None:
    """On a machine given prebuilt artifacts and TVM without its compiler (a lent GPU
    machine: bench/gpu_run.sh), a test that would build is skipped, naming that cause;
    CI has the whole TVM and runs it."""
    e = outcome.excinfo[1] if outcome.excinfo else None
    from optgen import BuildError, VariantNotBuilt
    if isinstance(e, (BuildError, VariantNotBuilt)) and "compiler library is not in" in str(e):
        outcome.force_exception(pytest.skip.Exception(f"builds a kernel: {e}"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _skip_without_compiler((yield))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _skip_without_compiler((yield))


def pytest_sessionstart(session):
    """Every kernel the suite builds is linked into kernels.so by a C compiler (TVM's
    export_library); without one, stop at once with the cause instead of failing each test."""
    names = [os.environ.get("CXX"), os.environ.get("CC"), "g++", "gcc", "clang++", "clang",
             "c++", "cc"]
    if not any(n and shutil.which(n) for n in names):
        pytest.exit("no C/C++ compiler on PATH (g++, gcc, clang++, clang, c++ or cc, or $CXX/"
                    "$CC): TVM links every kernel library with one; install one (apt install "
                    "g++) and run the tests again", returncode=3)


def offset_array(values: np.ndarray, rng: np.random.Generator, unit: int = 16) -> np.ndarray:
    """A copy of ``values`` whose data starts at a random multiple of ``unit`` bytes past
    a 64-byte boundary (never on it).

    numpy guarantees only 16-byte alignment; kernels must not assume more. A slice of an
    array is aligned to its element size only (``unit=values.itemsize``).
    """
    values = np.ascontiguousarray(values)
    k = int(rng.integers(1, 64 // unit))  # a nonzero multiple of unit below 64
    raw = np.empty(values.nbytes + 128, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + unit * k
    out = raw[start:start + values.nbytes].view(values.dtype).reshape(values.shape)
    out[...] = values
    assert values.nbytes == 0 or out.ctypes.data % 64 == unit * k
    return out


@pytest.fixture
def one_torch_thread():
    """Small models: torch's intra-op threads only add synchronization (on a busy 2-core
    machine they made each step 20 times slower)."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
