"""The site's flexibility statement: how much it can shed, how fast, for how long, how often,
and at what cost in training, with the evidence behind each number.

A grid operator that grants a flexible connection asks these questions of a large load. The
answers come from the campaign's measured curves (one per sweep group) and its simulated or
real events:

- **Depth.** A site of ``jobs_per_workload`` jobs, drawn from the groups as the allocation
  study draws them (``mix``), is cut to ``(1 - depth)`` of its uncapped power; the oracle
  splits the cut across the jobs' caps. Caps stop at each job's floor (its lowest measured
  power), so past ``1 - sum(floor) / sum(uncapped)`` caps alone cannot meet the depth.
- **Uncertainty.** Each of ``n_draws`` draws takes a new job mix and a new measurement of
  every group's curve: each point's tokens/s and power shifted by its standard error
  (``tokens_per_s_sem``, ``power_w_sem``; the same errors behind the PFI's CIs), then made
  monotone again. Every figure is the median with the 5th-95th percentile range.
- **Duration and frequency.** A cap is held for as long as an event lasts, so tokens lost
  grow linearly with its hours; a calendar of curtailment rates (share of a year's hours)
  gives events and tokens per year.
- **Speed.** Response time, ramp rate and restore time come from the M&V of the events the
  campaign controlled (``wattflex.ops.services.mv``); an event whose notice is shorter than the
  response time is short of its target for the difference.
- **Baselines.** :mod:`wattflex.ops.baselines` applied to a simulated meter history of the
  site (the control study's job stream, uncapped), against the true counterfactual load.

Everything is pure: the rule script and ``wattflex offer --statement`` read and write files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from wattflex.allocation.allocator import allocate
from wattflex.allocation.curves import Curves, curves_from_points, monotone_fit
from wattflex.allocation.knobs import Event, Job, choose, clock_on_cap
from wattflex.allocation.simulate import mix_unavailable, sample_workloads
from wattflex.gpus import GPUS
from wattflex.labels import backend_label
from wattflex.ops.baselines import (
    DAY_S,
    BaselineRule,
    average_days,
    pre_event,
    same_day_adjusted,
    window_mean,
)
from wattflex.ops.clustersim import draw_schedule
from wattflex.policies import optimum
from wattflex.provenance import csv_files, document_files, strict_json
from wattflex.run_ids import cap_rows
from wattflex.schema import section_defaults
from wattflex.vocabulary import SAME_JOB_COLUMNS

HOURS_PER_YEAR = 8760.0
QUANTILES = (0.05, 0.5, 0.95)
_S = section_defaults("statement")


def _floats(key: str) -> tuple[float, ...]:
    return tuple(float(x) for x in _S[key])


@dataclass(frozen=True)
class StatementSettings:
    """What the statement covers (config ``statement:``; defaults: the schema's, where the
    curtailment calendar's source is named) and the site it is for: the allocation study's
    workload (``jobs_per_workload``, ``mix``, ``pretraining_fraction``, ``seed``; no default)."""

    jobs_per_workload: int
    mix: str
    pretraining_fraction: float
    seed: int
    depths: tuple[float, ...] = _floats("depths")
    headline_depth: float = _S["headline_depth"]
    durations_h: tuple[float, ...] = _floats("durations_h")
    notices_s: tuple[float, ...] = _floats("notices_s")
    curtailment_rates: tuple[float, ...] = _floats("curtailment_rates")
    event_hours: float = _S["event_hours"]
    n_draws: int = _S["n_draws"]
    response_policy: str = _S["response_policy"]
    history_days: int = _S["history_days"]
    deep_depths: tuple[float, ...] = _floats("deep_depths")
    deep_notice_s: float = _S["deep_notice_s"]
    event_start_h: float = _S["event_start_h"]
    baseline: BaselineRule = field(default_factory=BaselineRule)

    def __post_init__(self) -> None:
        if not self.depths or any(not 0 < d < 1 for d in self.depths):
            raise ValueError("statement.depths: fractions of site power in (0, 1)")
        if any(h <= 0 for h in self.durations_h) or self.event_hours <= 0 or self.event_hours > 24:
            raise ValueError(
                "statement: durations and event hours must be > 0 (event hours at most 24)"
            )
        if any(not 0 < r < 1 for r in self.curtailment_rates):
            raise ValueError("statement.curtailment_rates: shares of a year in (0, 1)")
        if self.n_draws < 1 or self.jobs_per_workload < 1:
            raise ValueError("statement: n_draws and jobs_per_workload must be >= 1")
        if self.history_days < self.baseline.days + 1:
            raise ValueError(
                f"statement.history_days must exceed the baseline's {self.baseline.days} days"
            )
        if not 0 <= self.event_start_h < 24 or self.event_start_h + self.event_hours > 24:
            raise ValueError("statement.event_start_h: the event must end within its day")

    @classmethod
    def from_config(
        cls, statement: Mapping[str, Any] | None, allocation: Mapping[str, Any]
    ) -> StatementSettings:
        """From the ``statement:`` and ``allocation:`` config sections (as a loaded config has them)."""
        cfg = dict(statement or {})
        rule = BaselineRule(**dict(cfg.pop("baseline", {}) or {}))
        tuples = {
            k: tuple(float(x) for x in v) for k, v in cfg.items() if isinstance(v, (list, tuple))
        }
        site = {
            "jobs_per_workload": int(allocation["jobs_per_workload"]),
            "mix": str(allocation["headline"]["mix"]),
            "pretraining_fraction": float(allocation["production"]["pretraining_fraction"]),
            "seed": int(allocation["seed"]),
        }
        return cls(**{**site, **cfg, **tuples, "baseline": rule})


@dataclass(frozen=True)
class Groups:
    """The campaign's cap groups as the statement uses them: curves and their errors, and the
    clock curve of the ``knob: clock`` group that ran the same job, where one did."""

    names: list[str]
    curves: Curves  # (G, K): job power (W) -> tokens/s
    tokens_sem: np.ndarray  # (G, K)
    power_sem: np.ndarray  # (G, K)
    table: pd.DataFrame  # one row per group: gpus, task, gpu
    # per group: (power_w, tokens_per_s) at each locked clock on the cap curve's top
    # (knobs.clock_on_cap), and the clock group(s) it came from; None: no clock sweep of the job
    clocks: list[tuple[np.ndarray, np.ndarray] | None] = field(default_factory=list)
    clock_groups: list[str] = field(default_factory=list)


def clock_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows of a runs table that are ``knob: clock`` groups' (the complement of
    :func:`wattflex.run_ids.cap_rows`)."""
    return runs[runs["knob"].eq("clock")] if "knob" in runs.columns else runs.iloc[:0]


def paired_clocks(
    cap_runs: pd.DataFrame, names: Sequence[str], curves: Curves, clocks: pd.DataFrame
) -> tuple[list[tuple[np.ndarray, np.ndarray] | None], list[str]]:
    """Per cap group ``names[g]``: the clock curve of the clock group(s) that ran its job (the
    same :data:`wattflex.vocabulary.SAME_JOB_COLUMNS` both tables have), each locked clock's
    runs averaged, put on the cap curve's uncapped point (:func:`knobs.clock_on_cap`); and
    which clock groups it came from ('' where none)."""
    if clocks.empty:
        return [None] * len(names), [""] * len(names)
    need = {"group", "clock_mhz", "power_w", "tokens_per_s"} - set(clocks.columns)
    if need:
        raise ValueError(f"runs table's clock rows lack column(s) {', '.join(sorted(need))}")
    cols = [c for c in SAME_JOB_COLUMNS if c in cap_runs.columns and c in clocks.columns]

    def job_of(df: pd.DataFrame) -> pd.Series:
        return df[cols].astype(str).agg("|".join, axis=1)

    cap_job = cap_runs.assign(_job=job_of(cap_runs)).groupby("group")["_job"].first()
    clk = clocks.assign(_job=job_of(clocks))
    out, sources = [], []
    for g, name in enumerate(names):
        mine = clk[clk["_job"] == cap_job[name]]
        if mine.empty:
            out.append(None)
            sources.append("")
            continue
        pts = mine.groupby("clock_mhz")[["power_w", "tokens_per_s"]].mean().sort_values("power_w")
        cap = (curves.power_w[g], curves.throughput[g])
        out.append(clock_on_cap(cap, (pts["power_w"].to_numpy(), pts["tokens_per_s"].to_numpy())))
        sources.append(",".join(sorted(map(str, mine["group"].unique()))))
    return out, sources


def groups_from_runs(runs: pd.DataFrame) -> Groups:
    """One curve per cap group of ``runs.parquet`` (repeats averaged, their SEMs combined), and
    the clock curve of its job where a ``knob: clock`` group measured one
    (:func:`paired_clocks`)."""
    need = {"group", "cap_w", "power_w", "tokens_per_s", "gpus", "task"}
    missing = sorted(need - set(runs.columns))
    if missing:
        raise ValueError(f"runs table lacks column(s) {', '.join(missing)}")
    clocks = clock_runs(runs)
    df = cap_rows(runs).copy()
    for col in ("tokens_per_s_sem", "power_w_sem"):
        df[col] = pd.to_numeric(df[col], errors="coerce").fillna(0.0) if col in df else 0.0
    df["_t2"], df["_p2"] = df["tokens_per_s_sem"] ** 2, df["power_w_sem"] ** 2
    pts = df.groupby(["group", "cap_w"], sort=True, as_index=False).agg(
        power_w=("power_w", "mean"),
        tokens_per_s=("tokens_per_s", "mean"),
        t2=("_t2", "mean"),
        p2=("_p2", "mean"),
        n=("power_w", "size"),
    )
    t_sem, p_sem = np.sqrt(pts["t2"] / pts["n"]), np.sqrt(pts["p2"] / pts["n"])
    names, curves = curves_from_points(
        pts["group"], pts["power_w"], pts["tokens_per_s"], pts["cap_w"]
    )
    _, t_err = curves_from_points(pts["group"], pts["power_w"], t_sem)
    _, p_err = curves_from_points(pts["group"], pts["power_w"], p_sem)
    cols = [c for c in ("gpus", "task", "gpu") if c in df]
    table = df.groupby("group", sort=False)[cols].first().loc[names].reset_index()
    clock, sources = paired_clocks(df, list(names), curves, clocks)
    return Groups(
        list(map(str, names)), curves, t_err.throughput, p_err.throughput, table, clock, sources
    )


def measured_again(groups: Groups, rng: np.random.Generator, n: int) -> Curves:
    """``n`` re-measurements of every group's curve, (n, G, K): each point shifted by its
    standard errors, tokens/s made non-decreasing in power again (isotonic fit)."""
    P = (
        groups.curves.power_w[None]
        + rng.standard_normal((n, *groups.curves.power_w.shape)) * groups.power_sem
    )
    T = (
        groups.curves.throughput[None]
        + rng.standard_normal((n, *groups.curves.throughput.shape)) * groups.tokens_sem
    )
    P = np.maximum.accumulate(np.maximum(P, 0.0), axis=-1)  # powers stay in cap order
    G, K = groups.curves.power_w.shape
    fit, _ = monotone_fit(Curves(P.reshape(n * G, K), np.maximum(T, 0.0).reshape(n * G, K)))
    return Curves(fit.power_w.reshape(n, G, K), fit.throughput.reshape(n, G, K))


def _quantiles(x: np.ndarray, name: str) -> dict[str, float]:
    """``name`` p5 / median / p95 over draws (NaN draws left out; all NaN: NaN)."""
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    q = np.quantile(x, QUANTILES) if len(x) else [math.nan] * 3
    return {f"{name}_p5": float(q[0]), f"{name}": float(q[1]), f"{name}_p95": float(q[2])}


def shed_by_depth(groups: Groups, s: StatementSettings) -> pd.DataFrame:
    """Per depth: kW shed, whether caps alone reach it, tokens/s and share of throughput lost
    (median and 5-95 % over draws of the job mix and of the curves)."""
    rng = np.random.default_rng(s.seed)
    index = sample_workloads(
        groups.table, s.mix, s.n_draws, s.jobs_per_workload, rng, s.pretraining_fraction
    )
    again = measured_again(groups, rng, s.n_draws)
    draw = np.arange(s.n_draws)[:, None]
    site = Curves(again.power_w[draw, index], again.throughput[draw, index])  # (B, N, K)
    p_max, t_max = site.ceiling_w.sum(-1), site.uncapped_throughput.sum(-1)
    floor_depth = 1.0 - site.floor_w.sum(-1) / p_max
    rows = []
    for depth in s.depths:
        alloc = allocate(site, (1.0 - depth) * p_max, optimum())
        ok = alloc.feasible
        lost = np.where(ok, t_max - alloc.total_throughput, np.nan)
        rows.append(
            {
                "depth": depth,
                **_quantiles(p_max / 1e3, "site_kw"),
                **_quantiles(depth * p_max / 1e3, "shed_kw"),
                "caps_feasible_share": float(ok.mean()),
                **_quantiles(lost * 3600.0, "tokens_lost_per_h"),
                **_quantiles(lost / t_max, "throughput_loss"),
                **_quantiles(floor_depth, "caps_max_depth"),
            }
        )
    return pd.DataFrame(rows)


def events_table(shed: pd.DataFrame, s: StatementSettings) -> pd.DataFrame:
    """Per depth and event duration: kWh shed and tokens lost per event (caps held throughout)."""
    rows = []
    for _, r in shed.iterrows():
        for h in s.durations_h:
            rows.append(
                {
                    "depth": r["depth"],
                    "hours": h,
                    "shed_kw": r["shed_kw"],
                    "energy_kwh": r["shed_kw"] * h,
                    "caps_feasible_share": r["caps_feasible_share"],
                    **{
                        f"tokens_lost{q}": r[f"tokens_lost_per_h{q}"] * h
                        for q in ("_p5", "", "_p95")
                    },
                }
            )
    return pd.DataFrame(rows)


def calendar_table(shed: pd.DataFrame, s: StatementSettings) -> pd.DataFrame:
    """Per curtailment rate, at every depth: events and hours a year, tokens lost a year and
    their share of the year's tokens."""
    rows = []
    for rate in s.curtailment_rates:
        hours = rate * HOURS_PER_YEAR
        for _, r in shed.iterrows():
            rows.append(
                {
                    "curtailment_rate": rate,
                    "hours_per_year": hours,
                    "events_per_year": hours / s.event_hours,
                    "event_hours": s.event_hours,
                    "depth": r["depth"],
                    "energy_mwh_per_year": r["shed_kw"] * hours / 1e3,
                    "caps_feasible_share": r["caps_feasible_share"],
                    **{
                        f"tokens_lost_per_year{q}": r[f"tokens_lost_per_h{q}"] * hours
                        for q in ("_p5", "", "_p95")
                    },
                    "share_of_year_tokens": rate * r["throughput_loss"],
                }
            )
    return pd.DataFrame(rows)


def response_table(mv: pd.DataFrame | None, policy: str | None = None) -> pd.DataFrame:
    """Response time, ramp rates and restore time of the campaign's controlled events (M&V
    records, one per event and policy: :func:`wattflex.ops.services.mv.read_mv_records`), per
    policy and source (``simulated`` or ``real``): median and worst. ``policy`` keeps the
    simulated rows of that policy; a real run's rows are kept whatever policy it ran."""
    cols = [
        "policy",
        "source",
        "events",
        "response_time_s",
        "response_time_s_max",
        "ramp_down_kw_per_s",
        "ramp_up_kw_per_s",
        "restore_time_s",
        "restore_time_s_max",
        "deadline_met_share",
        "sample_s",
    ]
    if mv is None or mv.empty:
        return pd.DataFrame(columns=cols)
    df = mv if "policy" in mv else mv.assign(policy="controller")
    df = df if "source" in df else df.assign(source="simulated")
    if policy is not None:
        df = df[(df["policy"] == policy) | df["source"].eq("real")]
    rows = []
    for (name, source), g in df.groupby(["policy", "source"], sort=True):
        resp = pd.to_numeric(g["response_time_s"], errors="coerce")
        rest = pd.to_numeric(g["restore_time_s"], errors="coerce")
        rows.append(
            {
                "policy": name,
                "source": source,
                "events": len(g),
                "response_time_s": resp.median(),
                "response_time_s_max": resp.max(),
                "ramp_down_kw_per_s": pd.to_numeric(g["max_ramp_down_w_per_s"]).median() / 1e3,
                "ramp_up_kw_per_s": pd.to_numeric(g["max_ramp_up_w_per_s"]).median() / 1e3,
                "restore_time_s": rest.median(),
                "restore_time_s_max": rest.max(),
                "deadline_met_share": float(g["deadline_met"].astype(bool).mean()),
                "sample_s": float(pd.to_numeric(g["sample_s"]).max())
                if "sample_s" in g
                else math.nan,
            }
        )
    return pd.DataFrame(rows, columns=cols)


def notice_table(response: pd.DataFrame, s: StatementSettings) -> pd.DataFrame:
    """Per notice: whether the target is met from the event's start (notice >= the worst
    response time measured), and for how long it is short otherwise."""
    worst = float(response["response_time_s_max"].max()) if len(response) else math.nan
    rows = [
        {
            "notice_s": n,
            "worst_response_time_s": worst,
            "met_from_start": bool(math.isfinite(worst) and n >= worst),
            "short_for_s": max(worst - n, 0.0) if math.isfinite(worst) else math.nan,
        }
        for n in s.notices_s
    ]
    return pd.DataFrame(rows)


# ---- the meter history and its baselines --------------------------------------------------------
def site_history(
    groups: Groups,
    p_max_w: np.ndarray,
    cluster: Any,
    s: StatementSettings,
    idle_w_per_gpu: float,
    rng: np.random.Generator,
    period_s: float = 60.0,
) -> tuple[np.ndarray, np.ndarray]:
    """A meter history of the site, uncapped: ``(t_s, load_w)`` every ``period_s`` over
    ``history_days``. Jobs arrive and run as the control study's job stream
    (``wattflex.ops.clustersim.draw_schedule``, ``cluster``: its ``ClusterConfig``); a job
    draws its group's uncapped power ``p_max_w`` while it trains and idle power during its
    start-up and checkpoints; free GPUs idle. ``p_max_w`` (G,) or (R, G): R sets of group
    powers on the one job stream give R histories, (R, len(t_s))."""

    horizon = s.history_days * DAY_S
    sched = draw_schedule(groups.table, cluster, horizon, period_s, rng)
    powers = np.atleast_2d(np.asarray(p_max_w, float))
    t = np.arange(0.0, horizon, period_s)
    load = np.full((len(powers), len(t)), cluster.gpus * idle_w_per_gpu)
    for job in sched.itertuples():
        lo, hi = np.searchsorted(t, [max(job.start_s, 0.0), min(job.end_s, horizon)])
        if hi <= lo:
            continue
        since = t[lo:hi] - job.start_s - cluster.startup_s
        pause = (since < 0) | (
            (since >= cluster.checkpoint_every_s)
            & (np.mod(since, cluster.checkpoint_every_s) < cluster.checkpoint_s)
        )
        load[:, lo:hi] += np.where(
            pause, 0.0, (powers[:, job.group] - job.gpus * idle_w_per_gpu)[:, None]
        )
    return t, (load[0] if np.ndim(p_max_w) == 1 else load)


def baseline_errors(
    t_s: np.ndarray, true_w: np.ndarray, curves_w: np.ndarray, s: StatementSettings
) -> pd.DataFrame:
    """One row per simulated event day: the true (uncapped) load of the event window and each
    baseline's error against it, in % (positive: the baseline credits more than was shed)."""
    rule, rows = s.baseline, []
    for day in range(rule.days, s.history_days):
        start = day * DAY_S + 3600.0 * s.event_start_h
        end = start + 3600.0 * s.event_hours
        true = window_mean(t_s, true_w, start, end)
        est = {
            "curves": window_mean(t_s, curves_w, start, end),
            f"{rule.days}_of_{rule.days}": average_days(t_s, true_w, start, end, set(), rule),
            f"{rule.days}_of_{rule.days}_same_day": same_day_adjusted(
                t_s, true_w, start, end, set(), rule
            ),
            "pre_event": pre_event(t_s, true_w, start, rule),
        }
        rows.append(
            {
                "day": day,
                "true_kw": true / 1e3,
                **{f"{k}_error_pct": 100.0 * (v - true) / true for k, v in est.items()},
            }
        )
    return pd.DataFrame(rows)


def baseline_summary(
    errors: pd.DataFrame, shed: pd.DataFrame, s: StatementSettings
) -> pd.DataFrame:
    """Per baseline method: bias, mean absolute and 90th-percentile absolute error (% of the
    load), and the worst error as a share of the kW shed at the headline depth."""
    methods = [c[: -len("_error_pct")] for c in errors.columns if c.endswith("_error_pct")]
    head = headline(shed, s)
    rows = []
    for m in methods:
        e = errors[f"{m}_error_pct"].to_numpy(float)
        rows.append(
            {
                "method": m,
                "event_days": int(np.isfinite(e).sum()),
                "bias_pct": float(np.nanmean(e)),
                "mean_abs_error_pct": float(np.nanmean(np.abs(e))),
                "p90_abs_error_pct": float(np.nanquantile(np.abs(e), 0.9)),
                "headline_depth": float(head["depth"]),
                "p90_error_share_of_shed": float(
                    np.nanquantile(np.abs(e), 0.9) / 100.0 / head["depth"]
                ),
            }
        )
    return pd.DataFrame(rows)


def curve_powers(groups: Groups, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Each group's uncapped job power, true and as a site would know it from its curve (one
    re-measurement: the power's standard error)."""
    true = groups.curves.ceiling_w
    return true, true + rng.standard_normal(true.shape) * groups.power_sem[:, -1]


# ---- the statement as OpenADR 3 objects ------------------------------------------------------
def openadr3_objects(
    shed: pd.DataFrame, response: pd.DataFrame, s: StatementSettings, campaign: str, backend: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The statement as an OpenADR 3.0.1 program (what the site enrols in: a capacity limit in
    kW) and report (``DOWN_REGULATION_AVAILABLE`` per event duration: the kW caps alone shed in
    95 % of draws; ``BASELINE``: the site's uncapped kW), as JSON objects in the specification's
    field names. Built as plain dicts, so a run needs no OpenADR client; the tests validate both
    with ``toadr3``'s models of the specification."""
    sure = shed[shed["caps_feasible_share"] >= 0.95]
    kw = float(sure["shed_kw_p5"].max()) if len(sure) else 0.0
    site_kw = float(shed["site_kw"].median())
    name = f"wattflex-{campaign}"
    program = {
        "objectType": "PROGRAM",
        "programName": name,
        "programLongName": f"Flexibility of the {campaign} training site ({backend}): up to {kw:.0f} kW "
        "by power caps",
        "programType": "LOAD_CONTROL",
        "bindingEvents": True,
        "payloadDescriptors": [
            {
                "objectType": "EVENT_PAYLOAD_DESCRIPTOR",
                "payloadType": "IMPORT_CAPACITY_LIMIT",
                "units": "KW",
            }
        ],
    }
    resp = float(response["response_time_s_max"].max()) if len(response) else math.nan
    intervals = [
        {
            "id": k,
            "intervalPeriod": {
                "start": "2027-01-01T00:00:00Z",
                "duration": f"PT{round(3600 * h)}S",
            },
            "payloads": [
                {"type": "DOWN_REGULATION_AVAILABLE", "values": [round(kw, 3)]},
                {"type": "BASELINE", "values": [round(site_kw, 3)]},
            ],
        }
        for k, h in enumerate(s.durations_h)
    ]
    title = f"wattflex flexibility statement ({backend})"
    report = {
        "objectType": "REPORT",
        "programID": name,
        "eventID": "capability-statement",
        "clientName": campaign,
        "reportName": f"{title}; worst response time {resp:.0f} s"
        if math.isfinite(resp)
        else title,
        "payloadDescriptors": [
            {
                "objectType": "REPORT_PAYLOAD_DESCRIPTOR",
                "payloadType": "DOWN_REGULATION_AVAILABLE",
                "units": "KW",
                "confidence": 95,
            },
            {"objectType": "REPORT_PAYLOAD_DESCRIPTOR", "payloadType": "BASELINE", "units": "KW"},
        ],
        "resources": [{"resourceName": "site", "intervals": intervals}],
    }
    return program, report


def headline(shed: pd.DataFrame, s: StatementSettings) -> Mapping[str, Any]:
    """The row at the headline depth."""
    return shed.iloc[(shed["depth"] - s.headline_depth).abs().argmin()].to_dict()


def statement_lines(
    shed: pd.DataFrame,
    calendar: pd.DataFrame,
    response: pd.DataFrame,
    baselines: pd.DataFrame,
    s: StatementSettings,
    backend: str,
) -> list[str]:
    """The statement in sentences, for the page an operator hands over."""
    h = headline(shed, s)
    floor_p5, floor = (
        float(shed["caps_max_depth_p5"].iloc[0]),
        float(shed["caps_max_depth"].iloc[0]),
    )
    lines = [
        f"Numbers are {backend.upper()}: from the campaign's {backend} sweeps, "
        f"{s.n_draws} draws of a {s.jobs_per_workload}-job site ({s.mix} mix); "
        "ranges are the 5th-95th percentiles.",
        f"The site draws {h['site_kw']:.0f} kW uncapped ({h['site_kw_p5']:.0f}-{h['site_kw_p95']:.0f}).",
        f"Power caps alone shed up to {100 * floor_p5:.0f} % of it in 95 % of draws (median "
        f"{100 * floor:.0f} %: the jobs' floors); deeper cuts need jobs paused or requeued.",
        f"At {100 * h['depth']:.0f} % ({h['shed_kw']:.0f} kW) training loses "
        f"{100 * h['throughput_loss']:.1f} % of its throughput "
        f"({100 * h['throughput_loss_p5']:.1f}-{100 * h['throughput_loss_p95']:.1f} %), "
        f"{h['tokens_lost_per_h']:.3g} tokens an hour.",
    ]
    if len(response):
        r = (
            response.iloc[0]
            if len(response) == 1
            else response.sort_values("response_time_s_max").iloc[0]
        )
        resolution = (
            f"; M&V samples every {r['sample_s']:g} s" if math.isfinite(r["sample_s"]) else ""
        )
        lines.append(
            f"In {r['events']} {r['source']} controlled event(s) (policy {r['policy']}{resolution}) "
            "it reached its target "
            f"within {r['response_time_s_max']:g} s of the start, ramping down at up to "
            f"{r['ramp_down_kw_per_s']:.1f} kW/s, and was back within {r['restore_time_s_max']:g} s of the end."
        )
    at = calendar[np.isclose(calendar["depth"], h["depth"])]
    for _, c in at.iterrows():
        lines.append(
            f"At {100 * c['curtailment_rate']:g} % curtailment ({c['events_per_year']:.0f} events of "
            f"{c['event_hours']:g} h a year): {c['tokens_lost_per_year']:.3g} tokens a year, "
            f"{100 * c['share_of_year_tokens']:.3f} % of the year's training."
        )
    for _, b in baselines.iterrows():
        lines.append(
            f"Baseline {b['method']}: bias {b['bias_pct']:+.1f} %, 90 % of event days within "
            f"{b['p90_abs_error_pct']:.1f} % ({100 * b['p90_error_share_of_shed']:.0f} % of the shed at "
            f"{100 * b['headline_depth']:.0f} %)."
        )
    return lines


def knob_lines(knobs: pd.DataFrame) -> list[str]:
    """The deep events in sentences: what caps alone cannot do, and the chosen mix's cost."""
    if knobs.empty:
        return []
    out = []
    for depth, d in knobs.groupby("depth", sort=True):
        by = d.set_index("strategy")
        mix = by.loc["chosen mix"]
        only = by.loc["caps only"]
        caps = (
            f"caps alone lose {only['tokens_lost']:.3g} tokens"
            if only["feasible"]
            else "caps alone cannot"
        )
        if not mix["feasible"]:
            out.append(
                f"A {100 * depth:.0f} % cut ({mix['shed_kw']:.0f} kW): no mix reaches it ({mix['reason']})."
            )
            continue
        pause = by.loc["pause only"]
        alt = (
            f"; pausing alone {pause['tokens_lost']:.3g}"
            if pause["feasible"]
            else "; pausing alone cannot"
        )
        if "caps + clock" in by.index:
            clock = by.loc["caps + clock"]
            alt += (
                f"; caps and clock locks {clock['tokens_lost']:.3g}"
                if clock["feasible"]
                else "; caps and clock locks cannot"
            )
        out.append(
            f"A {100 * depth:.0f} % cut ({mix['shed_kw']:.0f} kW of one drawn site): {caps}; the "
            f"cheapest mix ({mix['knobs']}) loses {mix['tokens_lost']:.3g} tokens{alt}."
        )
    return out


def as_markdown(lines: Sequence[str], tables: Mapping[str, pd.DataFrame], title: str) -> str:
    """The handover page: the statement's sentences, then its tables."""
    out = [f"# {title}", ""] + [f"- {line}" for line in lines] + [""]
    for name, df in tables.items():
        out += [f"## {name}", "", df.to_markdown(index=False, floatfmt=".4g"), ""]
    return "\n".join(out)


KNOB_STRATEGIES = {
    "caps only": ("cap",),
    "pause only": ("pause",),
    "requeue only": ("requeue",),
    "caps + clock": ("cap", "clock"),  # only where some job has a clock curve
    "chosen mix": ("cap", "clock", "pause", "requeue"),
}


def knob_jobs(
    groups: Groups,
    index: np.ndarray,
    plan: pd.DataFrame,
    checkpoint_every_s: float,
    rng: np.random.Generator,
) -> list[Any]:
    """The jobs of one drawn site as the knob menu sees them: each group's measured cap curve
    and, where a ``knob: clock`` group ran its job, its clock curve (:func:`paired_clocks`),
    its GPUs' idle power, the resource plan's start-up and checkpoint write time, and the age
    of its last checkpoint drawn uniform in ``[0, checkpoint_every_s)`` (the control study's
    checkpoint interval)."""
    by_group = plan.set_index("group")
    jobs = []
    for k, g in enumerate(index):
        name, row = groups.names[g], groups.table.iloc[g]
        p = by_group.loc[name]
        gpu = GPUS[str(row.get("gpu_model", "H200"))]
        jobs.append(
            Job(
                f"{k:03d}:{name}",
                (groups.curves.power_w[g], groups.curves.throughput[g]),
                idle_w=float(row["gpus"]) * gpu.idle_w,
                restart_s=float(p["startup_s"]),
                checkpoint_write_s=float(p["checkpoint_write_s"]),
                since_checkpoint_s=float(rng.uniform(0.0, checkpoint_every_s)),
                clock=groups.clocks[g] if groups.clocks else None,
            )
        )
    return jobs


def deep_events(jobs: Sequence[Any], s: StatementSettings) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per deep depth and strategy (caps only, pause only, requeue only, caps + clock where a
    job has a clock curve, the chosen mix of every knob): tokens lost over an event of ``event_hours`` with ``deep_notice_s`` notice,
    or why it is infeasible; and the deepest feasible mix's per-job table (knob, kW, tokens,
    why)."""
    site_w = sum(j.ceiling_w for j in jobs)
    with_clock = any(j.clock is not None for j in jobs)
    strategies = {k: v for k, v in KNOB_STRATEGIES.items() if with_clock or k != "caps + clock"}
    rows, deepest = [], None
    for depth in s.deep_depths:
        event = Event(depth * site_w, 3600.0 * s.event_hours, s.deep_notice_s)
        for name, knobs in strategies.items():
            c = choose(jobs, event, knobs)
            rows.append(
                {
                    "depth": depth,
                    "shed_kw": depth * site_w / 1e3,
                    "strategy": name,
                    "feasible": c.feasible,
                    "tokens_lost": c.tokens_lost if c.feasible else math.nan,
                    "knobs": ", ".join(f"{k} {v}" for k, v in sorted(c.counts().items()))
                    if c.feasible
                    else "",
                    "reason": c.reason,
                }
            )
            if name == "chosen mix" and c.feasible:
                deepest = c.table.assign(depth=depth)
    return pd.DataFrame(rows), (
        deepest if deepest is not None else pd.DataFrame(columns=["job", "knob", "why"])
    )


@dataclass(frozen=True)
class Statement:
    """Everything the statement says, ready to write."""

    tables: dict[
        str, pd.DataFrame
    ]  # shed, events, calendar, response, notice, baselines, baseline_days
    program: dict[str, Any]  # OpenADR 3 program object (JSON-ready)
    report: dict[str, Any]  # OpenADR 3 report object
    lines: list[str]  # the statement in sentences
    notes: list[str]  # what was left out or replaced, and why
    page: str  # the handover page (markdown)
    settings: StatementSettings
    backend: str


def build_statement(
    runs: pd.DataFrame,
    mv: pd.DataFrame | None,
    s: StatementSettings,
    cluster: Any,
    campaign: str,
    groups_set: str | None = None,
    plan: pd.DataFrame | None = None,
) -> Statement:
    """The statement of a campaign: its ``runs.parquet`` rows (those of ``groups_set`` when it
    has some), its controlled events' M&V records (:func:`wattflex.ops.services.mv.read_mv_records`;
    ``None``: none were run), the control
    study's ``ClusterConfig`` (the meter history's job stream) and the resource plan's table
    (``tables/resource_plan.csv``: start-up and checkpoint times for the knob menu; ``None``:
    no deep events)."""
    from dataclasses import replace

    chosen = runs[runs["set"] == groups_set] if groups_set is not None and "set" in runs else runs
    groups = groups_from_runs(chosen if len(chosen) else runs)
    notes = []
    why_not = mix_unavailable(groups.table, s.mix)
    if why_not:
        notes.append(f"{why_not}: the site is drawn from all groups uniformly (mix random)")
        s = replace(s, mix="random")
    if mv is None:
        notes.append("no controlled events: response time and ramp rate unknown")
    paired = [f"{g} from {c}" for g, c in zip(groups.names, groups.clock_groups) if c]
    notes.append(
        f"clock-lock curves (knob: clock groups) for {', '.join(paired)}"
        if paired
        else "no knob: clock group ran a cap group's job: the knob menu has no clock lock"
    )
    backend = (
        ",".join(sorted(runs["backend"].astype(str).unique())) if "backend" in runs else "measured"
    )
    shed = shed_by_depth(groups, s)
    calendar = calendar_table(shed, s)
    response = response_table(mv, s.response_policy)
    if mv is not None and response.empty:
        notes.append(
            f"no real events and no simulated ones of policy {s.response_policy!r} "
            "(statement.response_policy): "
            "response time and ramp rate unknown"
        )
    rng = np.random.default_rng(s.seed)
    true_w, known_w = curve_powers(groups, rng)
    models = groups.table["gpu_model"] if "gpu_model" in groups.table else ["H200"]
    idle_w = float(np.median([GPUS[g].idle_w for g in models]))
    # one job stream, metered twice: with the true uncapped powers and as the curves know them
    t, (true_load, known_load) = site_history(
        groups, np.stack([true_w, known_w]), cluster, s, idle_w, np.random.default_rng(s.seed + 1)
    )
    days = baseline_errors(t, true_load, known_load, s)
    tables = {
        "shed": shed,
        "events": events_table(shed, s),
        "calendar": calendar,
        "response": response,
        "notice": notice_table(response, s),
        "baselines": baseline_summary(days, shed, s),
        "baseline_days": days,
    }
    if plan is not None and set(groups.names) <= set(plan["group"]):
        index = sample_workloads(
            groups.table,
            s.mix,
            1,
            s.jobs_per_workload,
            np.random.default_rng(s.seed),
            s.pretraining_fraction,
        )[0]
        jobs = knob_jobs(
            groups, index, plan, cluster.checkpoint_every_s, np.random.default_rng(s.seed + 2)
        )
        tables["knobs"], tables["knob_jobs"] = deep_events(jobs, s)
    else:
        notes.append("no resource plan for every group: deep events (the knob menu) left out")
        tables["knobs"], tables["knob_jobs"] = pd.DataFrame(), pd.DataFrame()
    program, report = openadr3_objects(shed, response, s, campaign, backend)
    lines = (
        statement_lines(shed, calendar, response, tables["baselines"], s, backend)
        + knob_lines(tables["knobs"])
        + notes
    )
    shown = {
        k.replace("_", " ").capitalize(): v
        for k, v in tables.items()
        if k not in ("baseline_days", "knob_jobs")
    }
    page = as_markdown(
        lines, shown, f"Flexibility statement: {campaign} ({backend_label(backend)})"
    )
    return Statement(tables, program, report, lines, notes, page, s, backend)


def statement_files(
    stmt: Statement, paths: Mapping[str, Any], prov: Mapping[str, Any]
) -> list[tuple[Any, Any]]:
    """``(path, write)`` pairs of every file of the statement, for ``write_together``:
    ``paths`` maps each table name, ``program``, ``report`` and ``page`` to its path. Tables
    are CSVs with sidecars; the OpenADR 3 objects and the page are plain documents, their
    provenance in a ``.meta.json`` sidecar."""

    def plain(text: str, path: Any) -> list[tuple[Any, Any]]:
        return document_files(text.encode(), path, dict(prov), notes=stmt.notes)

    files = [
        f
        for name, df in stmt.tables.items()
        for f in csv_files(df, paths[name], dict(prov), notes=stmt.notes)
    ]
    files += plain(strict_json(stmt.program, indent=2) + "\n", paths["program"])
    files += plain(strict_json(stmt.report, indent=2) + "\n", paths["report"])
    return files + plain(stmt.page, paths["page"])
