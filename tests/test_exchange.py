"""runtime/exchange.py without processes: the whole-matrix stretch of matrix kernels,
the rows each rank holds, and the owners balanced by flops (the runs under gloo are in
tests/test_distributed.py)."""
import pytest

from optgen.runtime import exchange, get_artifact, owned

torch = pytest.importorskip("torch", reason="torch is not installed")


def _matrix_kernels(name: str) -> list:
    return [k for k in get_artifact(name, "llvm").kernels if k.matrix]


@pytest.mark.parametrize("name", ["muon", "torch_muon"])
def test_muon_moves_one_matrix_each_way(name):
    """Newton-Schulz (its loop, the R x R or C x C temporaries) is the stretch; the
    momentum update and ||u|| before it and the weight update after it stay on the
    shards: only the normalized u goes to the owner and only X comes back."""
    for k in _matrix_kernels(name):
        reg = exchange.region(k.launches, k.buffer_axes, tuple(k.workspaces))
        kinds = [ln["kind"] for ln in k.launches]
        assert kinds[reg.start] == "repeat" and "matmul" not in kinds[:reg.start]
        assert "matmul" not in kinds[reg.stop:], k.symbol
        assert reg.inputs == reg.outputs == ("_loop0",), (k.symbol, reg)


def test_whole_matrix_states_are_refused_by_name():
    """THOR's G^-1 (R x R) is read in the stretch: a state row shards cannot hold."""
    for k in _matrix_kernels("thor"):
        with pytest.raises(exchange.Unsupported, match="G_inv of shape RR"):
            exchange.region(k.launches, k.buffer_axes, tuple(k.workspaces))


def test_elementwise_kernels_have_no_stretch():
    k = get_artifact("adam", "llvm").kernels[0]
    assert exchange.region(k.launches, k.buffer_axes, tuple(k.workspaces)) is None


@pytest.mark.parametrize("n", [0, 1, 3, 7, 32, 1001])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_rows_are_torch_chunks(n, world):
    """A rank's rows are DTensor's Shard(0) split (torch.chunk; trailing ranks may hold
    none)."""
    chunks = list(torch.arange(n).chunk(world)) if n else []
    for r in range(world):
        a, b = exchange.rows_of(n, world, r)
        want = chunks[r].tolist() if r < len(chunks) else []
        assert list(range(a, b)) == want, (n, world, r)


def _matrix(r: int, c: int) -> exchange.Matrix:
    return exchange.Matrix((r, c), {}, exchange.Region(0, 0, (), ()), None, None)


def test_owners_balance_flops_alike_everywhere():
    """Largest first to the least loaded rank: two big matrices go to two ranks, the
    small ones fill the rank with less; a tie goes to the lowest rank."""
    ms = [_matrix(3, 32), _matrix(768, 768), _matrix(768, 768), _matrix(32, 16)]
    assert exchange.owners(ms, 2) == [1, 0, 1, 0]
    assert exchange.owners(ms, 4) == [3, 0, 1, 2]
    assert exchange.owners(ms, 1) == [0, 0, 0, 0]


@pytest.mark.parametrize("name", ["shampoo", "soap"])
def test_owner_held_states_leave_the_gradient_and_weight_to_move(name):
    """Shampoo's and SOAP's states live with the matrix's owner (runtime/owned.py): the
    R x R / C x C ones and m, v. Then the stretch takes the gradient (SOAP: the clipped
    gradient) and the weight, and gives back the weight; every launch that reads a held
    state is in it. Without the held states it is refused by name."""
    art = get_artifact(name, "llvm")
    held = owned.held(art)
    assert held == {"m", "v", *(s.name for s in art.states if s.shape in ("rr", "cc"))}
    for k in _matrix_kernels(name):
        reg = exchange.region(k.launches, k.buffer_axes, tuple(k.workspaces), held=held)
        # (a split master's kernels move the weight's correction with it)
        moved = ("w", "w_low") if "w_low" in k.buffer_axes else ("w",)
        assert reg.outputs == moved and len(reg.inputs) == len(moved) + 1 \
            and set(moved) <= set(reg.inputs), reg
        outside = k.launches[:reg.start] + k.launches[reg.stop:]
        assert not any(b in held for ln in outside for b in ln["buffers"]), k.symbol
        with pytest.raises(exchange.Unsupported, match="a whole-matrix state"):
            exchange.region(k.launches, k.buffer_axes, tuple(k.workspaces))


def test_rules_whose_refresh_reads_what_the_owner_lacks_are_refused():
    """THOR refreshes from the trainer's A and G (per rank, not summed): refused under
    every flag; Shampoo's fresh_roots reads the step's gradient: refused for those
    kernels only; Muon holds nothing."""
    thor = get_artifact("thor", "llvm")
    assert "statistics the trainer passes (A, G)" in owned.refused(thor)
    shampoo = get_artifact("shampoo", "llvm")
    assert owned.refused(shampoo) is None
    for k in shampoo.kernels:
        fresh = k.refresh is not None and bool(k.refresh.get("grad"))
        assert (owned.kernel_refused(k, shampoo) is not None) == fresh, k.symbol
    assert owned.held(get_artifact("muon", "llvm")) == frozenset()


def test_fixed_owners_stay_and_count_in_the_balance():
    """A matrix whose states live on a rank keeps that owner; the others balance
    around the load it brings."""
    big = _matrix(768, 768)
    big.owner = 1
    assert exchange.owners([big, _matrix(768, 768), _matrix(32, 16)], 2) == [1, 0, 0]
