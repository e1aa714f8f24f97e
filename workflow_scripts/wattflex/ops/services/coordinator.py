"""The SLURM coordinator: one grid event split over a cluster's (job, node) units, period by
period, each unit's agent (``wattflex control --budget-file``) told its share.

The coordinator learns the running GPU jobs from SLURM (:func:`wattflex.ops.adapters.slurm.discover`),
starts an agent per new unit, reads each unit's load file, splits the event's budget over the
answering units (:func:`wattflex.ops.adapters.slurm.coordinate_once`) and records the cluster's
load, budget and baselines for the M&V. Its settings and its meeting points with the cluster
are two dataclasses, :class:`CoordinatorSettings` and :class:`CoordinatorHooks`.
"""

from __future__ import annotations

import math
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wattflex.errors import UserError
from wattflex.gpus import GPUSpec
from wattflex.ops.adapters.slurm import (
    ClusterSplit,
    OnceLog,
    SlurmJob,
    agent_command,
    coordinate_once,
    discover,
    jobs_or_last,
    read_fresh,
    unit_name,
)
from wattflex.ops.adapters.slurm_knobs import KnobPlan
from wattflex.ops.adapters.topology import Site
from wattflex.ops.events import Schedule, Signal, event_end, ramp_at
from wattflex.ops.services.exporter import SiteExporter, write_targets
from wattflex.ops.services.mv import write_run_mv_report
from wattflex.policies import baseline, get
from wattflex.runs.devices.caps import SIGNALS, CapSignal


@dataclass
class ClusterRecord:
    """Per coordinator period: time, the cluster budget, the cluster load (answering units'
    measured load + the others at their uncapped power) and how many units answered."""

    t_s: list[float]
    budget_w: list[float]
    power_w: list[float]
    alive: list[int]
    caps_w: list[list[float]]  # (none: caps are the agents'; kept for the M&V writer)
    # per unit: the campaign group whose curve split its share, or None (equal weight)
    unit_group: dict[str, str | None] = field(default_factory=dict)
    # the counterfactual uncapped load from the curves per period (NaN without curves): each
    # unit with a curve at its curve's uncapped power, one without at its load last measured
    # outside an event; and what each unit was counted at
    baseline_curves_w: list[float] = field(default_factory=list)
    baseline_by_unit: dict[str, str] = field(default_factory=dict)
    unit_pre_event_w: dict[str, float] = field(default_factory=dict)  # last load outside an event
    # with a site file: per level of it (``rack:r1``), its load each period (its units' loads,
    # a silent unit at its GPUs x the max limit) and its limit (W)
    level_w: dict[str, list[float]] = field(default_factory=dict)
    level_limit_w: dict[str, float] = field(default_factory=dict)
    level_kind: dict[str, str] = field(default_factory=dict)
    basis_w: list[float] = field(default_factory=list)  # what the fractions applied to, per period


@dataclass(frozen=True)
class CoordinatorSettings:
    """What the coordinator follows and holds: ``source``, a schedule or signal
    (``budget(t, basis_w)``, ``active(t)``); ``basis``, ``nominal`` (GPUs x ``max_w``) or
    ``measured`` (the cluster load of the last period before an event); ``budget_dir``, the
    units' budget and load files; ``duration_s`` and ``period_s``; ``min_w``/``max_w``, a
    GPU's cap range; ``stale_s``, the age past which a unit's load file counts as not
    answering; ``split``, how the budget is split (equal weights by default); ``site``, the
    site's electrical tree (:class:`wattflex.ops.adapters.topology.Site`) or None."""

    source: Schedule | Signal
    basis: str
    budget_dir: Path
    duration_s: float
    period_s: float
    min_w: float
    max_w: float
    stale_s: float
    split: ClusterSplit | None = None
    site: Site | None = None


