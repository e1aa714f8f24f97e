"""The knob menu: what each way of shedding power saves and costs per job, and the cheapest mix.

A grid event asks the site to shed ``depth_w`` for ``duration_s`` with ``notice_s`` of
warning. Each job takes exactly one knob for the whole event:

- **curve knobs** (``cap``, and ``clock`` where its curve was measured or emulated): the job
  runs at any power on its measured power -> throughput curve between its floor (lowest
  cap / lowest locked clock) and its ceiling (uncapped); the cost is the tokens it trains
  less, ``duration * (T_max - T(P))``. Running uncapped is the curve knob at its ceiling
  (reported as ``none``).
- **pause** (SLURM ``scontrol suspend``): every GPU drops to idle power and keeps its
  memory, so the job resumes where it stopped; the cost is ``duration * T_max``. Not
  available when the event is longer than the job's ``max_pause_s`` (e.g. a collective's
  watchdog timeout; infinite unless given).
- **requeue** (checkpoint, ``scontrol requeue``, restart from the checkpoint): the node is
  freed, its power drops to ``requeue_residual_w`` (0: the node is powered down or given
  nothing to run); the cost is ``T_max * (lost_work + restart_s + duration)``, where
  ``restart_s`` is the resource plan's start-up time (build + first step,
  :func:`wattflex.runs.plan.plan_group`) and ``lost_work`` the work since its last
  checkpoint, or, when the notice leaves time to write a fresh one
  (``notice_s >= checkpoint_write_s``), the shorter of that and the write time (the steps
  after the snapshot are lost).

:func:`choose` picks one knob per job to minimise the tokens lost subject to
``sum power <= site power - depth``: an exact MILP (scipy.optimize.milp / HiGHS) with one
binary per (job, knob) and, for curve knobs, the incremental piecewise-linear formulation
of :func:`wattflex.allocation.oracle.milp_oracle` (exact for non-concave curves too).
Restricting the knobs (``knobs=("cap",)``) gives the caps-only answer, infeasible once the
depth passes the sum of the floors; ``("pause",)`` the pause-only one (the cheapest set of
jobs to pause, the others run uncapped). ``levels`` (a
:class:`wattflex.allocation.nested.Laminar` over the jobs: the site's feeds, PDUs, racks and
nodes, :meth:`wattflex.ops.adapters.topology.Site.laminar`) adds one row per level with a limit: its
jobs' power (the budget row's terms) at or under it. Every job's row says
which knob it took and why: each option's price in tokens per kWh shed and its most kW; a
``clock`` row names the clock to lock (``clock_mhz``, :func:`clock_at`). :func:`jobs_from_runs`
makes the jobs from a campaign's runs and a table of the jobs running (``wattflex knobs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from wattflex.allocation.nested import Laminar
from wattflex.allocation.oracle import RTOL, concave_hull, interp

CURVE_KNOBS = ("cap", "clock")
DISCRETE_KNOBS = ("pause", "requeue")
KNOBS = CURVE_KNOBS + DISCRETE_KNOBS


@dataclass(frozen=True)
class Event:
    """A grid event: shed ``depth_w`` below the site's uncapped power for ``duration_s``,
    announced ``notice_s`` before it starts."""

    depth_w: float
    duration_s: float
    notice_s: float = 0.0


@dataclass
class Job:
    """One job as the menu sees it. ``cap`` (and optionally ``clock``): (power_w, tokens_per_s)
    points sorted by power, the highest the uncapped run. Power is the job's GPU power
    (as the curves measure it); ``idle_w`` is the job's GPUs' total idle power.
    ``clock_mhz``: the SM clock of each ``clock`` curve point (what a lock at that point sets)."""

    name: str
    cap: tuple[np.ndarray, np.ndarray]
    idle_w: float
    restart_s: float
    checkpoint_write_s: float
    since_checkpoint_s: float
    clock: tuple[np.ndarray, np.ndarray] | None = None
    max_pause_s: float = float("inf")
    requeue_residual_w: float = 0.0
    clock_mhz: np.ndarray | None = None

    @property
    def ceiling_w(self) -> float:
        return float(np.asarray(self.cap[0])[-1])

    @property
    def t_max(self) -> float:
        return float(np.asarray(self.cap[1])[-1])


def clock_on_cap(
    cap: tuple[np.ndarray, np.ndarray], clock: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """A job's clock curve (power_w, tokens_per_s at each locked clock, sorted by power) on its
    cap curve's uncapped point, the one both knobs share: the clock points below that power,
    their tokens/s scaled by the cap curve's top over the clock curve's (the clock sweep's
    relative slowdown, on the cap run's throughput), then the cap curve's top."""
    top_p, top_t = (float(np.asarray(a, float)[-1]) for a in cap)
    P, T = (np.asarray(a, float) for a in clock)
    below = P < top_p
    return np.append(P[below], top_p), np.append(T[below] * top_t / T[-1], top_t)


@dataclass(frozen=True)
class Option:
    """A knob of one job: its power range during the event and its token cost at each end
    (discrete knobs: one point)."""

    knob: str
    power_w: np.ndarray  # curve points (discrete: one)
    tokens_lost: np.ndarray  # tokens lost over the event at each point
    available: bool = True
    why_not: str = ""


def clock_at(job: Job, power_w: float) -> float:
    """The SM clock (MHz, rounded down) that runs ``job`` at ``power_w`` on its ``clock``
    curve, interpolated between its measured points (power convex in the clock: the chord's
    clock draws at most ``power_w``); NaN without the points' clocks."""
    if job.clock is None or job.clock_mhz is None:
        return float("nan")
    return float(np.floor(np.interp(power_w, np.asarray(job.clock[0]), job.clock_mhz)))


def lost_work_s(job: Job, event: Event) -> float:
    """Seconds of training a requeue throws away (module docstring)."""
    if event.notice_s >= job.checkpoint_write_s:
        return min(job.since_checkpoint_s, job.checkpoint_write_s)
    return job.since_checkpoint_s


def options(job: Job, event: Event) -> list[Option]:
    """The job's menu for ``event``: every knob with its power and token cost."""
    out = []
    for knob in CURVE_KNOBS:
        curve = job.cap if knob == "cap" else job.clock
        if curve is None:
            out.append(
                Option(knob, np.array([job.ceiling_w]), np.array([0.0]), False, "no measured curve")
            )
            continue
        P, T = (np.asarray(a, float) for a in curve)
        # the uncapped point is the cap curve's: both knobs run uncapped at their top
        out.append(Option(knob, P, event.duration_s * (job.t_max - T)))
    pause_ok = event.duration_s <= job.max_pause_s
    out.append(
        Option(
            "pause",
            np.array([job.idle_w]),
            np.array([event.duration_s * job.t_max]),
            pause_ok,
            ""
            if pause_ok
            else f"event {event.duration_s:g} s longer than max_pause_s {job.max_pause_s:g}",
        )
    )
    lost = lost_work_s(job, event)
    out.append(
        Option(
            "requeue",
            np.array([job.requeue_residual_w]),
            np.array([job.t_max * (lost + job.restart_s + event.duration_s)]),
        )
    )
    return out


def candidates(job: Job, event: Event, knobs: Sequence[str]) -> list[Option]:
    """The options a job may take when only ``knobs`` are allowed: those available, and
    running uncapped (``none``) when no curve knob is among them (a curve knob's top is it)."""
    picks = [o for o in options(job, event) if o.knob in knobs and o.available]
    if not set(knobs) & set(CURVE_KNOBS):
        picks.append(Option("none", np.array([job.ceiling_w]), np.array([0.0])))
    return picks


def menu(jobs: Sequence[Job], event: Event) -> pd.DataFrame:
    """One row per (job, knob): most kW it sheds, tokens lost at that depth and the price
    (tokens per kWh shed; for curve knobs at their floor)."""
    rows = []
    for job in jobs:
        for o in options(job, event):
            saved = job.ceiling_w - float(o.power_w[0])
            lost = float(o.tokens_lost[0])
            kwh = saved / 1e3 * event.duration_s / 3600.0
            rows.append(
                {
                    "job": job.name,
                    "knob": o.knob,
                    "available": o.available,
                    "max_shed_kw": saved / 1e3,
                    "tokens_lost_at_max": lost,
                    "tokens_per_kwh": lost / kwh if kwh > 0 else np.inf,
                    "why_not": o.why_not,
                }
            )
    return pd.DataFrame(rows)


@dataclass
class Choice:
    """The cheapest mix: per job its knob, power and tokens lost; totals. ``levels``: with a
    site's levels, each one's ``kind``, ``limit_w`` and ``load_w`` (the mix's power under it)."""

    feasible: bool
    budget_w: float
    table: pd.DataFrame = field(
        default_factory=pd.DataFrame
    )  # job, knob, power_w, shed_kw, tokens_lost, clock_mhz, why
    tokens_lost: float = float("nan")
    power_w: float = float("nan")
    reason: str = ""
    levels: dict[str, dict[str, Any]] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return self.table["knob"].value_counts().to_dict() if len(self.table) else {}


def choose(
    jobs: Sequence[Job],
    event: Event,
    knobs: Sequence[str] = KNOBS,
    time_limit_s: float = 60.0,
    levels: Laminar | None = None,
) -> Choice:
    """The exact cheapest mix of ``knobs`` meeting ``event`` and, with ``levels`` (a laminar
    family over ``jobs``), every level's limit (module docstring)."""
    unknown = set(knobs) - set(KNOBS)
    if unknown:
        raise ValueError(f"unknown knob(s) {sorted(unknown)}; choose from {', '.join(KNOBS)}")
    if levels is not None and levels.n != len(jobs):
        raise ValueError(f"levels hold {levels.n} item(s), not the {len(jobs)} job(s)")
    site_w = sum(j.ceiling_w for j in jobs)
    budget = site_w - float(event.depth_w)
    m = _Model()
    var, row = m.var, m.row
    power_terms: list[list[tuple[int, float]]] = []  # per job: its power, base + filled segments
    menus = [options(j, event) for j in jobs]
    layout = []  # per job: [(option, u, [(delta, segment)])]
    for job, opts in zip(jobs, menus):
        picks, terms = [], []
        for o in candidates(job, event, knobs):
            P, L = o.power_w, o.tokens_lost
            u = var(float(L[0]), 1.0, True)
            terms.append((u, float(P[0])))
            deltas = []
            segs = [s for s in range(len(P) - 1) if P[s + 1] > P[s]]
            for s in segs:  # filled fraction of segment s (its tokens lost change: L[s+1] - L[s])
                d = var(float(L[s + 1] - L[s]), 1.0, False)
                row([(d, 1.0), (u, -1.0)], -np.inf, 0.0)
                terms.append((d, float(P[s + 1] - P[s])))
                deltas.append((d, s))
            T = -L  # throughput up to a constant: concave T fills its segments in order
            concave = np.all(T >= concave_hull(P, T) - RTOL * (np.abs(T).max() + 1.0))
            if not concave:
                for (below, _), (above, _) in zip(deltas[:-1], deltas[1:]):
                    y = var(0.0, 1.0, True)
                    row([(above, 1.0), (y, -1.0)], -np.inf, 0.0)
                    row([(y, 1.0), (below, -1.0)], -np.inf, 0.0)
            picks.append((o, u, deltas))
        if not picks:
            return Choice(
                False, budget, reason=f"job {job.name!r} has none of the knobs {list(knobs)}"
            )
        row([(u, 1.0) for _, u, _ in picks], 1.0, 1.0)
        layout.append(picks)
        power_terms.append(terms)
    row([t for terms in power_terms for t in terms], -np.inf, budget)
    if levels is not None:
        for held, limit in zip(levels.members(), np.asarray(levels.limit_w, float)):
            if np.isfinite(limit):
                row([t for i in np.flatnonzero(held) for t in power_terms[i]], -np.inf, limit)
    res = m.solve(time_limit_s)
    if res.status == 2:  # infeasible
        lowest = np.array([min(float(o.power_w[0]) for o, _, _ in picks) for picks in layout])
        return Choice(False, budget, reason=_infeasible(knobs, lowest, budget, site_w, levels))
    if res.x is None or res.status not in (0, 1):
        raise RuntimeError(f"knob MILP failed: {res.message}")
    x = res.x
    rows = []
    for job, opts, picks in zip(jobs, menus, layout):
        o, u, deltas = max(picks, key=lambda p: x[p[1]])
        P, L = o.power_w, o.tokens_lost
        p = float(P[0]) + sum(np.clip(x[d], 0, 1) * (P[s + 1] - P[s]) for d, s in deltas)
        lost = float(interp(P, L, np.asarray(p))) if len(P) > 1 else float(L[0])
        knob = (
            "none"
            if o.knob in CURVE_KNOBS and p >= job.ceiling_w - RTOL * job.ceiling_w
            else o.knob
        )
        rows.append(
            {
                "job": job.name,
                "knob": knob,
                "power_w": p,
                "shed_kw": (job.ceiling_w - p) / 1e3,
                "tokens_lost": lost,
                "clock_mhz": clock_at(job, p) if knob == "clock" else float("nan"),
                "why": _why(job, o.knob, opts, event, knobs),
            }
        )
    table = pd.DataFrame(rows)
    return Choice(
        True,
        budget,
        table,
        float(table["tokens_lost"].sum()),
        float(table["power_w"].sum()),
        levels=levels.report(table["power_w"].to_numpy()) if levels is not None else {},
    )


def _infeasible(
    knobs: Sequence[str],
    lowest_w: np.ndarray,
    budget: float,
    site_w: float,
    levels: Laminar | None,
) -> str:
    """Why no mix fits, in one line: the budget, or the first level whose jobs' lowest powers
    sum over its limit (every row is at its least with each job at its lowest power, so one
    of them is over there)."""
    lowest = float(lowest_w.sum())
    over = levels.violations(lowest_w) if levels is not None else []
    if lowest > budget * (1 + RTOL) + RTOL or not over:
        return (
            f"infeasible with {'+'.join(knobs)}: the lowest power they reach is "
            f"{lowest / 1e3:.1f} kW, the event asks for {budget / 1e3:.1f} kW "
            f"(deepest cut {(site_w - lowest) / site_w:.1%} of {site_w / 1e3:.1f} kW)"
        )
    name, load, limit = over[0]
    more = f"; {len(over) - 1} more level(s) over too" if len(over) > 1 else ""
    return (
        f"infeasible with {'+'.join(knobs)}: the lowest power the jobs under {name} reach is "
        f"{load / 1e3:.3f} kW, over its limit {limit / 1e3:.3f} kW{more}"
    )


class _Model:
    """A MILP in the making: variables (cost, upper bound, integer?) and sparse rows."""

    def __init__(self) -> None:
        self.cols: list[tuple[float, float, int]] = []
        self.cells: list[tuple[int, int, float]] = []
        self.bounds: list[tuple[float, float]] = []

    def var(self, c: float, ub: float, is_int: bool) -> int:
        self.cols.append((c, ub, int(is_int)))
        return len(self.cols) - 1

    def row(self, terms: list[tuple[int, float]], lo: float, hi: float) -> None:
        self.cells += [(len(self.bounds), v, a) for v, a in terms]
        self.bounds.append((lo, hi))

    def solve(self, time_limit_s: float) -> Any:
        cost, upper, integer = (np.asarray(v) for v in zip(*self.cols))
        r, c, a = zip(*self.cells)
        lo, hi = zip(*self.bounds)
        A = coo_matrix((a, (r, c)), shape=(len(self.bounds), len(self.cols))).tocsr()
        return milp(
            cost,
            constraints=LinearConstraint(A, lo, hi),
            integrality=integer,
            bounds=Bounds(0.0, upper),
            options={"mip_rel_gap": 1e-9, "time_limit": time_limit_s},
        )


def _why(job: Job, taken: str, opts: list[Option], event: Event, knobs: Sequence[str]) -> str:
    """One line: the taken knob's price beside the others' (tokens per kWh at their most kW)."""
    hours = event.duration_s / 3600.0
    parts = []
    for o in opts:
        saved_kw = (job.ceiling_w - float(o.power_w[0])) / 1e3
        if o.knob not in knobs:
            continue
        if not o.available:
            parts.append(f"{o.knob} unavailable ({o.why_not})")
            continue
        price = (
            float(o.tokens_lost[0]) / (saved_kw * hours)
            if saved_kw > 0 and hours > 0
            else float("inf")
        )
        mark = "*" if o.knob == taken else ""
        parts.append(f"{mark}{o.knob} {price:,.0f} tok/kWh up to {saved_kw:.2f} kW")
    return "; ".join(parts)


# the jobs table of :func:`jobs_from_runs`: the columns it needs, and the optional ones with
# what they mean when absent
JOB_TABLE_NEEDS = ("job", "group", "since_checkpoint_s")
JOB_TABLE_OPTIONAL = {
    "gpus": "the group's GPUs in the runs",
    "clock_group": "no clock curve",
    "restart_s": "the resource plan's startup_s of the group",
    "checkpoint_write_s": "the resource plan's checkpoint_write_s of the group",
    "max_pause_s": "no limit",
    "requeue_residual_w": "0",
    "idle_w": "its GPUs x the GPU model's idle power",
}


def _per_gpu_points(runs: pd.DataFrame, rows: pd.Series, by: str) -> dict[str, tuple]:
    """Each group's per-GPU (power, tokens/s, setpoint) points, sorted by power, repeats averaged."""
    pts = (
        runs[rows]
        .groupby(["group", by], sort=True, as_index=False)[["gpus", "power_w", "tokens_per_s"]]
        .mean()
    )
    out = {}
    for g, p in pts.groupby("group", sort=False):
        p = p.assign(pw=p["power_w"] / p["gpus"], tw=p["tokens_per_s"] / p["gpus"])
        p = p.sort_values("pw").drop_duplicates("pw")
        out[str(g)] = (
            p["pw"].to_numpy(),
            p["tw"].to_numpy(),
            p[by].to_numpy(float),
            p["gpus"].iloc[0],
        )
    return out


def jobs_from_runs(
    runs: pd.DataFrame,
    jobs: pd.DataFrame,
    idle_w_per_gpu: float,
    plan: pd.DataFrame | None = None,
) -> list[Job]:
    """The menu's jobs from a campaign's ``runs`` (``runs.parquet``: ``group, gpus, cap_w,
    power_w, tokens_per_s``, and ``knob, clock_mhz`` for ``knob: clock`` groups) and a table
    of the jobs running (one row each: :data:`JOB_TABLE_NEEDS`, :data:`JOB_TABLE_OPTIONAL`).
    A job's curves are its groups' per-GPU curves times its GPUs; ``plan``
    (``tables/resource_plan.csv``: ``group, startup_s, checkpoint_write_s``) fills the
    restart and checkpoint times a job's row leaves out. A bad row is refused naming its job."""
    need = {"group", "gpus", "cap_w", "power_w", "tokens_per_s"} - set(runs.columns)
    if need:
        raise ValueError(f"runs need column(s) {', '.join(sorted(need))} (a runs.parquet)")
    missing = sorted(set(JOB_TABLE_NEEDS) - set(jobs.columns))
    if missing:
        raise ValueError(f"jobs table needs column(s) {', '.join(missing)}")
    twice = jobs["job"].astype(str)[jobs["job"].astype(str).duplicated()]
    if len(twice):
        raise ValueError(f"jobs table names job {twice.iloc[0]} twice")
    runs = runs.assign(group=runs["group"].astype(str))
    clock = runs["knob"].eq("clock") if "knob" in runs else pd.Series(False, index=runs.index)
    caps = _per_gpu_points(runs, ~clock, "cap_w")
    clocks = _per_gpu_points(runs, clock, "clock_mhz") if clock.any() else {}
    by_plan = (
        plan.assign(group=plan["group"].astype(str)).set_index("group")
        if plan is not None
        else None
    )
    out = []
    for row in jobs.to_dict("records"):
        name = str(row["job"])

        def value(col: str, default: float | None = None) -> float:
            v = row.get(col)
            if v is None or (isinstance(v, float) and np.isnan(v)):
                if default is None:
                    raise ValueError(
                        f"job {name}: no {col} ({JOB_TABLE_OPTIONAL.get(col, 'needed')})"
                    )
                return float(default)
            try:
                x = float(v)
            except (TypeError, ValueError):
                x = float("nan")
            unlimited = col == "max_pause_s" and x == np.inf
            if not (np.isfinite(x) or unlimited) or x < 0:
                raise ValueError(f"job {name}: {col} {v!r} is not a finite number >= 0")
            return x

        group = str(row["group"])
        if group not in caps:
            raise ValueError(f"job {name}: group {group!r} has no cap curve in the runs")
        P, T, _, group_gpus = caps[group]
        if len(P) < 2:
            raise ValueError(f"job {name}: group {group!r} has one measured power, no curve")
        gpus = value("gpus", group_gpus)
        planned = by_plan.loc[group] if by_plan is not None and group in by_plan.index else {}
        clock_curve, clock_mhz = None, None
        cg = row.get("clock_group")
        if isinstance(cg, str) and cg.strip():
            if cg not in clocks:
                raise ValueError(f"job {name}: clock_group {cg!r} has no clock curve in the runs")
            cP, cT, cF, _ = clocks[cg]
            clock_curve, clock_mhz = (cP * gpus, cT * gpus), cF
        out.append(
            Job(
                name,
                (P * gpus, T * gpus),
                idle_w=value("idle_w", gpus * idle_w_per_gpu),
                restart_s=value("restart_s", planned.get("startup_s")),
                checkpoint_write_s=value("checkpoint_write_s", planned.get("checkpoint_write_s")),
                since_checkpoint_s=value("since_checkpoint_s"),
                clock=clock_curve,
                max_pause_s=value("max_pause_s", float("inf")),
                requeue_residual_w=value("requeue_residual_w", 0.0),
                clock_mhz=clock_mhz,
            )
        )
    if not out:
        raise ValueError("jobs table has no job")
    return out
