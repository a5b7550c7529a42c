"""Matrix rules build every library a run needs when the optimizer is made
(runtime/prebuild.py): SOAP, SOAP-NAdam and Shampoo, stepped past refreshes of their
bases and roots with clip_global_norm on, neither build nor load a library after
construction; a flag changed by set_hyper still builds its variant on first use."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch drop-ins need torch")
import optgen                                   # noqa: E402
import optgen.torch as otorch                   # noqa: E402
from optgen.compiler import pipeline            # noqa: E402
from optgen.runtime.artifact import Artifact    # noqa: E402

CASES = {"soap": (lambda ps: otorch.SOAP(ps, lr=1e-2, precondition_frequency=2,
                                         clip_global_norm=1.0)),
         "shampoo": (lambda ps: otorch.seeds.Shampoo(ps, lr=1e-2, precondition_frequency=2,
                                                     epsilon=1e-3, clip_global_norm=1.0)),
         "soap_nadam": (lambda ps: otorch.SOAPNAdam(ps, lr=1e-2, precondition_frequency=2,
                                                    clip_global_norm=1.0))}


class _Watch:
    """Counts libraries loaded (Artifact.variant) and builds (pipeline.build) from now."""

    def __init__(self, monkeypatch):
        self.loads, self.builds = [], []
        variant, build = Artifact.variant, pipeline.build

        def watched_variant(art, name):
            if name not in art._built:
                self.loads.append((art.name, name))
            return variant(art, name)

        def watched_build(*a, **k):
            self.builds.append((a, k))
            return build(*a, **k)
        monkeypatch.setattr(Artifact, "variant", watched_variant)
        monkeypatch.setattr(pipeline, "build", watched_build)


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_library_is_built_or_loaded_after_construction(name, monkeypatch):
    torch.manual_seed(0)
    w, b = torch.nn.Parameter(torch.randn(6, 5)), torch.nn.Parameter(torch.randn(5))
    opt = CASES[name]([w, b])
    watch = _Watch(monkeypatch)
    for step in range(5):          # refreshes at steps 1/2, 3, 5 (Shampoo/SOAP)
        w.grad, b.grad = torch.randn(6, 5), torch.randn(5)
        opt.step()
    assert watch.loads == [] and watch.builds == []
    assert torch.isfinite(w).all() and opt.state[w]["L"].abs().sum() > 0


def test_a_flag_set_later_builds_its_variant_then(monkeypatch):
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    opt = optgen.create("soap", [w], precondition_frequency=2)
    watch = _Watch(monkeypatch)
    opt.step([np.ones((4, 3), np.float32)])
    assert watch.loads == []
    opt.set_hyper(normalize_grads=True, correct_bias=False)   # (test_matrix_soap's)
    opt.step([np.ones((4, 3), np.float32)])
    assert [v for _, v in watch.loads] == ["f32-normalize_grads"]