@dataclass(frozen=True)
class CoordinatorHooks:
    """How the coordinator meets the cluster: ``discover_jobs()``, the running GPU jobs
    (:func:`wattflex.ops.adapters.slurm.discover`); ``launch(job, node)``, a new unit's agent;
    ``log``, its lines; ``clock`` and ``sleep`` (a test's own); ``knobs``, the knob menu's
    choice (:class:`wattflex.ops.adapters.slurm_knobs.KnobPlan`) or None; ``on_period(rec,
    loads)``, after each period, with its units' load files (None: silent)."""

    discover_jobs: Callable[[], Sequence[SlurmJob]]
    launch: Callable[[SlurmJob, str], None]
    log: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    knobs: KnobPlan | None = None
    on_period: Callable[[ClusterRecord, list[Mapping[str, Any] | None]], None] | None = None


def run_coordinator(settings: CoordinatorSettings, hooks: CoordinatorHooks) -> ClusterRecord:
    """Follow ``settings.source`` over the
    jobs ``discover_jobs()`` reports, ``launch(job, node)`` starting each new unit's agent.
    The basis is ``nominal`` (GPUs x ``max_w``) or ``measured`` (the cluster load of the last
    period before an event). ``split``: how the budget is split (default equal weights); a
    new job whose share has no curve under a curve policy is said to ``log``, and so are a
    SLURM failure (retried, then the last job set held) and a load file that cannot be used.
    At the end, however the loop ends (an exception, a signal raised as one), every unit is
    told: no budget (restore). ``site`` (:class:`wattflex.ops.adapters.topology.Site`): every level's
    limit held in every period (:func:`coordinate_once`) and its load recorded. ``knobs`` (a
    :class:`wattflex.ops.adapters.slurm_knobs.KnobPlan`): the knob menu's choice, carried out at each
    event's start (its jobs' units then counted at what the knob leaves) and undone at its
    end, and however the loop ends. ``on_period(rec, loads)``: after each period, with its
    units' load files (None: silent), e.g. the site's metrics."""
    source, basis, budget_dir = settings.source, settings.basis, settings.budget_dir
    duration_s, period_s = settings.duration_s, settings.period_s
    min_w, max_w, stale_s = settings.min_w, settings.max_w, settings.stale_s
    split, site = settings.split, settings.site
    discover_jobs, launch, log = hooks.discover_jobs, hooks.launch, hooks.log
    clock, sleep, knobs, on_period = hooks.clock, hooks.sleep, hooks.knobs, hooks.on_period
    split = split or ClusterSplit()
    rec = ClusterRecord([], [], [], [], [])
    launched: set[str] = set()
    t0, t0_unix = clock(), time.time()
    measured = math.nan
    jobs: list[SlurmJob] = []
    slurm_failing: str | None = None  # why SLURM failed, while the last job set is held
    knob_on = False  # the knob choice carried out (an event in force)
    bad_load = OnceLog(lambda m: log(f"warning: load file {m}: unit counted as not answering"))
    backoff_s = tuple(f * period_s for f in (0.05, 0.1, 0.2))  # within one period
    try:
        while (t := clock() - t0) <= duration_s:
            jobs, why = jobs_or_last(discover_jobs, jobs, sleep, backoff_s)
            if why is not None and slurm_failing is None:
                log(
                    f"warning: SLURM failed ({why}); holding the last known "
                    f"{len(jobs)} job(s) and their shares, asking again each period"
                )
            elif why is None and slurm_failing is not None:
                log("SLURM answers again: following its job list")
            slurm_failing = why
            if (
                knobs is not None
            ):  # a paused job is SUSPENDED, not RUNNING: still here, at idle power
                jobs = jobs + knobs.kept(jobs)
            if (
                why is None
            ):  # a requeued job that runs again gets a new agent (its old one ended with it)
                launched &= {unit_name(j.job_id, n) for j in jobs for n in j.gpus}
            in_event = bool(np.asarray(source.active(t)))
            if knobs is not None and in_event != knob_on:
                if in_event:
                    knobs.start(jobs)
                else:
                    knobs.end()
                knob_on = in_event
            charged = {
                unit_name(j.job_id, n): c
                for j in jobs
                for n in j.gpus
                if knobs is not None and (c := knobs.charged_w(j, n)) is not None
            }
            clocks = {
                unit_name(j.job_id, n): c
                for j in jobs
                for n in j.gpus
                if knobs is not None and (c := knobs.clock_mhz(j)) is not None
            }
            for j in jobs:
                for n in j.gpus:
                    if unit_name(j.job_id, n) not in launched:
                        launch(j, n)
                        launched.add(unit_name(j.job_id, n))
                        if site is not None and n not in site.node_level:
                            log(
                                f"warning: node {n} (unit {unit_name(j.job_id, n)}) is not in the site file: "
                                f"held by the site's limit only, no rack or feed of it"
                            )
                        group = split.group_of(j) if get(split.policy).needs_curves else None
                        rec.unit_group[unit_name(j.job_id, n)] = group
                        if get(split.policy).needs_curves:
                            log(
                                f"unit {unit_name(j.job_id, n)} (job name {j.name!r}): "
                                + (
                                    f"{split.policy} split on group {group}'s curve"
                                    if group
                                    else "no curve for this job: equal-weight share"
                                )
                            )
            units = [(j, n) for j in jobs for n in j.gpus]
            gpus = np.array([len(j.gpus[n]) for j, n in units], float)
            loads = [
                read_fresh(
                    budget_dir / f"{unit_name(j.job_id, n)}.load.json", stale_s, bad=bad_load
                )
                for j, n in units
            ]
            load = sum(
                charged[u]
                if (u := unit_name(j.job_id, n)) in charged
                else float(d["load_w"])
                if d is not None
                else g * max_w
                for (j, n), d, g in zip(units, loads, gpus)
            )
            if not in_event:
                measured = load
            rec.baseline_curves_w.append(
                _curves_baseline(rec, split, units, loads, gpus * max_w, in_event)
            )
            basis_w = float(gpus.sum() * max_w) if basis == "nominal" else measured
            budget = float(source.budget(t, basis_w)) if math.isfinite(basis_w) else math.inf
            end = event_end(source, t)
            coordinate_once(
                jobs,
                budget,
                t0_unix + end if end is not None else -math.inf,
                budget_dir,
                min_w,
                max_w,
                stale_s,
                split,
                ramp_at(source, t),
                site,
                charged,
                clocks,
            )
            if site is not None:
                _record_levels(rec, site, units, loads, gpus * max_w, len(rec.t_s))
            rec.t_s.append(t)
            rec.budget_w.append(budget)
            rec.basis_w.append(basis_w)
            rec.power_w.append(load)
            rec.alive.append(sum(d is not None for d in loads))
            rec.caps_w.append([])
            if on_period is not None:
                on_period(rec, loads)
            sleep(max(0.0, t0 + (len(rec.t_s)) * period_s - clock()))
    finally:
        if knobs is not None:  # no job left paused or held, however the loop ends
            knobs.end()
        # the last word, however the loop ends: restore (still at the last event's ramp, so
        # the agents do not surge together)
        coordinate_once(
            jobs,
            math.inf,
            -math.inf,
            budget_dir,
            min_w,
            max_w,
            stale_s,
            split,
            ramp_at(source, duration_s),
            site,
        )
    return rec


