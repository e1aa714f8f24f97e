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
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from wattflex.errors import ConfigError, UserError
from wattflex.ops.adapters.openadr import OpenADRVen, VenSettings
from wattflex.ops.adapters.openadr3 import OpenADR3Ven
from wattflex.ops.adapters.slurm import BudgetFile, write_load
from wattflex.ops.adapters.topology import read_site
from wattflex.ops.controller import (
    ControlConfig,
    Controller,
    JobTable,
    Readings,
    pfi_from_model,
    round_caps,
)
from wattflex.ops.events import (
    Schedule,
    check_schedule,
    check_target_units,
    ramp_at,
    read_schedule,
    signal_end_s,
)
from wattflex.ops.services.exporter import ControlExporter
from wattflex.ops.services.mv import write_run_mv_report
from wattflex.policies import REGISTRY
from wattflex.runs.command_run import LineFollower
from wattflex.runs.devices.base import CapError
from wattflex.runs.devices.caps import CapGuard, limit_setter, restore_from_state_dir
from wattflex.runs.devices.clocks import ClockHold
from wattflex.runs.devices.nvml import local_gpu_indices, nvml, open_gpus
from wattflex.runs.throughput import ThroughputError, ThroughputSource
from wattflex.schema import section_defaults

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


# the command's defaults, from the same schema sections (wattflex control --help)
_CONTROLLER, _CUDA = section_defaults("control", "controller"), section_defaults("cuda")
_SCENARIO = section_defaults("control", "scenarios", "*")


@dataclass(frozen=True)
class NodeAgentSettings:
    """What a node agent (``wattflex control``) follows and how, each field its option's value
    (``--budget-w``: ``budget_w``; see ``wattflex control --help``). ``jobs``: each job's
    NVML indices (None: one job per GPU); ``model``: a predictor model already read (or None);
    ``params``: what the M&V records as the run's parameters."""

    jobs: list[list[int]] | None
    state_dir: Path
    policy: str = "equal-weight"
    dry_run: bool = False
    at_s: float = 0.0
    budget_w: float | None = None
    signal: str | None = None
    basis: str = "nominal"
    openadr_vtn: str | None = None
    openadr3_vtn: str | None = None
    openadr3_program: str | None = None
    ven_name: str | None = None
    budget_file: str | None = None
    budget_stale_s: float = 15.0  # as --budget-stale-s
    load_file: str | None = None
    site: str | None = None
    node: str | None = None
    ramp_kw_per_s: float | None = None
    moe_ft: Sequence[str] = ()
    model: Mapping[str, Any] | None = None
    period_s: float = _CONTROLLER["period_s"]
    duration_s: float | None = None
    cap_control: str = _CUDA["cap_control"]
    cap_command: str | None = None
    restore_stagger_s: float = _CONTROLLER["restore_stagger_s"]
    mv_out: str | None = None
    response_s: float = _SCENARIO["response_s"]
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    hpc_job_mapping_dir: str | None = None
    hpc_job: str = ""
    throughput_log: Sequence[str] = ()
    throughput_preset: str | None = None
    throughput_regex: str | None = None
    throughput_stale_s: float = 60.0  # as --throughput-stale-s
    params: Mapping[str, Any] = field(default_factory=dict)


