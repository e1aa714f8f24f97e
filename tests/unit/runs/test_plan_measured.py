"""The plan's checkpoint bytes per parameter against checkpoints the harness really writes
(tiny random-init models on CPU, real torch DCP): the bytes a run's checkpoint event records
(training.checkpoint) grow with the parameters exactly as wattflex.runs.plan says."""

import pytest

from tests.tiny_training import tiny_cfg
from wattflex.provenance import read_json
from wattflex.runs import plan
from wattflex.runs.training.trainer import train

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
# DCP's .metadata file and per-file headers: a fixed cost, not per parameter (~170-280 KB here)
OVERHEAD_MAX = 400_000


def checkpoint_of(model, task, precision, tmp_path):
    (tmp_path / f"{task}-{precision}").mkdir()
    cfg = tiny_cfg(
        model,
        tmp_path / f"{task}-{precision}",
        task=task,
        batch=4,
        duration_s=60,
        checkpoint_at_s=0.0,
        precision=precision,
    )
    train(cfg)
    facts = read_json(tmp_path / f"{task}-{precision}" / ".training.json")["training"]
    [event] = [e for e in facts["events"] if e["event"] == "checkpoint"]
    adapters = facts["params_trainable"] if task == "lora" else 0
    return event["bytes"], plan.checkpoint_bytes(
        facts["params_total"] - adapters, adapters, task, precision
    )


@pytest.mark.parametrize(
    "model,task", [("Llama-3.1-70B", "pt"), ("Qwen3-30B-A3B", "pt"), ("Qwen3-32B", "lora")]
)
def test_checkpoint_bytes_per_parameter_are_measured(model, task, tmp_path):
    fp32, plan_fp32 = checkpoint_of(model, task, "fp32", tmp_path)
    bf16, plan_bf16 = checkpoint_of(model, task, "bf16", tmp_path)
    # fp32 -> bf16 halves the weights (and, for pretraining, the AdamW states): 6 of 12 B/param
    # for pt, 2 of the base's 4 B/param for LoRA (its fp32 adapters and states stay)
    assert fp32 - bf16 == pytest.approx(plan_fp32 - plan_bf16, rel=1e-3)
    for measured, planned in ((fp32, plan_fp32), (bf16, plan_bf16)):
        assert 0 <= measured - planned < OVERHEAD_MAX
