"""Memory during the training step, one conformance check: each rank's peak RSS over the steps of
one CPU FSDP2 LoRA run on 2 gloo ranks, measured inside the ranks by the harness (run.json's
``peak_rss_bytes_per_rank[*].steps``), is within 15 % of the plan's figure for that step
(wattflex.runs.plan.cpu_rank_bytes: the process, the shard, the units gathered at once with
FSDP2's all-gather buffers, the checkpointed activations and the loss's chunk).

The measurement itself (both tasks on 4 ranks, glibc's malloc fixed and dynamic, every catalogue
family) is a benchmark: ``python benchmarks/step_memory.py [--families]``, its tables in
benchmarks/results/step_memory.md. This test checks that the harness reports the figures and
that the plan still holds for one case; it imports nothing from benchmarks/.

Before the harness fixed glibc's mmap threshold (wattflex.runs.training.hostmem) the freed
tensors stayed in malloc's arenas and the steps' RSS per rank rose step after step past the plan
(benchmarks/results/step_memory.md: 1.1-1.5x it after 3 steps, with the same model and glibc's default)."""

import json

import pytest

from tests.tiny_training import STEP_MODEL, step_cfg
from wattflex.runs import plan

from .training_jobs import train_torchrun

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
BAND = 0.15
RANKS = 2  # the benchmark's 4 measure the same claim at twice the CPU


def test_each_ranks_peak_rss_during_the_steps_is_within_the_plans_figure(tmp_path):
    cfg = step_cfg("lora", tmp_path, steps=2)
    r = train_torchrun(cfg, nproc=RANKS)
    assert r.returncode == 0, r.stderr[-3000:]
    facts = json.loads((tmp_path / ".training.json").read_text())["training"]
    assert (
        facts["parallel"] == "fsdp"
        and facts["world_size"] == RANKS
        and facts["malloc_mmap_threshold_fixed"]
    )
    assert facts["params_total"] > 150e6
    planned = plan.cpu_rank_bytes(
        {**STEP_MODEL, "total_params_b": facts["params_total"] / 1e9},
        cfg.task,
        RANKS,
        cfg.seq_len,
        cfg.batch,
        cfg.lora_rank,
        cfg.grad_checkpointing,
    )["total"]
    peaks = facts["peak_rss_bytes_per_rank"]
    assert [p["rank"] for p in peaks] == list(range(RANKS))
    for p in peaks:
        assert p["after_build"] < p["steps"] <= p["run"], p
        assert p["steps"] == pytest.approx(planned, rel=BAND), (p, planned)