def run_node_agent(s: NodeAgentSettings, mv_figure: Callable[..., Any] | None = None) -> int:
    """Follow ``s``'s budget (a fixed budget, a signal or schedule file, an OpenADR 2.0b or 3
    VTN, or a cluster-control budget file) with per-job caps on this node's GPUs until its
    duration ends, every limit restored after; or, with ``dry_run``, print the caps it would
    set now. Stale records of killed runs are restored first. With ``mv_out``, the event's M&V
    is written (its figure drawn by ``mv_figure``, see :func:`wattflex.ops.services.mv.write_run_mv_report`).
    Returns the exit status (0); bad input or a GPU that refuses a cap is a
    :class:`wattflex.errors.UserError`."""
    state_dir = s.state_dir
    indices = s.jobs
    try:
        nv = nvml()
    except RuntimeError as exc:
        raise UserError(
            f"no NVML on this machine ({exc}); there are no NVIDIA GPUs here to read or cap"
        ) from None
    if indices is None:
        indices = [[i] for i in local_gpu_indices()]
        if s.moe_ft and max(map(int, s.moe_ft)) >= len(indices):
            raise UserError(
                f"--moe-ft {max(map(int, s.moe_ft))}: this node has {len(indices)} job(s) (one per GPU)"
            )
    flat = [i for job in indices for i in job]
    if len(set(flat)) != len(flat):
        raise UserError("a GPU appears in two --job groups")
    check_gpu_indices(flat, int(nv.nvmlDeviceGetCount()))
    if s.dry_run:
        if state_dir.is_dir():
            restore_stale(state_dir, flat, dry_run=True)
    else:
        restore_stale(
            state_dir,
            flat,
            dry_run=False,
            cap_command=s.cap_command if s.cap_control == "command" else None,
        )
    setter = None if s.dry_run else limit_setter(s.cap_control, s.cap_command)
    # the node as SLURM names it (an agent's step; several nodes may share a host name in tests)
    node = s.node or os.environ.get("SLURMD_NODENAME") or None
    gpus = {g.index: g for g in open_gpus(set_limit=setter, indices=flat, node=node)}
    model = s.model
    logs = throughput_sources(s, indices)
    jobs = []
    for n, idx in enumerate(indices):
        devs = [gpus[i] for i in idx]
        tps = logs[n].tokens_per_s if logs else None
        jobs.append(
            NodeJob(
                job_id="gpu" + "+".join(map(str, idx)),
                devices=devs,
                read=lambda t, devs=devs, tps=tps: sample_devices(devs, t, tps),
                moe_ft=str(n) in s.moe_ft,
            )
        )
    try:
        return _control_jobs(s, jobs, gpus, flat, model, state_dir, mv_figure)
    finally:
        for follower in logs:
            follower.close()


def throughput_sources(s: NodeAgentSettings, indices: list[list[int]]) -> list:
    """One :class:`wattflex.ops.services.node_agent.LogThroughput` per job from ``--throughput-log``
    (none without it); a count that is not the jobs' or a preset/regex the command backend
    refuses is one line."""
    if not s.throughput_log:
        return []
    if len(s.throughput_log) != len(indices):
        raise UserError(
            f"--throughput-log given {len(s.throughput_log)} time(s) for {len(indices)} job(s): "
            f"one per job, in --job order"
        )
    spec = {"preset": s.throughput_preset} if s.throughput_preset else {"regex": s.throughput_regex}
    try:
        sources = [ThroughputSource.from_spec(spec, "--throughput", gpus=len(i)) for i in indices]
    except ThroughputError as exc:
        raise UserError(str(exc)) from None
    return [
        LogThroughput(path, src, s.throughput_stale_s)
        for path, src in zip(s.throughput_log, sources)
    ]


