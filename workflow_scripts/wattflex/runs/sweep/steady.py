"""Steady state inside a run: has the job settled at its current cap, and is the point precise?

Used by the one-run sweep controller (``wattflex.runs.sweep.algorithm``) after every cap
change: instead of a fixed wait, the window at a cap starts where the data stop changing
and ends as soon as both power and tokens/s reach a target standard error. The pieces,
each a standard tool of simulation output analysis:

- *Usable data.* Job-level telemetry samples labelled training (``telemetry.detect_phases``)
  and not in a dip (``dip_mask``: an evaluation keeps utilisation above the training
  threshold but drops power and utilisation well below the window's median), that lie at
  least ``min_settle_s`` after the cap change and after the last unusable sample (the run's
  start-up, an evaluation or a checkpoint): dips and the seconds after them never enter a
  point. Steps count when they lie wholly inside usable stretches and did
  not stall (``telemetry.step_throughput``'s rule).
- *Initial transient.* MSER (White 1997, the marginal standard error rule) truncates the
  start of the power series: the cut ``d`` minimises the standard error of the mean of
  what is left, searched over the first half; a minimum on the boundary of that half means
  the transient is not over yet. On a handful of steps MSER cuts noise at random, so
  leading steps are dropped while they are significantly slower than the rest
  (``leading_slow``: the warm-up steps after start-up), and MSER's cut is applied as well
  from 8 steps on (a gradual warm-up hides from an outlier test).
- *Drift.* OLS trend of the retained series (``scipy.stats.linregress``). The window is not
  steady when the trend is significant (``|slope / se| > drift_z``, se inflated for
  autocorrelation) *and* large: half the drift across the window, the bias it puts on the
  window's mean, exceeds the target standard error.
- *Precision.* The standard error of each mean, corrected for lag-1 autocorrelation
  (``sd / sqrt(n) * sqrt((1 + r1) / (1 - r1))``; telemetry samples are AR, not independent),
  must be at most ``target_rel_se`` of the mean (default 0.5 %, the paper's repeatability CV),
  with at least ``min_samples`` samples and ``min_steps`` steps.

``assess`` answers for one cap visit; the window it returns lists the accepted sample times,
so that the summary reported for a cap (``cap_rows``, ``summary_row``) uses exactly the
samples the controller accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from wattflex.run_ids import run_id
from wattflex.schema import section_defaults
from wattflex.telemetry import TRAINING, SummaryProtocol, detect_phases, job_series, summarize_run
from wattflex.vocabulary import RUN_GROUP_FIELDS

_STAIRCASE = section_defaults("staircase")


@dataclass(frozen=True)
class SteadyCriteria:
    """When a cap's point is settled and precise enough (config ``staircase:``; defaults: the schema's)."""

    target_rel_se: float = _STAIRCASE["target_rel_se"]  # SE of each mean / mean, power and tokens/s
    min_settle_s: float = _STAIRCASE[
        "min_settle_s"
    ]  # never use data closer than this to a cap change or a dip
    min_samples: int = _STAIRCASE["min_samples"]  # telemetry samples in the window
    min_steps: int = _STAIRCASE["min_steps"]  # complete training steps in the window
    drift_z: float = _STAIRCASE[
        "drift_z"
    ]  # significance of a trend before it can disqualify a window

    @classmethod
    def from_config(cls, cfg: dict[str, Any] | None) -> SteadyCriteria:
        """The criteria of a config's ``staircase:`` section (its other keys ignored; schema defaults
        for what it leaves out).
        """
        return cls(**{k: v for k, v in (cfg or {}).items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class SweepSettings:
    """How the sweep controller runs (``wattflex.runs.sweep.algorithm``; config ``staircase:``, the
    section ``SteadyCriteria`` reads too); defaults: the schema's."""

    max_dwell_s: float = _STAIRCASE["max_dwell_s"]  # give up waiting for one cap after this long
    target_ci_rel: float = _STAIRCASE[
        "target_ci_rel"
    ]  # adaptive: stop at this PFI 95 % CI half-width
    budget_fraction: float = _STAIRCASE[
        "budget_fraction"
    ]  # adaptive: revisits end by this fraction of a separate sweep's run time
    mc_samples: int = _STAIRCASE["mc_samples"]  # adaptive: Monte Carlo samples of each CI check

    @classmethod
    def from_config(cls, cfg: dict[str, Any] | None) -> SweepSettings:
        """The settings of a config's ``staircase:`` section (its other keys ignored; schema defaults
        for what it leaves out).
        """
        return cls(**{k: v for k, v in (cfg or {}).items() if k in cls.__dataclass_fields__})


