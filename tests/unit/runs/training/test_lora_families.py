"""LoRA targets from the model's own layers (``models.lora_targets``), on tiny
``save_pretrained`` checkpoints of the families users bring with ``cuda.model_path``
(tests/family_checkpoints.py ``BROUGHT``: Phi-3's fused qkv_proj/gate_up_proj, DeepSeek-V3's
MLA projections, Qwen2.5, OLMo-2), loaded as the harness loads them; a family without
attention projections as nn.Linear (GPT-2's Conv1D) is refused; run.json records the targets
and the trainable-parameter count."""

import pytest
import torch

from tests.family_checkpoints import (
    BROUGHT,
    NO_ATTENTION_LINEAR,
    expected_adapters,
    save_brought,
)
from tests.tiny_training import tiny_cfg
from wattflex.provenance import read_json
from wattflex.runs.training import models
from wattflex.runs.training.trainer import train

RANK = 8


def brought_cfg(family, tmp_path, **kw):
    save_brought(family, tmp_path / "model")
    (tmp_path / "out").mkdir(exist_ok=True)
    return tiny_cfg(
        family.name,
        tmp_path / "out",
        model_facts={"hf_model_type": family.model_type},
        task="lora",
        tiny=False,
        model_path=str(tmp_path / "model"),
        lora_rank=RANK,
        **kw,
    )


@pytest.mark.parametrize("family", BROUGHT, ids=lambda f: f.name)
def test_lora_adapts_the_families_own_projections(family, tmp_path):
    cfg = brought_cfg(family, tmp_path)
    model = models.build_model(cfg, torch.float32)
    modules, params = models.lora_targets(model, family.model_type)
    assert sorted(modules) == sorted(family.targets)
    assert params == list(family.expert_parameters)
    linear = expected_adapters(model, family, RANK)
    peft_model = models.apply_lora(model, cfg)
    adapters = {n: p.numel() for n, p in peft_model.named_parameters() if p.requires_grad}
    assert all("lora_" in n for n in adapters)
    on_linears = sum(v for n, v in adapters.items() if ".experts." not in n)
    assert on_linears == linear
    assert any(".experts." in n for n in adapters) == bool(family.expert_parameters)


def test_a_family_without_attention_projections_is_refused(tmp_path):
    cfg = brought_cfg(NO_ATTENTION_LINEAR, tmp_path)
    model = models.build_model(cfg, torch.float32)
    with pytest.raises(
        ValueError, match=r"LoRA on gpt2 \(GPT2LMHeadModel\): no attention projection"
    ):
        models.apply_lora(model, cfg)


def test_run_json_records_the_adapters_and_their_count(tmp_path):
    phi3 = BROUGHT[0]
    train(brought_cfg(phi3, tmp_path, max_steps=1))
    facts = read_json(tmp_path / "out" / ".training.json")["training"]
    assert facts["lora"] == {
        "target_modules": sorted(phi3.targets),
        "target_parameters": [],
        "rank": RANK,
    }
    base = models.load_pretrained(brought_cfg(phi3, tmp_path), torch.float32)
    assert facts["params_trainable"] == expected_adapters(base, phi3, RANK)