def _control_jobs(
    s: NodeAgentSettings,
    jobs: list,
    gpus: dict,
    flat: list[int],
    model,
    state_dir: Path,
    mv_figure: Callable[..., Any] | None,
) -> int:
    """The rest of ``run``: the jobs' first reading, the budget's source, then a dry run's
    table or the control loop with its exporter, clock hold and M&V."""
    first = read_jobs(jobs, 0.0)
    nominal = sum(hi for g in gpus.values() for _, hi in [g.constraints()])
    for j, p in zip(jobs, first.power_w):
        uncapped = all(d.power_limit_w() >= d.constraints()[1] - 1.0 for d in j.devices)
        j.p_max_w = float(p) if uncapped and math.isfinite(p) else math.nan
    dcp = first.dram_active * first.mem_copy_util
    predict_pfi = pfi_from_model(model)
    for j, d in zip(jobs, dcp):
        j.dram_copy_product = float(d)
        j.pfi = (
            float(predict_pfi(np.array([d]))[0])
            if predict_pfi is not None and math.isfinite(d)
            else math.nan
        )
    floor = floor_w(job_table(jobs))
    if s.budget_w is not None and s.budget_w < floor:
        raise UserError(
            f"--budget-w {s.budget_w:g} W is below these GPUs' floor of {floor:.0f} W (the sum of "
            f"their minimum caps, {len(flat)} GPU(s)): no cap keeps them under it"
        )
    if s.budget_w is not None:
        check_target_units(
            s.budget_w,
            nominal,
            f"--budget-w {s.budget_w:g} W",
            "--budget-w is in W",
        )
    signal, ven, load_w = None, None, [math.nan]
    if s.signal:
        signal = read_schedule(s.signal)
        basis = nominal if s.basis == "nominal" else float(np.nansum(first.power_w))
        if isinstance(signal, Schedule):
            checked = check_schedule(signal, floor, basis, s.period_s, ceiling_w=nominal)
            for w in checked.warnings:
                log.warning("%s", w)
            signal = checked.schedule
            end_s = signal_end_s(signal, basis, s.restore_stagger_s * len(jobs) + 2 * s.period_s)
        else:
            low = signal.fraction * basis
            if (low < floor).any():
                k = int(np.argmin(low))
                log.warning(
                    f"signal {s.signal} dips to {low[k]:.0f} W at t={signal.time_s[k]:g} s, below these "
                    f"GPUs' floor of {floor:.0f} W: they are held at their minimum caps then (power may exceed "
                    f"the budget; each such period logs a warning)"
                )
            end_s = signal.duration_s

        def budget_at(t: float) -> float:
            return float(signal.budget(t, basis))

        source = f"signal {s.signal} ({s.basis} basis {basis:.0f} W)"
        duration = s.duration_s if s.duration_s is not None else end_s
    elif s.openadr_vtn or s.openadr3_vtn:
        signal, ven = start_ven(
            s,
            floor,
            nominal if s.basis == "nominal" else float(np.nansum(first.power_w)),
            load_w,
        )
        basis = ven.s.basis_w
        budget_at = lambda t: float(signal.budget(t, basis))  # noqa: E731
        source = f"OpenADR{' 3' if s.openadr3_vtn else ''} VTN {ven.s.vtn_url} ({s.basis} basis {basis:.0f} W)"
        duration = s.duration_s
    elif s.budget_file:
        budget_file = BudgetFile(
            s.budget_file,
            s.budget_stale_s,
            lambda msg: log.warning("%s", msg),
        )
        budget_at = budget_file.budget_at
        source = f"budget file {s.budget_file}"
        duration = s.duration_s
    else:
        budget_at = lambda t: float(s.budget_w)  # noqa: E731
        source = f"--budget-w {s.budget_w:g}"
        duration = s.duration_s if s.duration_s is not None else math.inf
    limit_at = budget_file.limit_at if s.budget_file else None
    if s.site:
        node = s.node or os.environ.get("SLURMD_NODENAME") or os.uname().nodename
        try:
            share = read_site(s.site).node_share_w(node)
        except ConfigError as e:
            raise UserError(str(e)) from None
        if share < floor:
            raise UserError(
                f"--site {s.site}: node {node}'s share of its limits is {share:.0f} W, below these "
                f"GPUs' floor of {floor:.0f} W: no cap keeps them under it"
            )
        coordinated = limit_at
        limit_at = (lambda t: min(share, coordinated(t))) if coordinated else (lambda t: share)
        source += f", node {node}'s share of the site's limits {share:.0f} W"
    cfg = ControlConfig(period_s=s.period_s, restore_stagger_s=s.restore_stagger_s)
    if s.dry_run:
        t = s.at_s if s.signal else 0.0
        budget = budget_at(t)
        ctl = Controller([s.policy], cfg, len(jobs), predict_pfi)
        caps = ctl.step(
            t, budget, job_table(jobs), first, limit_w=math.inf if limit_at is None else limit_at(t)
        )[0]
        print(
            f"wattflex control --dry-run: policy {s.policy}, budget "
            f"{'none (no curtailment)' if not math.isfinite(budget) else f'{budget:.0f} W'} from {source} "
            f"at t={t:g} s, {len(flat)} GPU(s) in {len(jobs)} job(s)"
        )
        print(
            f"{'job':<12}{'gpu':>5}{'power_w':>10}{'limit_w':>10}{'would_set_w':>13}{'range_w':>11}"
        )
        for j, p, cap in zip(jobs, first.power_w, caps):
            for d in j.devices:
                lo, hi = d.constraints()
                print(
                    f"{j.job_id:<12}{d.index:>5}{p / len(j.devices):>10.1f}{d.power_limit_w():>10.0f}"
                    f"{cap:>13.0f}{f'{lo:.0f}-{hi:.0f}':>11}"
                )
        if predict_pfi is None and REGISTRY[s.policy].feature == "pfi":
            print(
                "note: no --model (or no DRAM activity from GPM): every job's PFI taken as equal",
                file=sys.stderr,
            )
        print("dry run: no power limit was changed")
        return 0
    if not math.isfinite(duration):
        raise UserError("with --budget-w, say how long to control with --duration-s")
    print(
        f"controlling {len(flat)} GPU(s) in {len(jobs)} job(s) with {s.policy} for {duration:g} s, budget from "
        f"{source}; limits are restored when this stops",
        flush=True,
    )
    exporter = None
    if s.metrics_port is not None:
        try:
            exporter = ControlExporter(
                s.metrics_port, s.metrics_addr, s.hpc_job_mapping_dir, s.hpc_job
            )
        except OSError as exc:
            if ven is not None:
                ven.stop()
            raise UserError(
                f"--metrics-port {s.metrics_port}: cannot listen on {s.metrics_addr} "
                f"({exc.strerror or exc})"
            ) from None
        print(f"metrics at {exporter.url}", flush=True)

    clock_hold = None
    if s.budget_file:  # the knob menu's clock, named in the budget file during an event
        clock_hold = ClockHold(list(gpus.values()), "nvml", state_dir)

    def on_period(r) -> None:
        load_w[0] = r.power_w[-1]
        if clock_hold is not None:
            follow_clock(clock_hold, budget_file.clock_at(r.t_s[-1]))
        if s.load_file:
            write_load(
                s.load_file,
                Path(s.load_file).name.removesuffix(".load.json"),
                r.power_w[-1],
                r.caps_w[-1],
                exporter.url if exporter is not None else None,
            )
        if exporter is not None:
            exporter.update(r, jobs)

    if ven is not None:
        signal.rebase(datetime.now(UTC))
    try:
        # a schedule's (or VTN's) events also ramp-limit the cap changes, down and back up
        # (a cluster-control agent: its unit's share of the event's ramp, in its budget file)
        ramp = (
            (lambda t: ramp_at(signal, t))
            if signal is not None
            else (budget_file.ramp_at if s.budget_file else None)
        )
        rec = run_loop(
            jobs,
            budget_at,
            s.policy,
            cfg,
            duration,
            mode=s.cap_control,
            state_dir=state_dir,
            command=s.cap_command,
            predict_pfi=predict_pfi,
            on_period=on_period,
            ramp_at=ramp,
            limit_at=limit_at,
        )
    except CapError as exc:  # the guard has put back what it could; the message says what is left
        raise UserError(f"{exc} (--cap-control {s.cap_control})") from None
    finally:
        if clock_hold is not None:
            clock_hold.close()
        if exporter is not None:
            exporter.close()
        if ven is not None:
            ven.stop()
            for eid, resp in ven.responses.items():
                print(f"OpenADR{' 3' if s.openadr3_vtn else ''} event {eid}: {resp}", flush=True)
            signal = signal.schedule
    over = [p - b for p, b in zip(rec.power_w, rec.budget_w) if math.isfinite(b)]
    print(
        f"done: {len(rec.t_s)} periods, worst reading {max(over, default=0):+.0f} W vs the budget; "
        f"power limits restored"
    )
    if s.mv_out and signal is not None:
        p_max = float(np.nansum([j.p_max_w for j in jobs]))
        write_run_mv_report(
            Path(s.mv_out),
            rec,
            signal,
            s.response_s,
            p_max,
            dict(s.params),
            basis,
            f"wattflex control on {os.uname().nodename}",
            mv_figure,
        )
    return 0


