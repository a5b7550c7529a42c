"""The Hugging Face Trainer driving optgen.torch.AdamW (examples/hf_trainer.py): a tiny
random BERT classifier on generated data learns (loss falls, held-out accuracy rises),
and a run resumed from the Trainer's own checkpoint (optimizer.pt written by
``optimizer.state_dict()``, read back by ``load_state_dict``) ends with the parameters of
the run that was not interrupted."""
import os

import pytest

torch = pytest.importorskip("torch", reason="the Trainer runs torch models")
pytest.importorskip("transformers", reason="transformers is in the test extra")
pytest.importorskip("accelerate", reason="the Trainer needs accelerate")

from helpers import load_example  # noqa: E402

STEPS = 120


@pytest.fixture(scope="module")
def example():
    return load_example("hf_trainer")


@pytest.fixture(scope="module")
def trained(example, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("hf"))
    net = example.model()
    before = example.accuracy(net)
    t = example.trainer(net, out, STEPS, save_steps=STEPS // 2)
    t.train()
    return out, net, before, t


def test_trainer_trains_with_optgen(example, trained):
    out, net, before, t = trained
    losses = example.losses(t)
    assert len(losses) >= 5
    assert losses[-1] < 0.5 * losses[0], losses
    assert example.accuracy(net) > max(before, 0.5) + 0.2
    assert type(t.optimizer.optimizer if hasattr(t.optimizer, "optimizer") else t.optimizer
                ).__module__ == "optgen.torch"
    assert float(t.optimizer.state_dict()["state"][0]["step"]) == STEPS


def test_trainer_checkpoint_resumes(example, trained):
    out, net, _, _ = trained
    half = os.path.join(out, f"checkpoint-{STEPS // 2}")
    saved = torch.load(os.path.join(half, "optimizer.pt"), weights_only=True)
    assert float(saved["state"][0]["step"]) == STEPS // 2 and "exp_avg" in saved["state"][0]
    again = example.model()
    example.trainer(again, out, STEPS, save_steps=STEPS // 2).train(resume_from_checkpoint=half)
    for (name, p), q in zip(net.state_dict().items(), again.state_dict().values()):
        assert torch.equal(p, q), f"{name} differs after resuming from {half}"
