"""The emulated run's timeline before steady training (weights loading, start-up, the first slow
steps), and the shortest run that reaches a steady state: a campaign whose ``run.duration_s``
is shorter is refused when the workflow starts, not after every run has run and none could be
summarised. Light: numpy and the emulator's physics, no pandas or pyarrow (the Snakefile reads
it at every start)."""

from __future__ import annotations

import math
from typing import Any

from wattflex.config import MIN_SAMPLES_PER_RUN, groups
from wattflex.errors import ConfigError
from wattflex.gpus import GPUS, GPUS_PER_NODE, GPUSpec
from wattflex.runs.emulator.clock_knob import job_at_clock
from wattflex.runs.emulator.step import JobSpec, gpu_leakages, job_at_caps
from wattflex.schema import group_default

# Assumed: how much slower than steady the first step is (the allocator and caches warm up),
# decaying with a 15 s time constant.
FIRST_STEPS_EXTRA = 0.5
FIRST_STEPS_TAU_S = 15.0
# Steps the shortest run must hold: the first has no start time, so two give one rate.
STEPS_FOR_A_RATE = 3


def start_phases_s(job: JobSpec) -> tuple[float, float]:
    """The emulated run's warmup (weights loading) and start-up (weights resident, no steps;
    longer with torch.compile) in seconds, before its first step. Assumed, not measured: the
    paper (section 2) shows the phases but not their lengths; loading scales with the bytes each
    node reads (twice the weights' for pretraining, with optimizer state)."""
    warmup_s = 40.0 + 2.5 * job.total_params_b * (2 if job.task == "pt" else 1) / max(
        1, min(job.gpus, GPUS_PER_NODE)
    )
    return warmup_s, 25.0 + (75.0 if job.compile else 0.0)


def shortest_run_s(
    job: JobSpec,
    gpu: GPUSpec,
    setpoint: float,
    sample_period_s: float,
    knob: str = group_default("knob"),
) -> float:
    """The shortest emulated run of ``job`` that has a training phase to summarise at
    ``setpoint`` (a cap in W, or with ``knob="clock"`` a locked clock in MHz; the group's
    slowest): its start phases, then STEPS_FOR_A_RATE steps at the first steps' pace and
    MIN_SAMPLES_PER_RUN samples."""
    leak = gpu_leakages(0, job.gpus)
    if knob == "clock":
        step_s = job_at_clock(job, gpu, setpoint, leak).step_s
    else:
        step_s = job_at_caps(job, gpu, [setpoint], leak)[0].step_s
    steps_s = STEPS_FOR_A_RATE * (1 + FIRST_STEPS_EXTRA) * step_s
    return sum(start_phases_s(job)) + steps_s + MIN_SAMPLES_PER_RUN * sample_period_s


def check_run_length(cfg: dict[str, Any]) -> None:
    """``run.duration_s`` of an emulated campaign (``wattflex.config.prepare``'s result) long
    enough for every group to reach a steady state at its slowest setpoint."""
    if cfg.get("source") == "ingest" or not cfg.get("groups"):
        return  # an ingested campaign runs nothing
    run = cfg["run"]
    for i, g in enumerate(groups(cfg)):
        try:
            job = JobSpec.from_config(g, cfg["_catalog"][g["model"]])
        except (KeyError, TypeError, ValueError):
            # an incomplete catalogue entry: its runs fail and record why (run.json,
            # missing_runs.csv) while the other groups' runs go on; not a reason to refuse all
            continue
        clock = g["knob"] == "clock"
        setpoint = min(g["clocks"]) if clock else min(g["caps"])
        period_s = float(run["sample_period_s"])
        need_s = shortest_run_s(job, GPUS[g["gpu"]], setpoint, period_s, g["knob"])
        if float(run["duration_s"]) < need_s:
            warmup_s, startup_s = start_phases_s(job)
            raise ConfigError(
                f"config error at run.duration_s: {float(run['duration_s']):g} s is too short "
                f"for groups[{i}] ({g['id']!r}) on the emulated backend: it loads weights for "
                f"{warmup_s:.0f} s and starts up for {startup_s:.0f} s"
                f"{' (torch.compile)' if job.compile else ''}, and at {setpoint:g} "
                f"{'MHz' if clock else 'W'} a summary needs a few steps more: use at least "
                f"{math.ceil(need_s)} s"
            )
