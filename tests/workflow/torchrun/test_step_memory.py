"""Memory during the training step: each rank's peak RSS over the steps of a
CPU FSDP2 run on 4 gloo ranks, measured inside the ranks by the harness (run.json's
``peak_rss_bytes_per_rank[*].steps``), is within 15 % of the plan's figure for that step
(wattflex.runs.plan.cpu_rank_bytes: the process, the shard, the units gathered at once with
FSDP2's all-gather buffers, the checkpointed activations and the loss's chunk). Every catalogue
family: test_step_memory_families.py.

Before the harness fixed glibc's mmap threshold (wattflex.runs.training.hostmem) the freed
tensors stayed in malloc's arenas and the steps' RSS per rank rose step after step past the plan
(benchmarks/results/step_memory.md: 1.1-1.5x it after 3 steps, with the same model and glibc's default)."""

import importlib.util
import json
import sys

import pytest

from .training_jobs import REPO

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
BAND = 0.15


def bench():
    if "step_memory_bench" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "step_memory_bench", REPO / "benchmarks" / "step_memory.py"
        )
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return sys.modules["step_memory_bench"]


@pytest.mark.parametrize("task", ["lora", "pt"])
def test_each_ranks_peak_rss_during_the_steps_is_within_the_plans_figure(task, tmp_path):
    b = bench()
    cfg = b.config(task, tmp_path)
    r = b.torchrun_harness(cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    facts = json.loads((tmp_path / ".training.json").read_text())["training"]
    assert (
        facts["parallel"] == "fsdp"
        and facts["world_size"] == b.RANKS
        and facts["malloc_mmap_threshold_fixed"]
    )
    assert facts["params_total"] > 150e6
    planned = b.planned(task, facts["params_total"])["total"]
    peaks = facts["peak_rss_bytes_per_rank"]
    assert [p["rank"] for p in peaks] == list(range(b.RANKS))
    for p in peaks:
        assert p["after_build"] < p["steps"] <= p["run"], p
        assert p["steps"] == pytest.approx(planned, rel=BAND), (task, p, planned)
