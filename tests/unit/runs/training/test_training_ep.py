"""Expert parallelism (ep > 1) in the training harness, through transformers' DistributedConfig.

Real torch and transformers: the layout decisions, and tiny random-init MoE models (hidden 64,
2 layers, 4 experts, 2 active) in one process. Trained by real 2- and 4-process torchrun jobs
on CPU: tests/workflow/torchrun/test_training_ep.py.
"""

import json
from pathlib import Path

import pytest

from tests import tiny_training
from tests.tiny_training import CATALOG
from wattflex.runs.training import models
from wattflex.runs.training import parallel as par
from wattflex.runs.training.train_config import TrainConfig
from wattflex.runs.training.trainer import train

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/unit/runs/conftest.py
REPO = Path(__file__).resolve().parents[4]
QWEN_MOE, GPT_OSS, LLAMA = "Qwen3-30B-A3B", "gpt-oss-20b", "Llama-3.1-70B"


def tiny_cfg(model: str, outdir, **kw) -> TrainConfig:
    return tiny_training.tiny_cfg(model, outdir, **{"max_steps": 6, "lr": 3e-3, **kw})


# ---- layout decisions (no processes) ------------------------------------------------------------
def test_ep_falls_back_to_1_with_a_reason_where_there_is_nothing_to_spread(tmp_path):
    assert par.expert_layout(tiny_cfg(QWEN_MOE, tmp_path), 8, 128) == par.ExpertLayout(1)
    dense = par.expert_layout(tiny_cfg(LLAMA, tmp_path, ep=8), 8, None)
    assert dense.ep == 1 and "dense" in dense.note
    single = par.expert_layout(tiny_cfg(QWEN_MOE, tmp_path, ep=8), 1, 128)
    assert single.ep == 1 and "one process" in single.note
    assert par.expert_layout(tiny_cfg(QWEN_MOE, tmp_path, ep=4), 8, 128) == par.ExpertLayout(4)


@pytest.mark.parametrize(
    "ep, world, experts, match",
    [
        (3, 8, 128, "does not divide the 8 training processes"),
        (4, 2, 128, "does not divide the 2 training processes"),  # more ep ranks than processes
        (4, 8, 6, "does not divide the 6 experts"),
    ],
)
def test_impossible_ep_layouts_fail_clearly(ep, world, experts, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        par.expert_layout(tiny_cfg(QWEN_MOE, tmp_path, ep=ep), world, experts)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"task": "lora"}, "expert parallelism is for pretraining"),
        ({"parallel": "ddp"}, "cuda.parallel 'ddp'"),
        ({"ep": 0}, "must be >= 1"),
    ],
)
def test_config_rejects_ep_combinations_that_cannot_run(change, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        tiny_cfg(QWEN_MOE, tmp_path, **{"ep": 2, **change}).validate()


def test_distributed_config_is_fsdp_over_all_ranks_with_ep_expert_groups(tmp_path):
    dc = par.distributed_config(tiny_cfg(GPT_OSS, tmp_path, ep=4, device="cuda"), 8, 4)
    assert (dc.fsdp_size, dc.ep_size, dc.tp_size, dc.efsdp_size) == (8, 4, 1, 2)
    assert dc.fsdp_mixed_precision  # bf16-mixed on cuda
    assert not par.distributed_config(tiny_cfg(GPT_OSS, tmp_path, ep=2), 2, 2).fsdp_mixed_precision


def test_every_moe_family_declares_an_ep_plan():
    for mt in ("qwen3_moe", "mixtral", "gpt_oss", "deepseek_v2"):
        plan = models.hf_config({"hf_model_type": mt}, tiny=True).base_model_ep_plan
        assert plan["layers.*.mlp.experts"] == "ep_dispatch_experts", mt


def test_tiny_expert_count_is_a_multiple_of_ep():
    facts = CATALOG[GPT_OSS]
    assert models.routing(models.hf_config(facts, tiny=True))[0] == 4
    assert models.routing(models.hf_config(facts, tiny=True, ep=8))[0] == 8
    assert models.routing(models.hf_config(facts, tiny=True, ep=3))[0] == 6


def test_single_process_run_records_ep_not_in_effect(tmp_path):
    train(tiny_cfg(QWEN_MOE, tmp_path, ep=2, max_steps=2))
    facts = json.loads((tmp_path / ".training.json").read_text())["training"]
    assert (facts["ep_requested"], facts["ep_used"]) == (2, 1) and "one process" in facts["ep_note"]


def test_ep_1_run_records_no_expert_parallelism(tmp_path):
    train(tiny_cfg(QWEN_MOE, tmp_path, max_steps=2))
    facts = json.loads((tmp_path / ".training.json").read_text())["training"]
    assert (facts["ep_requested"], facts["ep_used"]) == (1, 1) and "ep_note" not in facts