def _record_levels(
    rec: ClusterRecord,
    site: Any,
    units: Sequence[tuple[SlurmJob, str]],
    loads: Sequence[Mapping[str, Any] | None],
    uncapped_w: np.ndarray,
    k: int,
) -> None:
    """This period's load of every level of the site (a silent unit at ``uncapped_w``)."""
    fam = site.laminar([n for _, n in units])
    power = np.array(
        [float(d["load_w"]) if d is not None else float(u) for d, u in zip(loads, uncapped_w)]
    )
    for name, kind, lim, load in zip(
        fam.names,
        fam.kinds,
        fam.limit_w,
        fam.loads(power) if len(units) else np.zeros(len(fam.names)),
    ):
        series = rec.level_w.setdefault(name, [math.nan] * k)
        series.append(float(load))
        rec.level_limit_w[name], rec.level_kind[name] = float(lim), kind


def _curves_baseline(
    rec: ClusterRecord,
    split: ClusterSplit,
    units: Sequence[tuple[SlurmJob, str]],
    loads: Sequence[Mapping[str, Any] | None],
    uncapped_w: np.ndarray,
    in_event: bool,
) -> float:
    """This period's counterfactual uncapped cluster load from the curves (NaN without curves):
    a unit with a curve at its curve's uncapped power, one without at its load last measured
    outside an event (at its GPUs x the max limit until then, as a unit not answering)."""
    if split.curves is None:
        return math.nan
    total = 0.0
    for (job, node), c, d, top in zip(units, split.unit_uncapped_w(units), loads, uncapped_w):
        u = unit_name(job.job_id, node)
        if not in_event and d is not None:
            rec.unit_pre_event_w[u] = float(d["load_w"])
        if np.isfinite(c):
            total += float(c)
            rec.baseline_by_unit[u] = f"curve of group {split.group_of(job)}"
        else:
            total += rec.unit_pre_event_w.get(u, float(top))
            rec.baseline_by_unit[u] = "no curve: its load before the event"
    return total


