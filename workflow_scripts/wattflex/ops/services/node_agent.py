"""The controller on real (or emulated) devices: one job = a set of GPUs that share a cap.

:func:`run_loop` reads every job's telemetry each period, asks the
:class:`wattflex.ops.controller.Controller` for caps and sets them on the GPUs through
the device layer, under a :class:`wattflex.runs.devices.caps.CapGuard`, so every limit is
restored on a normal stop, an exception, a termination signal (``caps.SIGNALS``) and at exit.
A budget below the jobs' floors (the sum of their minimum caps) cannot be met: every GPU is
capped at its floor and each such period logs a warning.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wattflex.ops.controller import ControlConfig, Controller, JobTable, Readings, round_caps
from wattflex.runs.command_run import LineFollower
from wattflex.runs.devices.caps import CapGuard
from wattflex.runs.throughput import ThroughputSource

log = logging.getLogger("wattflex.ops.services.node_agent")


@dataclass
class NodeJob:
    """A job on this node: its GPUs (``PowerCapDevice``), and ``read(t_s)`` returning its
    telemetry for the last period (keys of :class:`Readings` per job: power_w, tokens_per_s,
    gpu_util, dram_active, mem_copy_util, sm_active, t_s of the newest sample). Profile
    fields as in :class:`JobTable` (NaN = learn from its first uncapped period)."""

    job_id: str
    devices: list[Any]
    read: Callable[[float], dict[str, float]]
    moe_ft: bool = False
    p_max_w: float = math.nan
    t_max: float = math.nan
    dram_copy_product: float = math.nan
    pfi: float = math.nan


class LogThroughput:
    """A job's tokens/s from the log it already writes, read as the command backend reads it
    (:class:`wattflex.runs.command_run.LineFollower` with a
    :class:`wattflex.runs.throughput.ThroughputSource`: a framework's preset or a regex): the
    rate its last matched line logged, NaN before the first and once that line is older than
    ``stale_s`` (a job that stopped logging is not taken to run at its last rate)."""

    def __init__(self, path: str | Path, source: ThroughputSource, stale_s: float = 60.0):
        self.t0, self.stale_s = time.time(), stale_s
        self.follower = LineFollower(Path(path), source, self.t0).start()

    def tokens_per_s(self) -> float:
        """The latest logged rate of the job (tokens/s), NaN when none is fresh."""
        rows = self.follower.rows
        if not rows:
            return math.nan
        read_s, _, tps, _ = rows[-1]
        return float(tps) if time.time() - (self.t0 + read_s) <= self.stale_s else math.nan

    def close(self) -> None:
        """Stop following the log."""
        self.follower.stop()


def sample_devices(
    devices: Sequence[Any], t_s: float, throughput: Callable[[], float] | None = None
) -> dict[str, float]:
    """Job telemetry from devices with ``sample(t_s)`` (``NvmlGpu``): power summed, activity
    averaged; tokens/s from ``throughput`` (e.g. :meth:`LogThroughput.tokens_per_s`), NaN
    without one: a GPU does not know tokens."""
    rows = [d.sample(t_s) for d in devices]
    mean = lambda k: float(np.nanmean([r.get(k, math.nan) for r in rows])) if rows else math.nan  # noqa: E731
    power = [r.get("power_w", math.nan) for r in rows]
    return {
        "t_s": t_s,
        "power_w": float(np.sum(power)) if np.isfinite(power).all() else math.nan,
        "tokens_per_s": throughput() if throughput is not None else math.nan,
        "gpu_util": mean("gpu_util"),
        "dram_active": mean("dram_active"),
        "mem_copy_util": mean("mem_copy_util"),
        "sm_active": mean("sm_active"),
        "gpus": rows,
    }


def job_table(jobs: Sequence[NodeJob]) -> JobTable:
    """The jobs as the controller sees them. A job's cap range is what all its GPUs accept,
    and never above the limit a GPU had before the controller started (the operator's)."""

    def cap_range(d: Any) -> tuple[float, float]:
        lo, hi = d.constraints()
        return lo, min(hi, getattr(d, "original_limit_w", hi))

    lim = [[cap_range(d) for d in j.devices] for j in jobs]
    return JobTable(
        uid=np.arange(len(jobs)),
        gpus=np.array([len(j.devices) for j in jobs]),
        min_cap_w=np.array([max(lo for lo, _ in lj) for lj in lim], float),
        max_cap_w=np.array([min(hi for _, hi in lj) for lj in lim], float),
        moe_ft=np.array([j.moe_ft for j in jobs], bool),
        p_max_w=np.array([j.p_max_w for j in jobs], float),
        t_max=np.array([j.t_max for j in jobs], float),
        dram_copy_product=np.array([j.dram_copy_product for j in jobs], float),
        pfi=np.array([j.pfi for j in jobs], float),
    )


def floor_w(table: JobTable) -> float:
    """The least power the jobs can be capped to: every GPU at its job's minimum cap."""
    return float((table.min_cap_w * table.gpus).sum())


def read_jobs(
    jobs: Sequence[NodeJob],
    t_s: float,
    idle_power_w: float = 0.0,
    raw: list[dict[str, Any]] | None = None,
) -> Readings:
    """One reading of every job; a read that fails or returns NaN power counts as stale.
    ``raw``: filled with each job's reading as ``read`` returned it (per-GPU rows included)."""
    vals = raw if raw is not None else []
    vals.clear()
    for j in jobs:
        try:
            v = dict(j.read(t_s))
        except Exception as exc:  # a telemetry failure must not stop the controller
            log.warning(
                "telemetry of job %s failed (%s: %s): safe cap for it",
                j.job_id,
                type(exc).__name__,
                exc,
            )
            v = {"power_w": math.nan}
        vals.append(v)
    col = lambda k: np.array([float(v.get(k, math.nan)) for v in vals])  # noqa: E731
    age = np.array(
        [t_s - float(v["t_s"]) if np.isfinite(v.get("t_s", math.nan)) else math.inf for v in vals]
    )
    power = col("power_w")
    return Readings(
        power,
        col("tokens_per_s"),
        col("gpu_util"),
        age,
        np.array([np.nansum(power) + idle_power_w]),
        np.array([idle_power_w]),
        0,
        col("dram_active"),
        col("mem_copy_util"),
        col("sm_active"),
    )


def apply_caps(jobs: Sequence[NodeJob], caps_w: np.ndarray, current: dict[int, float]) -> int:
    """Set each job's cap on all its GPUs where it changed; returns how many GPUs were set."""
    n = 0
    for j, cap in zip(jobs, caps_w):
        for d in j.devices:
            if np.isfinite(cap) and current.get(id(d)) != float(cap):
                d.set_cap(float(cap))
                current[id(d)] = float(cap)
                n += 1
    return n


@dataclass
class LoopRecord:
    t_s: list[float] = field(default_factory=list)
    budget_w: list[float] = field(default_factory=list)
    limit_w: list[float] = field(default_factory=list)  # the electrical limit in force (inf: none)
    power_w: list[float] = field(default_factory=list)
    caps_w: list[list[float]] = field(default_factory=list)
    fallback: list[list[bool]] = field(default_factory=list)
    last_readings: list[dict[str, Any]] = field(default_factory=list)  # the latest period, per job
    controller: Controller | None = None


def run_loop(
    jobs: Sequence[NodeJob],
    budget_at: Callable[[float], float],
    policy: str,
    cfg: ControlConfig,
    duration_s: float,
    *,
    mode: str = "nvml",
    state_dir: str | Path | None = None,
    command: str | None = None,
    handle_signals: bool = True,
    predict_pfi: Callable[[np.ndarray], np.ndarray] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_period: Callable[[LoopRecord], None] | None = None,
    ramp_at: Callable[[float], float] | None = None,
    limit_at: Callable[[float], float] | None = None,
) -> LoopRecord:
    """Control ``jobs`` for ``duration_s`` seconds. Every GPU's original limit is recorded in
    a state file and restored on return, exception or signal (``CapGuard``); before the first
    reading every GPU gets the safe equal-weight cap of the starting budget. ``ramp_at(t)``: the
    ramp limit (W/s) the controller holds its cap changes to (default none); ``limit_at(t)``:
    the electrical limit (W) on these jobs together, held whatever the ramp (default none)."""
    devices = [d for j in jobs for d in j.devices]
    table = job_table(jobs)
    ctl = Controller([policy], cfg, len(jobs), predict_pfi)
    lo, hi = float(table.min_cap_w.max()), float(table.max_cap_w.min())
    b0 = min(budget_at(0.0), math.inf if limit_at is None else float(limit_at(0.0)))
    start_cap = (
        hi
        if not np.isfinite(b0)
        else float(
            round_caps(
                np.array(b0 * (1 - cfg.target_margin) / max(len(devices), 1)),
                np.array(lo),
                np.array(hi),
                cfg.cap_step_w,
            )
        )
    )
    floor = floor_w(table)
    rec = LoopRecord(controller=ctl)
    with CapGuard(devices, start_cap, mode, state_dir, command, handle_signals=handle_signals):
        current = {id(d): start_cap for d in devices}
        t0 = clock()
        next_t = t0
        while True:
            t = clock() - t0
            if t > duration_s:
                break
            budget = float(budget_at(t))
            if budget < floor:
                log.warning(
                    "t=%.1f s: budget %.0f W is below the jobs' floor %.0f W (every GPU at its minimum "
                    "cap): capping at the floors, power may exceed the budget",
                    t,
                    budget,
                    floor,
                )
            read = read_jobs(jobs, t, raw=rec.last_readings)
            limit = math.inf if limit_at is None else float(limit_at(t))
            caps = ctl.step(
                t, budget, table, read, math.inf if ramp_at is None else float(ramp_at(t)), limit
            )[0]
            apply_caps(jobs, caps, current)
            rec.t_s.append(t)
            rec.budget_w.append(budget)
            rec.limit_w.append(limit)
            rec.power_w.append(float(read.total_power_w[0]))
            rec.caps_w.append([float(c) for c in caps])
            rec.fallback.append([bool(f) for f in ctl.fallback[0]])
            if on_period is not None:
                on_period(rec)
            next_t += cfg.period_s
            sleep(max(0.0, next_t - clock()))
    return rec