def follow_clock(hold, clock_mhz: float | None) -> None:
    """The agent's clock lock to ``clock_mhz``; a lock the GPUs refuse is said (the caps still
    hold the budget) and tried again next period."""
    try:
        hold.follow(clock_mhz)
    except CapError as exc:
        log.warning(f"SM clock lock at {clock_mhz:g} MHz failed ({exc})")


def check_gpu_indices(flat: list[int], count: int) -> None:
    """Every NVML index in ``flat`` exists on a node of ``count`` GPUs, or one line says not."""
    for i in flat:
        if i >= count:
            have = (
                "no GPUs"
                if count == 0
                else f"{count} GPU{'s' if count > 1 else ''}: "
                + ("0" if count == 1 else f"0-{count - 1}")
            )
            raise UserError(f"GPU index {i} does not exist (this node has {have})")


def restore_stale(
    state_dir: Path, flat: list[int], dry_run: bool, cap_command: str | None = None
) -> None:
    """Before any limit is read as an original: put back the limits recorded by runs that were
    killed (SIGKILL), as a real run does; refuse GPUs another live process is capping. Records
    another user planted are reported and left alone; ``cap_command`` is this agent's own."""
    for r in restore_from_state_dir(
        state_dir, dry_run=dry_run, only_gpus=flat, cap_command=cap_command
    ):
        gpus = ", ".join(
            f"GPU {g['index']} -> {g.get('restored_w', g['original_limit_w']):g} W"
            for g in r.get("gpus", [])
        )
        if r["action"] == "untrusted":
            print(f"warning: {r['path']}: {r['note']}; left alone", file=sys.stderr)
        elif r["action"] == "restored":
            print(
                f"restored the power limits left by killed process {r['pid']} ({gpus}; state file {r['path']})",
                file=sys.stderr,
            )
        elif r["action"] == "would restore":
            print(
                f"note: state file {r['path']} of killed process {r['pid']}: the limits shown are its caps; "
                f"control (or wattflex restore-caps) first puts back {gpus}",
                file=sys.stderr,
            )
        elif dry_run:
            print(
                f"note: state file {r['path']}: {r['action']}{': ' + r['error'] if r.get('error') else ''}; "
                f"the limits shown may not be the GPUs' own",
                file=sys.stderr,
            )
        elif r["action"].startswith("skipped"):
            raise UserError(
                f"process {r['pid']} is capping these GPUs now (state file {r['path']}); "
                f"stop it first, two controllers would fight"
            )
        else:
            raise UserError(
                f"state file {r['path']} of a killed run could not be restored ({r.get('error')}); "
                f"the limits now are not the originals: fix it, then `wattflex restore-caps "
                f"--state-dir {state_dir}`"
            )


def start_ven(s: NodeAgentSettings, floor_w: float, basis_w: float, load_w: list[float]):
    """The OpenADR 2.0b VEN (registered with the VTN) or OpenADR 3 VEN (first poll done); its
    live schedule and itself. It reports ``load_w[0]``, the load the controller measured last."""
    settings = VenSettings(
        ven_name=s.ven_name or socket.gethostname(),
        vtn_url=s.openadr_vtn or s.openadr3_vtn,
        floor_w=floor_w,
        basis_w=basis_w,
        period_s=s.period_s,
        ramp_w_per_s=math.inf if s.ramp_kw_per_s is None else s.ramp_kw_per_s * 1e3,
        deadline_s=s.response_s,
    )
    if s.openadr3_vtn:
        ven = OpenADR3Ven(
            settings,
            s.openadr3_program,
            lambda: load_w[0],
            poll_s=max(s.period_s, 0.5),
            token=os.environ.get("WATTFLEX_OPENADR3_TOKEN"),
        )
    else:
        ven = OpenADRVen(settings, load_w=lambda: load_w[0])
    try:
        ven.start()
    except ConnectionError as exc:
        raise UserError(str(exc)) from None
    return ven.live, ven
