"""The chunked causal-LM loss (wattflex.runs.training.loss) equals transformers' own loss and
gives the same gradients: real tiny models (dense, MoE, LoRA) in one process. FSDP2 over 2 real
gloo ranks (torchrun): tests/workflow/torchrun/test_training_loss.py."""

from pathlib import Path

import pytest
import torch

from tests.tiny_training import CATALOG, tiny_cfg
from wattflex.runs.campaign_checks import check_inputs
from wattflex.runs.training import models
from wattflex.runs.training.loss import causal_lm_loss, chunked_applies, chunked_causal_lm_loss
from wattflex.runs.training.train_config import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/runs/conftest.py
REPO = Path(__file__).resolve().parents[4]


def loss_and_grads(model, x, loss_fn):
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model, x)
    loss.backward()
    return loss.detach(), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize(
    "model_name,task", [("Qwen3-32B", "pt"), ("Qwen3-30B-A3B", "pt"), ("Llama-3.1-70B", "lora")]
)
def test_chunked_loss_and_gradients_equal_transformers(model_name, task, tmp_path):
    cfg = tiny_cfg(model_name, tmp_path, task=task)
    torch.manual_seed(0)
    model = models.build_model(cfg, torch.float32, ep=1)
    if task == "lora":
        model = models.apply_lora(model, cfg)
    x = torch.randint(0, model.config.vocab_size, (cfg.batch, cfg.seq_len))
    assert chunked_applies(model, 7) is None
    want, want_g = loss_and_grads(model, x, lambda m, ids: m(input_ids=ids, labels=ids).loss)
    # 7 tokens a chunk: 64 tokens in 10 chunks, the last one short; one chunk of everything
    for chunk in (7, 64, 10_000):
        got, got_g = loss_and_grads(model, x, lambda m, ids: chunked_causal_lm_loss(m, ids, chunk))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert got_g.keys() == want_g.keys() and want_g
        for n in want_g:
            torch.testing.assert_close(
                got_g[n], want_g[n], rtol=1e-5, atol=1e-6, msg=lambda m: f"{n}: {m}"
            )


def test_chunked_loss_soft_caps_the_logits_as_gemma_does(tmp_path):
    """Gemma-4's forward soft-caps its logits (tanh, final_logit_softcapping 30 in the published
    config); the chunked loss projected without the cap and trained on other logits. A cap near
    the tiny model's logit scale makes the difference plain."""
    facts = {**CATALOG["Gemma-4-26B-A4B"], "final_logit_softcapping": 0.05}
    torch.manual_seed(0)
    model = models.build_model(
        tiny_cfg("Gemma-4-26B-A4B", tmp_path, model_facts=facts), torch.float32
    )
    assert (
        type(model).__name__ == "Gemma4ForCausalLM" and model.config.final_logit_softcapping == 0.05
    )
    x = torch.randint(0, model.config.vocab_size, (2, 32))
    want, want_g = loss_and_grads(model, x, lambda m, ids: m(input_ids=ids, labels=ids).loss)
    got, got_g = loss_and_grads(model, x, lambda m, ids: chunked_causal_lm_loss(m, ids, 7))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for n in want_g:
        torch.testing.assert_close(
            got_g[n], want_g[n], rtol=1e-5, atol=1e-6, msg=lambda m: f"{n}: {m}"
        )


def test_lm_head_sees_one_chunk_at_a_time_in_forward_and_in_backward(tmp_path, monkeypatch):
    cfg = tiny_cfg("Qwen3-32B", tmp_path)
    model = models.build_model(cfg, torch.float32, ep=1)
    head, calls, rows = model.get_output_embeddings(), [], []
    head.register_forward_hook(lambda _m, args, _o: calls.append(args[0].shape[:-1].numel()))
    linear = torch.nn.functional.linear

    def projection(x, weight, bias=None):  # lm_head's matmul, whichever call runs it
        if weight is head.weight:
            rows.append(x.numel() // x.shape[-1])
        return linear(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", projection)
    x = torch.randint(0, model.config.vocab_size, (2, 32))
    loss = chunked_causal_lm_loss(model, x, 24)
    forward = list(rows)
    loss.backward()
    # the model's forward projects no position; 64 tokens: chunks of 24, 24, 16, recomputed in backward
    assert forward == [0, 24, 24, 16] and sorted(rows[len(forward) :]) == [16, 24, 24]
    # the chunks inside one call of lm_head (its hooks, FSDP2's gather, once), after the model's own
    assert calls == [0, 64]


def test_unchunked_where_chunking_cannot_apply(tmp_path):
    cfg = tiny_cfg("Qwen3-32B", tmp_path)
    model = models.build_model(cfg, torch.float32, ep=1)
    assert "0" in chunked_applies(model, 0)
    model.config.output_router_logits = True
    assert "router" in chunked_applies(model, 8)
    x = torch.randint(0, model.config.vocab_size, (1, 8))
    torch.testing.assert_close(causal_lm_loss(model, x, 0), model(input_ids=x, labels=x).loss)
    with pytest.raises(ValueError, match="cuda.loss_chunk_tokens"):
        tiny_cfg("Qwen3-32B", tmp_path, loss_chunk_tokens=-1).validate()


def test_the_config_takes_loss_chunk_tokens_and_refuses_a_negative_one(tmp_path):
    import copy

    from wattflex.config import load_config, prepare
    from wattflex.errors import ConfigError

    cfg = load_config(REPO / "config" / "config.yaml")
    raw = copy.deepcopy({k: v for k, v in cfg.items() if k != "_catalog"})
    raw["cuda"] = {**(raw.get("cuda") or {}), "loss_chunk_tokens": 4096}
    check_inputs(prepare(copy.deepcopy(raw)), cwd=tmp_path)
    assert TrainConfig.from_spec({"cuda": raw["cuda"]}, tmp_path).loss_chunk_tokens == 4096
    raw["cuda"]["loss_chunk_tokens"] = -1
    with pytest.raises(ConfigError, match="cuda.loss_chunk_tokens"):
        check_inputs(prepare(raw), cwd=tmp_path)
