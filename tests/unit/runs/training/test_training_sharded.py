"""The training harness and checkpoints: gpt-oss MXFP4 ones dequantised explicitly, a multimodal
Gemma-4 one loaded as its text decoder, one lacking weights refused. (Sharded
construction, in real 2-process torchrun jobs: tests/workflow/torchrun/test_training_sharded.py.)
"""

from pathlib import Path

import pytest

from tests.tiny_training import CATALOG
from wattflex.runs.training import models

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/runs/conftest.py
REPO = Path(__file__).resolve().parents[4]


# ---- gpt-oss checkpoints (no processes) ---------------------------------------------------------
def test_mxfp4_checkpoints_are_dequantised_explicitly():
    from transformers import Mxfp4Config

    cfg = models.hf_config(CATALOG["gpt-oss-20b"], tiny=True)
    assert models.quantization_kwargs(cfg) == {}  # a bf16 checkpoint: nothing passed
    cfg.quantization_config = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn"],
    }
    kw = models.quantization_kwargs(cfg)
    assert (
        isinstance(kw["quantization_config"], Mxfp4Config) and kw["quantization_config"].dequantize
    )
    cfg.quantization_config = {"quant_method": "fp8"}  # other schemes: transformers' own handling
    assert models.quantization_kwargs(cfg) == {}


# ---- checkpoints as published (no processes; through the harness's sharded path:
# tests/workflow/torchrun/test_family_checkpoints.py) ---------------------------------------------
def checkpoint_cfg(path, model="Gemma-4-26B-A4B"):
    from wattflex.runs.training.train_config import TrainConfig

    return TrainConfig(model_facts=CATALOG[model], task="pt", device="cpu", model_path=str(path))


def test_multimodal_gemma4_checkpoint_loads_its_text_decoder_only(tmp_path):
    """A Gemma4ForConditionalGeneration checkpoint (google/gemma-4-26B-A4B's class and layout):
    the harness built the whole multimodal class from it (vision and audio towers included); now
    the text decoder, Gemma4ForCausalLM, with the language model's weights and the same logits."""
    import torch
    from transformers import Gemma4ForConditionalGeneration

    from tests.family_checkpoints import save_multimodal_gemma4

    save_multimodal_gemma4(tmp_path / "model")
    cfg = checkpoint_cfg(tmp_path / "model")
    assert models.model_config(cfg).model_type == "gemma4_text"
    model = models.load_pretrained(cfg, torch.float32)
    assert type(model).__name__ == "Gemma4ForCausalLM"
    whole = Gemma4ForConditionalGeneration.from_pretrained(tmp_path / "model", dtype=torch.float32)
    theirs = {n: p for n, p in whole.named_parameters() if n.startswith("model.language_model.")}
    ours = dict(model.named_parameters())
    assert sorted(ours) == sorted(n.replace("model.language_model.", "model.", 1) for n in theirs)
    assert all(
        torch.equal(ours[n.replace("model.language_model.", "model.", 1)], p)
        for n, p in theirs.items()
    )
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # still tied
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, whole(input_ids=x).logits)


def test_a_checkpoint_without_some_weights_is_refused(tmp_path):
    """transformers fills weights a checkpoint lacks with random values and logs it: the harness
    would train (and measure) another model. Now the load fails, naming them."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(
        models.hf_config(CATALOG["Qwen3-32B"], tiny=True)
    ).save_pretrained(tmp_path)
    models.load_pretrained(checkpoint_cfg(tmp_path, "Qwen3-32B"), torch.float32)  # whole: loads
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        ValueError, match=r"checkpoint has no .*model\.layers\.1\.mlp\.down_proj\.weight"
    ):
        models.load_pretrained(checkpoint_cfg(tmp_path, "Qwen3-32B"), torch.float32)


def test_an_mxfp4_gpt_oss_checkpoint_loads_dequantised_with_every_weight(tmp_path):
    """openai/gpt-oss-20b's format: the routed experts as MXFP4 ``*_blocks`` (uint8, two FP4 values a
    byte, 32 a block) and ``*_scales`` (uint8 exponents, bias 127) with quantization_config mxfp4:
    loaded for training as float experts (transformers' dequantisation), and no weight reported
    missing (the refusal of checkpoints lacking weights must not refuse this one)."""
    import json

    import torch
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from tests.family_checkpoints import FAMILIES, save_checkpoint

    family = next(f for f in FAMILIES if f.hf_model_type == "gpt_oss")
    save_checkpoint(family, tmp_path)
    weights, packed = load_file(tmp_path / "model.safetensors"), {}
    g = torch.Generator().manual_seed(0)
    for k in [k for k in weights if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, d_in, d_out = weights.pop(
            k
        ).shape  # [E, in, out] in the model, [E, out, ...] packed
        packed[k] = (
            torch.randint(0, 256, (experts, d_out, d_in // 32, 16), dtype=torch.uint8, generator=g),
            torch.randint(124, 130, (experts, d_out, d_in // 32), dtype=torch.uint8, generator=g),
        )
        weights[k + "_blocks"], weights[k + "_scales"] = packed[k]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = models.load_pretrained(checkpoint_cfg(tmp_path, "gpt-oss-20b"), torch.float32)
    params = dict(model.named_parameters())
    for k, (blocks, scales) in packed.items():
        assert params[k].dtype == torch.float32 and params[k].requires_grad
        # transformers' own unpacking ([E, out, in/32, 16] bytes -> [E, in, out] values)
        assert torch.equal(
            params[k].detach(), convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        ), k