@dataclass(frozen=True)
class ClusterControlSettings:
    """What ``wattflex cluster-control`` follows, its inputs already read and checked:
    ``source`` (a checked schedule or a signal) for ``duration_s``; the budget folder every
    node sees; the split, site and knob plan; the ``partitions`` to follow (none: all); the
    GPU model (its cap range); the agents' policy, state folder and metrics address; the
    site's metrics port; the M&V folder and deadline; ``options``, what the M&V records."""

    source: Schedule | Signal
    duration_s: float
    budget_dir: Path
    period_s: float
    basis: str
    gpu: GPUSpec
    split: ClusterSplit | None = None
    site: Site | None = None
    knobs: KnobPlan | None = None
    partitions: Sequence[str] = ()
    agent_policy: str = "equal-weight"
    agent_state_dir: str | None = None
    agent_metrics_addr: str | None = None
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    mv_out: str | None = None
    response_s: float = math.inf
    squeue_timeout_s: float = 5.0
    options: Mapping[str, Any] = field(default_factory=dict)


def run_cluster_control(
    s: ClusterControlSettings, mv_figure: Callable[..., Any] | None = None
) -> int:
    """Follow ``s.source`` across the SLURM cluster's GPU jobs: one agent per (job, node)
    started as a step in the job's allocation (``wattflex control --budget-file``), the budget
    split each period (:func:`run_coordinator`), and however it ends (an error, SIGINT/SIGTERM/
    SIGHUP ...) every agent told to restore, then stopped. With ``mv_out``, the event's M&V on
    the cluster load (its figure drawn by ``mv_figure``). Returns 1 when an agent ended with an
    error, else 0."""
    out, duration, source = s.budget_dir, s.duration_s, s.source
    split, site, knobs, partitions, gpu = s.split, s.site, s.knobs, s.partitions, s.gpu
    wattflex = shutil.which("wattflex") or "wattflex"
    agents: dict[str, subprocess.Popen] = {}

    def launch(job, node) -> None:
        # an agent runs a little past the coordinator, which tells it to restore at the end
        cmd = agent_command(
            job,
            node,
            out,
            s.period_s,
            duration + 3 * s.period_s,
            s.agent_policy,
            wattflex,
            s.agent_state_dir,
            s.agent_metrics_addr,
        )
        unit = f"{job.job_id}.{node}"
        k = sum(
            a == unit or a.startswith(f"{unit}#") for a in agents
        )  # a requeued job's next agent
        with open(out / f"{unit}.agent.log", "a" if k else "w") as log:
            agents[unit if not k else f"{unit}#{k}"] = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT
            )
        print(
            f"agent for job {job.job_id} on {node} started ({len(job.gpus[node])} GPU(s))",
            flush=True,
        )

    bad_job = OnceLog(lambda msg: print(f"warning: {msg}", file=sys.stderr, flush=True))
    exporter = site_exporter(s.metrics_port, s.metrics_addr)
    targets = out / "prometheus-targets.json" if s.agent_metrics_addr else None

    def on_period(rec, loads) -> None:
        if exporter is not None:
            exporter.update(rec, loads)
        if targets is not None:
            write_targets(targets, loads)

    ended = False
    try:
        with termination_raises():  # a signal unwinds through here: the agents are told and stopped
            rec = run_coordinator(
                CoordinatorSettings(
                    source,
                    s.basis,
                    out,
                    duration,
                    s.period_s,
                    min_w=gpu.min_limit_w,
                    max_w=gpu.max_limit_w,
                    stale_s=3 * s.period_s,
                    split=split,
                    site=site,
                ),
                CoordinatorHooks(
                    lambda: discover(
                        partitions=partitions,
                        report=bad_job,
                        timeout_s=max(s.period_s, s.squeue_timeout_s),
                    ),
                    launch,
                    log=lambda msg: print(msg, flush=True),
                    knobs=knobs,
                    on_period=on_period,
                ),
            )
        ended = True
    finally:
        stop_agents(agents.values(), s.period_s, ended)
        if exporter is not None:
            exporter.close()
    # a requeued job's agent ended with the job (the requeue stopped it): not a failure
    requeued = knobs.requeued if knobs is not None else set()
    failed = [
        u for u, p in agents.items() if p.returncode != 0 and u.split(".", 1)[0] not in requeued
    ]
    print(
        f"done: {len(rec.t_s)} periods, {len(agents)} agent(s); every agent stopped (caps restored)",
        flush=True,
    )
    if failed:
        print(
            f"warning: agent(s) {', '.join(failed)} ended with an error: see {out}/*.agent.log",
            file=sys.stderr,
        )
    if s.mv_out:
        first = next((k for k, b in enumerate(rec.budget_w) if math.isfinite(b)), 0)
        # what the event's fraction applied to: the load just before it (--basis measured) or
        # the GPUs x their max limit (nominal), as the coordinator had it
        basis = rec.basis_w[first] if rec.basis_w and math.isfinite(rec.basis_w[first]) else None
        # the counterfactual uncapped load: from the jobs' curves (--curves) and, in the M&V,
        # from the load just before the event
        write_run_mv_report(
            Path(s.mv_out),
            rec,
            source,
            s.response_s,
            rec.baseline_curves_w,
            mv_params(s.options, rec),
            basis if isinstance(source, Schedule) else None,
            "wattflex cluster-control (SLURM)",
            mv_figure,
        )
    return 1 if failed else 0