@dataclass
class Window:
    """The verdict on the data seen at one cap since ``t_change_s`` up to ``t_end_s``."""

    t_change_s: float
    t_end_s: float
    t_settled_s: float = float("nan")  # start of the accepted window (on the sample grid)
    n_samples: int = 0
    n_steps: int = 0
    power_w: float = float("nan")  # plain means of the accepted window
    power_se_w: float = float("nan")  # autocorrelation-corrected standard errors
    tokens_per_s: float = float("nan")
    tokens_per_s_se: float = float("nan")
    settled: bool = False
    reason: str = "too_few_samples"
    step_rates: list[float] = field(default_factory=list, repr=False)
    power_samples: list[float] = field(default_factory=list, repr=False)
    sample_times: list[float] = field(default_factory=list, repr=False)  # the accepted samples

    @property
    def done(self) -> bool:
        """Whether the window settled with the precision asked for (``reason`` is ``ok``)."""
        return self.reason == "ok"

    @property
    def rel_se(self) -> tuple[float, float]:
        """The relative standard errors (SE / mean) of power and of tokens/s."""
        return self.power_se_w / self.power_w, self.tokens_per_s_se / self.tokens_per_s

    def record(self) -> dict[str, Any]:
        """JSON-safe facts of the window (what run.json keeps per visit)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("step_rates", "power_samples")}
        return {
            k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in out.items()
        }


# ---------------------------------------------------------------------------------------
# Statistics on one series
# ---------------------------------------------------------------------------------------


def se_mean_ar1(x: np.ndarray) -> float:
    """Standard error of the mean of an AR(1)-like series (lag-1 autocorrelation in [0, 0.9];
    taken as 0 below 8 points, where it cannot be estimated)."""
    x = np.asarray(x, float)
    n = x.size
    if n < 2:
        return float("nan")
    sd = x.std(ddof=1)
    r1 = 0.0
    if n >= 8 and sd > 0:
        d = x - x.mean()
        r1 = float(np.clip(np.dot(d[:-1], d[1:]) / np.dot(d, d), 0.0, 0.9))
    return float(sd / np.sqrt(n) * np.sqrt((1 + r1) / (1 - r1)))


def mser_truncation(x: np.ndarray) -> tuple[int, bool]:
    """MSER cut: ``(d, settled)``. ``d`` minimises ``var(x[d:]) / (n - d)`` over the first
    half of the series; ``settled`` is False when the minimum sits on the edge of that half
    (the transient may still be running)."""
    x = np.asarray(x, float)
    n = x.size
    if n < 4:
        return 0, False
    half = n // 2
    rev = x[::-1]  # suffix sums via reversed cumulative sums
    k = np.arange(1, n + 1)
    s1 = np.cumsum(rev)[::-1]
    s2 = np.cumsum(rev**2)[::-1]
    m = k[::-1]  # number of points in x[d:]
    sse = np.maximum(s2 - s1**2 / m, 0.0)
    mser = sse / m**2
    d = int(np.argmin(mser[: half + 1]))
    return d, d < half


def leading_slow(rates: np.ndarray, z: float = 3.0) -> int:
    """How many leading steps are significantly slower than the rest (warm-up steps after
    start-up: compilation, allocator, caches). Each leading step is dropped while it lies
    more than ``z`` robust SDs (MAD of the remaining steps, at least 0.1 %) below their
    median; at least three steps are always kept. MSER is unreliable on a handful of steps."""
    rates = np.asarray(rates, float)
    k = 0
    while rates.size - k > 3:
        rest = rates[k + 1 :]
        med = np.median(rest)
        sd = max(1.4826 * np.median(np.abs(rest - med)), 1e-3 * abs(med))
        if rates[k] >= med - z * sd:
            break
        k += 1
    return k


def drift(t: np.ndarray, x: np.ndarray, drift_z: float, tolerance: float) -> bool:
    """True when ``x`` trends in ``t`` significantly (|z| > drift_z, se inflated for lag-1
    autocorrelation) and by more than ``tolerance`` (absolute) at the window's ends relative
    to its middle, i.e. half the total change."""
    t, x = np.asarray(t, float), np.asarray(x, float)
    if x.size < 4 or np.ptp(t) == 0:
        return False
    fit = stats.linregress(t, x)
    resid = x - (fit.intercept + fit.slope * t)
    inflate = (
        se_mean_ar1(resid) * np.sqrt(x.size) / max(resid.std(ddof=1), 1e-300)
        if x.size >= 10
        else 1.0
    )
    se = fit.stderr * max(inflate, 1.0)
    significant = se == 0 and fit.slope != 0 or se > 0 and abs(fit.slope / se) > drift_z
    return bool(significant and abs(fit.slope) * np.ptp(t) / 2 > tolerance)


# ---------------------------------------------------------------------------------------
# Usable data of a run so far
# ---------------------------------------------------------------------------------------


def sample_period(times: np.ndarray) -> float:
    """The median interval (s) between sample ``times``; 1.0 with fewer than two samples."""
    return float(np.median(np.diff(times))) if len(times) > 1 else 1.0


def usable_sample_mask(
    times: np.ndarray, busy: np.ndarray, t_from: float, t_to: float, settle_s: float
) -> np.ndarray:
    """Samples (each covering ``(t - period, t]``) that lie inside ``[t_from, t_to]``, are
    ``busy`` (training, not a dip), and come at least ``settle_s`` after the last sample that
    was not."""
    times = np.asarray(times, float)
    period = sample_period(times)
    last_idle = np.maximum.accumulate(np.where(busy, -np.inf, times))
    return (
        busy
        & (times - period >= t_from - 1e-9)
        & (times <= t_to + 1e-9)
        & (times - period - last_idle >= settle_s - 1e-9)
    )


def dip_mask(
    series: pd.DataFrame,
    candidates: np.ndarray,
    power_drop: float = 0.02,
    robust_z: float = 5.0,
    util_drop: float = 10.0,
) -> np.ndarray:
    """Training-labelled samples that are really an evaluation or other partial-load pause:
    power more than ``max(robust_z`` robust SDs, ``power_drop`` relative) below the median
    of ``candidates``, or GPU utilisation more than ``util_drop`` points below theirs.
    (An evaluation keeps utilisation above the training threshold, so phase labels alone
    miss it; the paper's top-10 % aggregate drops it implicitly.)"""
    out = np.zeros(len(series), bool)
    if candidates.sum() < 3:
        return out
    power = series["power_w"].to_numpy(float)
    med = np.median(power[candidates])
    mad = 1.4826 * np.median(np.abs(power[candidates] - med))
    out |= power < med - max(robust_z * mad, power_drop * med)
    if "gpu_util" in series:
        util = series["gpu_util"].to_numpy(float)
        out |= util < np.median(util[candidates]) - util_drop
    return out & candidates


def stretches(times: np.ndarray, mask: np.ndarray) -> list[tuple[float, float]]:
    """Contiguous runs of accepted samples as (start, end) times, a sample covering (t - period, t]."""
    times = np.asarray(times, float)
    period = sample_period(times)
    out: list[tuple[float, float]] = []
    for t in times[mask]:
        if out and t - period <= out[-1][1] + 1e-9:
            out[-1] = (out[-1][0], float(t))
        else:
            out.append((float(t - period), float(t)))
    return out


def step_table(steps: pd.DataFrame) -> pd.DataFrame:
    """Steps with their start time, duration and tokens/s; ``stalled`` marks steps that span
    a pause (more than 3x the median duration, ``telemetry.step_throughput``'s rule)."""
    t_end = steps["t_end_s"].to_numpy(float)
    t_start = np.concatenate([[np.nan], t_end[:-1]])[: t_end.size]
    dur = t_end - t_start
    med = np.nanmedian(dur) if np.isfinite(dur).any() else np.nan
    return pd.DataFrame(
        {
            "t_start_s": t_start,
            "t_end_s": t_end,
            "tokens_per_s": steps["tokens"].to_numpy(float) / dur,
            "stalled": dur > 3 * med,
        }
    )


def steps_inside(table: pd.DataFrame, windows: list[tuple[float, float]]) -> np.ndarray:
    """Which steps lie wholly inside one of ``windows`` ((start, end) s, 1e-9 s slack), were not
    stalled and have a finite tokens/s, as a boolean mask.
    """
    inside = np.zeros(len(table), bool)
    for a, b in windows:
        inside |= (table["t_start_s"].to_numpy() >= a - 1e-9) & (
            table["t_end_s"].to_numpy() <= b + 1e-9
        )
    return inside & ~table["stalled"].to_numpy(bool) & np.isfinite(table["tokens_per_s"].to_numpy())


# ---------------------------------------------------------------------------------------
# The verdict for one cap visit
# ---------------------------------------------------------------------------------------


def assess(
    series: pd.DataFrame,
    steps: pd.DataFrame,
    t_change_s: float,
    t_now_s: float,
    criteria: SteadyCriteria = SteadyCriteria(),
    protocol: SummaryProtocol = SummaryProtocol(),
) -> Window:
    """Is the job steady at the cap set at ``t_change_s``, with precise enough means, given
    the job-level ``series`` (``telemetry.job_series``) and step log seen up to ``t_now_s``?"""
    w = Window(t_change_s=float(t_change_s), t_end_s=float(t_now_s))
    if series.empty:
        return w
    times = series["t_s"].to_numpy(float)
    period = sample_period(times)
    busy = detect_phases(series, protocol) == TRAINING
    t_from = t_change_s + criteria.min_settle_s
    busy &= ~dip_mask(
        series, usable_sample_mask(times, busy, t_from, t_now_s, criteria.min_settle_s)
    )
    mask = usable_sample_mask(times, busy, t_from, t_now_s, criteria.min_settle_s)
    if mask.sum() < max(criteria.min_samples, 4):
        return w
    power = series["power_w"].to_numpy(float)
    # Steps of this visit only: the stall rule compares durations at one cap.
    table = step_table(steps[(steps["t_end_s"] >= t_change_s) & (steps["t_end_s"] <= t_now_s)])

    # Initial transient: MSER on power; then slow leading steps among those after the cut.
    idx = np.flatnonzero(mask)
    d_p, ok_p = mser_truncation(power[idx])
    start = times[idx[d_p]] - period
    mask &= times - period >= start - 1e-9
    use = steps_inside(table, stretches(times, mask))
    rates = table["tokens_per_s"].to_numpy()[use]
    d_s = leading_slow(rates, criteria.drift_z)
    if rates.size >= 8:  # enough steps for MSER: it also catches a slow, gradual warm-up
        d_m, ok_m = mser_truncation(rates)
        d_s = max(d_s, d_m if ok_m else 0)
    if d_s:
        first_step = table["t_start_s"].to_numpy()[use][d_s]
        k = int(np.searchsorted(times - period, first_step - 1e-9))  # back onto the sample grid
        start = times[k] - period if k < times.size else float(t_now_s)
        mask &= times - period >= start - 1e-9
        use = steps_inside(table, stretches(times, mask))
        rates = table["tokens_per_s"].to_numpy()[use]
    x, tx = power[mask], times[mask]
    w.t_settled_s, w.n_samples, w.n_steps = float(start), int(mask.sum()), int(rates.size)
    if not x.size:  # the steps' warm-up cut left no sample yet
        return w
    w.power_w, w.power_se_w = float(x.mean()), se_mean_ar1(x)
    w.power_samples, w.step_rates, w.sample_times = x.tolist(), rates.tolist(), tx.tolist()
    if rates.size:
        w.tokens_per_s = float(rates.mean())
        w.tokens_per_s_se = se_mean_ar1(rates) if rates.size > 1 else float("nan")
    w.settled = bool(ok_p)
    tol = criteria.target_rel_se
    if not w.settled:
        w.reason = "settling"
    elif w.n_samples < criteria.min_samples:
        w.reason = "too_few_samples"
    elif w.n_steps < max(criteria.min_steps, 2):
        w.reason = "too_few_steps"
    elif drift(tx, x, criteria.drift_z, tol * w.power_w):
        w.reason = "drift_power"
    elif drift(table["t_start_s"].to_numpy()[use], rates, criteria.drift_z, tol * w.tokens_per_s):
        w.reason = "drift_tokens"
    elif not w.power_se_w <= tol * w.power_w:
        w.reason = "imprecise_power"
    elif not w.tokens_per_s_se <= tol * w.tokens_per_s:
        w.reason = "imprecise_tokens"
    else:
        w.reason = "ok"
    return w


# ---------------------------------------------------------------------------------------
# From a one-run sweep's record to per-cap rows (the runs.parquet contract)
# ---------------------------------------------------------------------------------------


def cap_rows(
    telemetry: pd.DataFrame,
    steps: pd.DataFrame,
    record: dict[str, Any],
    protocol: SummaryProtocol = SummaryProtocol(),
    caps: Sequence[float] | None = None,
) -> dict[float, dict[str, Any]]:
    """Per cap, the steady-state summary of exactly the samples the controller accepted at
    that cap (``telemetry.summarize_run`` on the run with every other sample masked out as
    not training, so its steps are those wholly inside accepted stretches), plus how the
    point was obtained. Keys: cap_w.

    The aggregate is always the plain mean (the row's ``aggregate`` says so): the paper's
    top-10 % mean drops dips from a 30-minute run, which the detector has already done
    here, and on a window of a few steps it is the largest one or two, an order statistic
    whose bias grows with the window's size and so differs from cap to cap."""
    protocol = replace(protocol, aggregate="mean")
    series = job_series(telemetry)
    times = series["t_s"].to_numpy(float)
    period = float(np.median(np.diff(times))) if len(times) > 1 else 1.0
    out = {}
    for cap in record["caps"] if caps is None else [float(c) for c in caps]:
        visits = [v for v in record["visits"] if v["cap_w"] == cap]
        accepted = np.isin(
            times, np.concatenate([np.asarray(v["sample_times"], float) for v in visits])
        )
        in_visit = np.zeros(len(steps), bool)
        for v in visits:
            in_visit |= steps["t_end_s"].between(v["t_change_s"], v["t_end_s"]).to_numpy()
        if not accepted.any():
            raise ValueError(
                f"cap {cap:g} W: no steady sample was accepted ({[v['reason'] for v in visits]})"
            )
        masked = telemetry.copy()
        masked.loc[~masked["t_s"].isin(times[accepted]), "gpu_util"] = 0.0  # not training: excluded
        summary = summarize_run(masked, steps[in_visit], protocol)
        summary["energy_j"] = float(series["power_w"].to_numpy()[accepted].sum() * period)
        summary.update(
            sweep_mode=record["sweep_mode"],
            n_visits=len(visits),
            settle_s=float(
                sum(
                    (v["t_settled_s"] if v["t_settled_s"] is not None else v["t_end_s"])
                    - v["t_change_s"]
                    for v in visits
                )
            ),
            steady_reason=",".join(v["reason"] for v in visits),
            power_w_se_ar=se_mean_ar1(series["power_w"].to_numpy()[accepted]),
            run_duration_s=float(record["duration_s"]),
        )
        out[float(cap)] = summary
    return out


GROUP_FIELDS = RUN_GROUP_FIELDS


def summary_row(
    run_record: dict[str, Any], cap_w: float, summary: dict[str, Any]
) -> dict[str, Any]:
    """A cap's row for runs.parquet: who it is (as ``summarize_run``'s rule writes it) + summary."""
    group = run_record["spec"]["group"]
    return {
        "group": run_record["group"],
        "run_id": run_id(cap_w),
        "cap_w": float(cap_w),
        "repeat": 0,
        "backend": run_record["provenance"].get("backend", run_record.get("backend")),
        "gpu_model": run_record.get("device_model"),
        **{k: group.get(k) for k in GROUP_FIELDS},
        **summary,
    }


def cap_slice(
    telemetry: pd.DataFrame, steps: pd.DataFrame, record: dict[str, Any], cap_w: float
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The stretches of the run spent at ``cap_w`` (from each cap change to the next): a
    per-cap view that looks like a separate run's files (used for the Fig. 2 analog)."""
    keep_t = np.zeros(len(telemetry), bool)
    keep_s = np.zeros(len(steps), bool)
    for v in record["visits"]:
        if v["cap_w"] == cap_w:
            keep_t |= telemetry["t_s"].between(v["t_change_s"], v["t_end_s"]).to_numpy()
            keep_s |= steps["t_end_s"].between(v["t_change_s"], v["t_end_s"]).to_numpy()
    return telemetry[keep_t].reset_index(drop=True), steps[keep_s].reset_index(drop=True)
