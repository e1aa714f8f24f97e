"""Memory during the training step for every catalogue family, in one 2-rank gloo job on CPU
(benchmarks/step_memory.py ``measure_families``: the first catalogue model of each hf_model_type
with each task the campaign's groups run it with, at 1/8 of its widths and vocabulary and 4
layers, random init, fp32, FSDP2, checkpointed as the harness runs; one case after another in
each rank, two steps of the harness's loss and AdamW each). Each rank's peak RSS over the steps,
less its RSS after the build, is held against the plan's increment for that step
(``wattflex.runs.plan.cpu_rank_bytes`` less the process and the fp32 weights the build holds).

The increment, not the whole RSS: the whole holds the process (0.47 GB per rank before the build,
``plan.CPU_PROCESS_GB`` 0.5), which the plan does not model per family; the increment is what the
plan's terms predict (the states the step allocates, the gathered units, activations, the loss
chunk, AdamW's temporary).

The band: never more than 15 % over the plan, and within 15 % under it for the job's first case.
A later case may be up to 30 % under: a process keeps memory it allocates at its first steps
(not Python-visible tensors, not malloc's free space: it stays after ``malloc_trim``), which the
next cases reuse. Measured with the same Llama LoRA case twice in one job
(``benchmarks/step_memory.py --families --cases Llama-3.1-70B:lora Llama-3.1-70B:lora``,
benchmarks/results/step_memory.md): its increment falls by about 14 % of the plan the second
time. A harness run is one case in its own process, as the first case here. Two ranks, not the
benchmark's four: half the CPU (120 s wall, 211 s CPU on the idle 2-core machine against 216 s
and 400 s), with ratios within 0.04 of the 4-rank job's but DeepSeek-V2 pretraining's (0.97
against 1.06; benchmarks/results/step_memory.md).
The job's time: benchmarks/results/step_memory.md."""

import pytest

from .test_step_memory import bench

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
BAND = 0.15
REUSED_FIRST_STEPS = 0.15  # a later case's increment may be lower by this share of the plan
STEPS = 2  # the second step's forward runs beside the AdamW states the first one made
RANKS = 2


@pytest.fixture(scope="module")
def family_steps(tmp_path_factory) -> list[dict]:
    return bench().measure_families(
        tmp_path_factory.mktemp("step_memory_families"), STEPS, ranks=RANKS
    )


def ratios(case: dict) -> list[float]:
    """Each rank's measured increment over the plan's."""
    return [(r["steps"] - r["after_build"]) / case["plan"]["step"] for r in case["ranks"]]


@pytest.mark.parametrize("model,task", bench().family_cases(), ids="-".join)
def test_each_ranks_step_increment_is_within_the_band_of_the_plans(model, task, family_steps):
    (case,) = [c for c in family_steps if (c["model"], c["task"]) == (model, task)]
    assert case["fixed"]  # glibc's mmap threshold fixed, as the harness runs it
    assert all(r["parallel"] == "fsdp" for r in case["ranks"])
    first = case is family_steps[0]
    low = 1 - BAND - (0 if first else REUSED_FIRST_STEPS)
    assert all(low <= x <= 1 + BAND for x in ratios(case)), (model, task, first, case["plan"])


def test_the_jobs_first_case_is_within_15_percent_of_the_plan(family_steps):
    """As a harness run: the case alone in its process."""
    assert all(x == pytest.approx(1, abs=BAND) for x in ratios(family_steps[0]))