def site_exporter(port: int | None, addr: str) -> SiteExporter | None:
    """The site's metrics server on ``port`` (``--metrics-port``; None without it), its URL said."""
    if port is None:
        return None
    if not 0 <= port <= 65535:
        raise UserError(f"--metrics-port {port}: must be 0..65535 (0: a free port)")
    try:
        exporter = SiteExporter(port, addr)
    except OSError as exc:
        raise UserError(
            f"--metrics-port {port}: cannot listen on {addr} ({exc.strerror or exc})"
        ) from None
    print(f"metrics at {exporter.url}", flush=True)
    return exporter


@contextmanager
def termination_raises():
    """SIGINT, SIGTERM & co. raised as :class:`CapSignal` (exit 128 + signal) in the main
    thread while the coordinator runs, so every ``finally`` runs (a signal's default action
    ends the process without them, the agents never told to restore)."""

    def on_signal(signum, _frame):
        raise CapSignal(signum)

    old = {
        sig: signal.signal(sig, on_signal) for sig in (getattr(signal, name) for name in SIGNALS)
    }
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def stop_agents(agents, period_s: float, ended: bool) -> None:
    """Every agent stopped. At the planned end each ends on its own, restored, a little after
    the coordinator (SIGTERM after a minute); after an early stop (an error, a signal) each
    has two periods to read the restore word, then SIGTERM. SIGKILL a minute after that."""
    deadline = time.monotonic() + (60 + 3 * period_s if ended else 2 * period_s + 1)
    for p in agents:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.terminate()  # each agent's guard restores its caps then too
    for p in agents:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()


def mv_params(options: Mapping[str, Any], rec: ClusterRecord) -> dict:
    """The M&V record's parameters: the command's ``options`` and which campaign curve split each
    unit's share (a unit whose job has none: its equal-weight share)."""
    params = dict(options)
    if get(options.get("policy", baseline())).needs_curves:
        params["split_curve_by_unit"] = {
            u: g or "none: equal-weight share" for u, g in rec.unit_group.items()
        }
    if options.get("curves"):
        params["baseline_curves_by_unit"] = dict(rec.baseline_by_unit)
    return params
