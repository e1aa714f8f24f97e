"""The training loop decides once whether the chunked loss applies (``chunked_applies`` walks
every parameter for the expert-parallel check) and passes the answer to every step's and
eval batch's ``causal_lm_loss``: a real tiny model trained for a few steps on CPU."""

import pytest
import torch

from tests.unit.runs.training.test_training_loss import tiny_cfg
from wattflex.runs.training import loss, models, trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/runs/conftest.py


def test_given_decision_is_not_recomputed(tmp_path, monkeypatch):
    model = models.build_model(tiny_cfg("Qwen3-32B", tmp_path), torch.float32, ep=1)
    x = torch.randint(0, model.config.vocab_size, (1, 16))
    want_chunked, want_hf = loss.causal_lm_loss(model, x, 8), model(input_ids=x, labels=x).loss
    monkeypatch.setattr(loss, "chunked_applies", lambda *a: pytest.fail("decided again"))
    torch.testing.assert_close(loss.causal_lm_loss(model, x, 8, True), want_chunked)
    torch.testing.assert_close(loss.causal_lm_loss(model, x, 8, False), want_hf)


def test_loop_decides_once_for_all_steps_and_eval_batches(tmp_path, monkeypatch):
    calls = []
    real = loss.chunked_applies

    def counted(*a):
        calls.append(1)
        return real(*a)

    monkeypatch.setattr(loss, "chunked_applies", counted)
    monkeypatch.setattr(trainer, "chunked_applies", counted)
    cfg = tiny_cfg(
        "Qwen3-32B", tmp_path, max_steps=4, eval_at_s=0.0, eval_batches=2, loss_chunk_tokens=16
    )
    steps = trainer.train(cfg)
    assert len(steps) == 4 and len(calls) == 1
