"""The Power Flexibility Index (PFI) of a power-cap sweep, with diagnostics and uncertainty.

A *sweep group* is one job run at several power caps. For capped run i, ``P_i`` is the
job's power (W) and ``T_i`` its throughput (any unit); ``(P_max, T_max)`` is the run at the
highest cap of the group, the uncapped reference.

Published definitions (the paper's §"PFI"), reported unchanged
-------------------------------------------------------------------
- ``pfi_ratio`` (Eq. 1, the headline): ``mean_i (1 - P_i/P_max) / (1 - T_i/T_max)`` over the
  capped points, excluding any with ``T_i == T_max`` exactly (as the paper does).
- ``pfi_area``: the trapezoid area under ``T/T_max`` against ``P/P_max``, all points incl. the
  uncapped one sorted by power and starting from (0, 0), minus 1/2 (the area under the
  diagonal). When the uncapped point has the highest power this is exactly the area between
  the curve and the diagonal, ``integral of (T/T_max - P/P_max) d(P/P_max)``; it sits in
  about ±0.1. (The digest's wording "integral of (T/T_max - P/P_max) ... minus 1/2" read
  literally would subtract 1/2 twice and land near -0.4, contradicting its stated range.)
- ``pfi_elasticity``: ordinary least squares ``log T = a log P + c`` over all points
  (uncapped included); PFI = ``1 - a``.

Robust PFI
--------------------
On real sweeps Eq. 1 is ill-conditioned: a capped run as fast as or faster than the
uncapped one (the cap never bound, or noise) makes a term explode or turn negative. The
robust PFI keeps Eq. 1's form, so that on a clean sweep it equals the published value,
and fixes the two things that break it:

1. *Noise in T.* Throughput cannot physically rise when power falls, so a monotone
   (isotonic, non-decreasing in power) curve is fitted to all points of the group,
   uncapped included, by weighted least squares (weights ``1/sem_T**2`` when SEMs are
   given, uniform otherwise): the min-max formula of ``isotonic_fit_batch`` across groups,
   scikit-learn's ``IsotonicRegression`` for a group with equal powers (ties), agreeing with
   scikit-learn's PAVA to rounding (tests). ``T_max`` becomes the fitted
   value at the uncapped point, each ``T_i`` its fitted value. Points that violate
   monotonicity are pooled with their neighbours instead of producing negative terms.
2. *Caps that did not bind.* Only *binding* points enter: a capped point binds when its
   power is significantly below ``P_max`` AND (its realised per-GPU power is within
   ``power_tol`` of its cap OR its throughput is significantly below ``T_max``).
3. *Terms that are noise/noise.* A binding point whose fitted throughput is not
   significantly below the fitted ``T_max`` (pooled with the reference, or a loss within
   noise) is excluded: the noise-aware version of Eq. 1's own exclusion of ``T_i == T_max``.
   Without it one point with a 0.05 % loss and a 5 % power cut adds a term of 100.

``pfi_robust`` is the mean of Eq. 1 terms over the binding points that lost throughput,
using fitted values; it is defined when the group has at least two binding points
(distinct caps) and at least one of them lost throughput. "Significantly" means by more
than ``z * sqrt(sem_i**2 + sem_ref**2)`` (``z`` from ``ci``, 1.96 for 95 %) when SEMs are
given, else by more than ``rel_tol`` (``REL_TOL`` by default) of the reference value. On a clean,
monotone sweep whose caps all bind it equals ``pfi_ratio``. The set of contributing points
is decided once on the means and kept in the Monte Carlo resamples.

Uncertainty
-----------
``ci95_low/high`` (for ``pfi_ratio``) and ``pfi_robust_ci95_low/high`` come from
``mc_samples`` Monte Carlo resamples of every point's P and T from ``N(mean, sem)``
(vectorised across resamples and across groups of the same size; the robust one refits the
isotonic curve per resample with a vectorised min-max formula equivalent to scikit-learn's
PAVA, keeping the binding set of the point estimate). Percentile intervals. Without SEMs the
CI columns are NaN and ``notes`` say why. The standard normals are one batched stream per
group size, seeded from ``(seed, number of points)`` and shared by every group of that size
(common random numbers): each group's resamples are still independent
``N(mean, sem)`` draws, a group's CI does not depend on which other groups are in the table,
and 25,000 groups cost one draw of ``mc_samples x n`` normals instead of 25,000.

Status vocabulary (``status`` = the most severe that applies; ``notes`` list all)
---------------------------------------------------------------------------------
Most severe first (``STATUSES``):

- ``too_few_caps``: fewer than two caps, i.e. no capped point; every PFI is NaN.
- ``missing_uncapped``: the group's highest cap is below the expected uncapped cap
  (``uncapped_cap_w``) or its highest-cap rows were invalid; the reference is a capped run.
- ``capped_faster``: some capped point has ``T_i > T_max``; its Eq. 1 term is negative, so
  ``pfi_ratio`` is not meaningful. A point with ``T_i == T_max`` is not flagged: Eq. 1
  excludes it by definition (``notes`` say so).
- ``capped_more_power``: some capped point has ``P_i >= P_max``; its numerator is <= 0.
- ``nonbinding_cap``: some cap did not bind: realised per-GPU power more than
  ``power_tol`` below the cap AND throughput not significantly below ``T_max``.
- ``ill_conditioned``: some ``|T_max - T_i|`` is within noise, so its term is noise/noise.
- ``non_monotone``: throughput is not monotone in power beyond noise (the isotonic fit
  moved a point by more than its noise); Eq. 1 is computable but the robust value differs.
- ``invalid_values``: rows with a missing or non-positive cap, power or throughput (or a
  negative SEM) were dropped; ``notes`` say which.
- ``too_few_binding``: fewer than two binding points, so ``pfi_robust`` is NaN.
- ``no_throughput_loss``: binding points exist but none lost throughput beyond noise in the
  monotone fit (perfectly inelastic over the swept range: PFI unbounded); ``pfi_robust`` NaN.
- ``ok``.

``robust_status`` is ``ok`` or the reason ``pfi_robust`` is NaN (``too_few_caps``,
``too_few_binding``, ``no_throughput_loss``). ``per_cap`` is a JSON list, one object per
capped point: ``cap_w, power_w, throughput, n_rows, power_w_sem, throughput_sem,
power_ratio (P/P_max), throughput_ratio (T/T_max), term`` (Eq. 1, null if excluded),
``binding, robust_throughput`` (fitted), ``robust_term`` (null if not used) and ``flags``
(the point-level statuses above plus ``excluded_t_equals_tmax``, ``pooled_with_uncapped``,
``loss_within_noise``).

Input handling
--------------
Rows repeated for one (group, cap) (repeat runs) are averaged first: P and T are
arithmetic means and their SEMs combine as ``sqrt(sum sem**2) / n``. Per-GPU power for the
binding test is ``power_w / gpus`` when a ``gpus`` column exists (``runs.parquet`` holds
the job total and a per-GPU cap), else ``power_w``. Extra input columns that are constant
within every group (cluster, model, gpus, ...) are carried through to the output.
Recompute on a subset of caps (paper Table 9) with ``grid_subset`` + ``pfi_table`` or with
``grid_sensitivity``.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from wattflex.pfi_tolerances import POWER_TOL, REL_TOL  # noqa: F401 (wattflex.pfi.REL_TOL)
from wattflex.schema import section_defaults

_PFI = section_defaults("pfi")  # the pfi: section's defaults: pfi_table's and `wattflex pfi`'s

PROGRESS_EVERY_S = 5.0  # a progress line this often on long tables (wattflex pfi prints them)
STATUSES = (
    "too_few_caps",
    "missing_uncapped",
    "capped_faster",
    "capped_more_power",
    "nonbinding_cap",
    "ill_conditioned",
    "non_monotone",
    "invalid_values",
    "too_few_binding",
    "no_throughput_loss",
    "ok",
)
OUTPUT_COLUMNS = (
    "group",
    "n_caps",
    "pfi_ratio",
    "pfi_area",
    "pfi_elasticity",
    "ci95_low",
    "ci95_high",
    "status",
    "pfi_robust",
    "pfi_robust_ci95_low",
    "pfi_robust_ci95_high",
    "robust_status",
    "n_binding",
    "uncapped_cap_w",
    "uncapped_power_w",
    "uncapped_throughput",
    "per_cap",
    "notes",
)
# Per-point flags that raise a group status of the same name.
_POINT_STATUS_FLAGS = ("capped_faster", "capped_more_power", "nonbinding_cap", "ill_conditioned")
# Relative tolerance for "fitted throughput equals the fitted T_max" (pooled block means).
_POOL_RTOL = 1e-9


# ---------------------------------------------------------------------------------------
# The three published definitions on plain arrays
# ---------------------------------------------------------------------------------------


def eq1_term(p: np.ndarray, p_ref: np.ndarray, t: np.ndarray, t_ref: np.ndarray) -> np.ndarray:
    """Paper Eq. 1's term ``(1 - p/p_ref) / (1 - t/t_ref)``, element-wise (NumPy broadcasting),
    in two temporaries. The one place the formula is written: every PFI of the library (the PFI
    table, its Monte Carlo CI and robust variant, :func:`pfi_ratio_curves`) is built from it."""
    num = np.divide(p, p_ref)
    np.subtract(1.0, num, out=num)
    den = np.divide(t, t_ref)
    np.subtract(1.0, den, out=den)
    return np.divide(num, den, out=num)


def eq1_counts(t: np.ndarray, t_ref: np.ndarray) -> np.ndarray:
    """Eq. 1's edge rule, the only one: a capped point counts when its throughput differs from
    the reference's, ``T_i != T_max`` exactly (as the paper excludes ``T_i == T_max``)."""
    return t != t_ref


def pfi_ratio_curves(power_w: np.ndarray, throughput: np.ndarray) -> np.ndarray:
    """Paper Eq. 1 of many curves at once: arrays (..., n), each curve's uncapped reference last
    (broadcast against each other). The mean of :func:`eq1_term` over the capped points that
    count (:func:`eq1_counts`); NaN where none counts or the mean is not finite (a zero reference
    power, or a throughput that rounds to the reference's: never inf). Every caller of Eq. 1
    uses this: :func:`pfi_ratio`, the PFI table, the controller, the sweep, calibration,
    fidelity, the SLURM coordinator."""
    p, t = np.broadcast_arrays(
        np.asarray(power_w, dtype=float), np.asarray(throughput, dtype=float)
    )
    t_ref = t[..., -1:]
    counted = eq1_counts(t[..., :-1], t_ref)  # the capped points, in order: one summation order
    count = counted.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = eq1_term(p[..., :-1], p[..., -1:], t[..., :-1], t_ref)
        mean = np.where(counted, terms, 0.0).sum(axis=-1) / np.maximum(count, 1)
    return np.where((count > 0) & np.isfinite(mean), mean, np.nan)


def pfi_ratio(power_w: Sequence[float], throughput: Sequence[float], ref: int = -1) -> float:
    """Paper Eq. 1: mean over capped points of ``(1 - P_i/P_max) / (1 - T_i/T_max)``.

    ``power_w[ref], throughput[ref]`` (default: the last element, i.e. the caller orders
    points by cap) is the uncapped reference. :func:`pfi_ratio_curves` on the one curve: points
    with ``T_i == T_max`` are excluded as in the paper; NaN, never inf, when no term remains.
    """
    p = np.asarray(power_w, dtype=float)
    t = np.asarray(throughput, dtype=float)
    if len(p) < 2:
        return float("nan")
    ref = ref % len(p)
    order = [*(i for i in range(len(p)) if i != ref), ref]
    return float(pfi_ratio_curves(p[order], t[order]))


def pfi_area(power_w: Sequence[float], throughput: Sequence[float], ref: int = -1) -> float:
    """Area under ``T/T_max`` vs ``P/P_max`` (trapezoid, from (0,0), sorted by power) minus 1/2.

    Uses all points, the reference ``[ref]`` (default last) included; see the module
    docstring for why this is the digest's "area between curves".
    """
    p = np.asarray(power_w, dtype=float)
    t = np.asarray(throughput, dtype=float)
    if len(p) < 2:
        return float("nan")
    x = p / p[ref]
    y = t / t[ref]
    order = np.argsort(x, kind="stable")
    x = np.concatenate([[0.0], x[order]])
    y = np.concatenate([[0.0], y[order]])
    return float(np.trapezoid(y, x) - 0.5)


def pfi_elasticity(power_w: Sequence[float], throughput: Sequence[float]) -> float:
    """Constant-elasticity PFI: ``1 - a`` from OLS ``log T = a log P + c`` over all points.

    NaN when fewer than two distinct powers or any non-positive value (log undefined).
    """
    p = np.asarray(power_w, dtype=float)
    t = np.asarray(throughput, dtype=float)
    if len(p) < 2 or np.any(p <= 0) or np.any(t <= 0) or np.ptp(p) == 0:
        return float("nan")
    slope = np.polyfit(np.log(p), np.log(t), 1)[0]
    return float(1.0 - slope)


# ---------------------------------------------------------------------------------------
# Monotone fit: scikit-learn for the point estimate, a vectorised twin for Monte Carlo
# ---------------------------------------------------------------------------------------


def isotonic_fit(
    power_w: np.ndarray, throughput: np.ndarray, weight: np.ndarray | None = None
) -> np.ndarray:
    """Throughput fitted non-decreasing in power (weighted least squares), in input order.

    scikit-learn's PAVA (``sklearn.isotonic.isotonic_regression``) on the points sorted by
    power, which is what ``IsotonicRegression`` runs once it has pooled points of equal
    power; with ties it is used itself. The estimator's input checks cost ~2 ms a call, a
    third of a group's analysis on 25,000-group tables. Throughput already
    non-decreasing in power (distinct powers) is its own fit: PAVA pools nothing and returns
    it unchanged, so it is returned without the call (most sweeps)."""
    p = np.asarray(power_w, dtype=float)
    order = np.argsort(p, kind="stable")
    ties = np.any(np.diff(p[order]) == 0)
    y = np.asarray(throughput, dtype=float)
    if not ties and np.all(np.diff(y[order]) >= 0):
        return y.copy()
    from sklearn.isotonic import IsotonicRegression, isotonic_regression

    if ties:
        return IsotonicRegression(increasing=True).fit_transform(
            p, throughput, sample_weight=weight
        )
    w = None if weight is None else np.asarray(weight, dtype=float)[order]
    fitted = np.empty(p.size)
    fitted[order] = isotonic_regression(y[order], sample_weight=w)
    return fitted


def isotonic_fit_batch(
    power_w: np.ndarray, throughput: np.ndarray, weight: np.ndarray | None = None
) -> np.ndarray:
    """Row-wise isotonic regression of ``throughput`` on ``power_w``, both (S, n).

    The min-max formula ``f_i = max_{j<=i} min_{k>=i} mean_w(y_j..y_k)`` on each row's
    power order: O(n^2) per row, fully vectorised, which is what makes 10,000 refits per
    group cheap for the small n of a sweep. Ties in power are not pooled (they have
    probability zero in resamples); ``isotonic_fit`` is the reference implementation.
    """
    p = np.atleast_2d(power_w)
    t = np.atleast_2d(throughput)
    w = np.ones_like(t) if weight is None else np.broadcast_to(weight, t.shape)
    ys = np.array(t, dtype=float)  # each row in power order, then fitted in place
    # Resampled powers of a sweep are nearly always in cap order already: sort only the
    # rows that are not (a stable sort of an ordered row is the identity).
    unsorted = np.flatnonzero((np.diff(p, axis=1) < 0).any(axis=1))
    order = np.argsort(p[unsorted], axis=1, kind="stable")
    ys[unsorted] = np.take_along_axis(ys[unsorted], order, axis=1)
    bad = np.flatnonzero((np.diff(ys, axis=1) < 0).any(axis=1))  # rows already monotone: done
    if bad.size:
        yb = ys[bad]
        wb = np.array(w[bad], dtype=float)
        at = np.searchsorted(unsorted, bad)  # which bad rows were sorted, and how
        hit = at < unsorted.size
        hit[hit] = unsorted[at[hit]] == bad[hit]
        wb[hit] = np.take_along_axis(wb[hit], order[at[hit]], axis=1)
        zeros = np.zeros((len(bad), 1))
        cw = np.concatenate([zeros, np.cumsum(wb, axis=1)], axis=1)
        cy = np.concatenate([zeros, np.cumsum(wb * yb, axis=1)], axis=1)
        n = yb.shape[1]
        upper = np.triu(np.ones((n, n), dtype=bool))
        with np.errstate(divide="ignore", invalid="ignore"):
            # block[s, j, k] = weighted mean of sorted points j..k (j <= k)
            block = (cy[:, None, 1:] - cy[:, :-1, None]) / (cw[:, None, 1:] - cw[:, :-1, None])
        block = np.where(upper, block, np.inf)
        suffix_min = np.flip(np.minimum.accumulate(np.flip(block, axis=2), axis=2), axis=2)
        ys[bad] = np.where(upper, suffix_min, -np.inf).max(axis=1)
    back = np.empty_like(order, dtype=float)
    np.put_along_axis(back, order, ys[unsorted], axis=1)
    ys[unsorted] = back
    return ys


# ---------------------------------------------------------------------------------------
# Sweep tables
# ---------------------------------------------------------------------------------------


def grid_subset(
    sweeps: pd.DataFrame, caps: Iterable[float], *, cap_col: str = "cap_w"
) -> pd.DataFrame:
    """Rows of ``sweeps`` whose cap is in ``caps`` (paper Table 9: a 6-cap sweep on the 4-cap
    grid). Include the uncapped cap in ``caps``; pass the result to ``pfi_table``."""
    wanted = np.asarray(sorted(set(float(c) for c in caps)))
    return sweeps[np.isin(sweeps[cap_col].astype(float), wanted)].copy()


def grid_sensitivity(
    sweeps: pd.DataFrame,
    caps: Iterable[float],
    *,
    group_col: str = "group",
    cap_col: str = "cap_w",
    value: str = "pfi_ratio",
    **pfi_kwargs: Any,
) -> pd.DataFrame:
    """PFI on each group's full grid vs on the subset ``caps`` (Table 9), for the groups whose
    grid strictly contains ``caps``: ``group, pfi_full, pfi_subset, delta, delta_pct``."""
    caps = sorted(set(float(c) for c in caps))
    grids = sweeps.groupby(group_col, sort=False)[cap_col].agg(lambda s: set(s.astype(float)))
    groups = [g for g, grid in grids.items() if set(caps) < grid]
    if not groups:  # no group swept on more caps than ``caps`` (e.g. a four-cap-only campaign)
        return pd.DataFrame(columns=["group", "pfi_full", "pfi_subset", "delta", "delta_pct"])
    pfi_kwargs.setdefault("mc_samples", 0)
    full = sweeps[sweeps[group_col].isin(groups)]
    kw = dict(group_col=group_col, cap_col=cap_col, **pfi_kwargs)
    a = pfi_table(full, **kw).set_index("group")[value]
    b = pfi_table(grid_subset(full, caps, cap_col=cap_col), **kw).set_index("group")[value]
    out = pd.DataFrame({"pfi_full": a, "pfi_subset": b.reindex(a.index)})
    out["delta"] = out.pfi_subset - out.pfi_full
    out["delta_pct"] = 100.0 * out.delta / out.pfi_full
    return out.rename_axis("group").reset_index()


def clock_pfi_table(
    sweeps: pd.DataFrame, *, clock_col: str = "clock_mhz", **kw: Any
) -> pd.DataFrame:
    """``pfi_table`` of ``knob: clock`` groups: the same power -> throughput curve,
    its setpoints the locked SM clocks (MHz) instead of caps. The reference is the highest
    clock. A lock has no power number to sit near, so a point binds when it saved power
    beyond noise (``power_tol=1``: the near-the-cap test always passes); ``uncapped_cap_w``,
    ``per_cap``'s ``cap_w`` and the setpoints are MHz (``knob`` column: ``clock``)."""
    kw = {**kw, "cap_col": clock_col, "power_tol": 1.0, "uncapped_cap_w": None}
    return pfi_table(sweeps, **kw).assign(knob="clock")


def pfi_table(
    sweeps: pd.DataFrame,
    *,
    group_col: str = "group",
    cap_col: str = "cap_w",
    power_col: str = "power_w",
    throughput_col: str = "throughput",
    power_sem_col: str | None = None,
    throughput_sem_col: str | None = None,
    gpus_col: str | None = "gpus",
    uncapped_cap_w: float | str | None = None,
    mc_samples: int = _PFI["mc_samples"],
    ci: float = _PFI["ci"],
    seed: int = _PFI["seed"],
    rel_tol: float = REL_TOL,
    power_tol: float = POWER_TOL,
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """One row per group: published PFIs, robust PFI, Monte Carlo CIs, status and diagnostics.

    ``sweeps`` has one row per run (repeats allowed; see the module docstring for how they
    are averaged). ``gpus_col`` (if present in ``sweeps``) turns job power into per-GPU
    power for the binding test. ``uncapped_cap_w`` is the cap an uncapped run should have
    (a number, or a column holding it per group); groups whose highest cap is below it get
    ``missing_uncapped``. ``rel_tol`` is the relative noise level used when no SEM is given;
    ``power_tol`` how far below its cap realised power may sit and the cap still bind.
    Columns: ``OUTPUT_COLUMNS`` then the carried-through group metadata. ``progress`` (e.g.
    a stderr printer) gets a line every ``PROGRESS_EVERY_S`` seconds once the first has passed.
    """
    required = [group_col, cap_col, power_col, throughput_col]
    optional = [c for c in (power_sem_col, throughput_sem_col) if c is not None]
    if isinstance(uncapped_cap_w, str):
        optional.append(uncapped_cap_w)
    missing = [c for c in required + optional if c not in sweeps.columns]
    if missing:
        raise ValueError(
            f"sweep table lacks column(s) {', '.join(missing)}; "
            f"has {', '.join(map(str, sweeps.columns))}"
        )
    if sweeps[group_col].isna().any():
        raise ValueError(f"{int(sweeps[group_col].isna().sum())} row(s) have no {group_col}")
    if not 0 < ci < 1:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    if (power_sem_col is None) != (throughput_sem_col is None):
        raise ValueError("give both power_sem_col and throughput_sem_col, or neither")

    df = pd.DataFrame(
        {
            "group": sweeps[group_col].to_numpy(),
            "cap": pd.to_numeric(sweeps[cap_col], errors="coerce").to_numpy(dtype=float),
            "p": pd.to_numeric(sweeps[power_col], errors="coerce").to_numpy(dtype=float),
            "t": pd.to_numeric(sweeps[throughput_col], errors="coerce").to_numpy(dtype=float),
        }
    )
    has_sem = power_sem_col is not None
    for name, col in (("sp", power_sem_col), ("st", throughput_sem_col)):
        df[name] = (
            pd.to_numeric(sweeps[col], errors="coerce").to_numpy(dtype=float)
            if col is not None
            else np.nan
        )
    df["gpus"] = (
        pd.to_numeric(sweeps[gpus_col], errors="coerce").to_numpy(dtype=float)
        if gpus_col is not None and gpus_col in sweeps.columns
        else 1.0
    )
    if isinstance(uncapped_cap_w, str):
        df["expect"] = pd.to_numeric(sweeps[uncapped_cap_w], errors="coerce").to_numpy(dtype=float)
    else:
        df["expect"] = np.nan if uncapped_cap_w is None else float(uncapped_cap_w)

    settings = _Settings(
        z=NormalDist().inv_cdf(0.5 + ci / 2),
        alpha=1 - ci,
        rel_tol=rel_tol,
        power_tol=power_tol,
        mc_samples=int(mc_samples),
        seed=int(seed),
        has_sem=has_sem,
    )
    df["bad"] = _invalid_rows(df)  # once for the table, not per group
    df["code"], names = pd.factorize(df["group"], sort=False)  # groups in order of first appearance
    clock = _Progress(progress)
    rows, jobs = _analyse_all(df, names, settings, clock)
    _monte_carlo_all(jobs, settings, clock)
    for row in rows:
        row["notes"] = "; ".join(row["notes"])
    out = pd.DataFrame(rows, columns=list(OUTPUT_COLUMNS))
    out["n_caps"] = out["n_caps"].astype(int)
    out["n_binding"] = out["n_binding"].astype(int)
    meta = _constant_columns(sweeps, group_col, exclude=set(required) | set(optional))
    if not meta.empty:
        out = out.merge(meta, left_on="group", right_index=True, how="left")
    return out


class _Settings:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


class _Progress:
    """Calls ``progress`` with an elapsed-time line every ``PROGRESS_EVERY_S`` seconds."""

    def __init__(self, progress: Callable[[str], None] | None) -> None:
        self.progress, self.t0, self.shown = progress, time.monotonic(), 0.0

    def tick(self, message: Callable[[], str]) -> None:
        elapsed = time.monotonic() - self.t0
        if self.progress is not None and elapsed - self.shown >= PROGRESS_EVERY_S:
            self.shown = elapsed
            self.progress(f"[{elapsed:6.1f} s] {message()}")


def _constant_columns(sweeps: pd.DataFrame, group_col: str, exclude: set[str]) -> pd.DataFrame:
    """Columns of ``sweeps`` constant within every group, one row per group (index = group)."""
    cols = [c for c in sweeps.columns if c not in exclude and c != group_col]
    keep = []
    grouped = sweeps.groupby(group_col, sort=False)
    for c in cols:
        try:
            if int(grouped[c].nunique(dropna=False).max()) <= 1:
                keep.append(c)
        except TypeError:  # unhashable cells (lists, dicts): cannot tell, do not carry
            continue
    return grouped[keep].first() if keep else pd.DataFrame()


def _invalid_rows(df: pd.DataFrame) -> np.ndarray:
    cap, p, t, sp, st = (df[c].to_numpy(dtype=float) for c in ("cap", "p", "t", "sp", "st"))
    with np.errstate(invalid="ignore"):
        good = np.isfinite(cap) & np.isfinite(p) & np.isfinite(t) & (cap > 0) & (p > 0) & (t > 0)
        return ~(good & ~(sp < 0) & ~(st < 0))


def _fmt(x: float) -> str:
    return f"{x:g}"


def _averaged_points(df: pd.DataFrame) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Every group's points after dropping invalid rows and averaging repeats, for the whole
    table at once: ``(codes, points)``, the group code (order of first appearance) of each
    point and the point columns, sorted by group then cap. P, T (and gpus) are arithmetic
    means of a cap's rows, their SEMs ``sqrt(sum sem^2) / n`` (NaN if any is missing)."""
    valid = ~df["bad"].to_numpy(bool)
    codes = df["code"].to_numpy()[valid]
    cols = {c: df[c].to_numpy(dtype=float)[valid] for c in ("cap", "p", "t", "sp", "st", "gpus")}
    order = np.lexsort((cols["cap"], codes))  # stable: repeats summed in input order
    codes, cols = codes[order], {c: a[order] for c, a in cols.items()}
    new = np.ones(codes.size, dtype=bool)
    new[1:] = (codes[1:] != codes[:-1]) | (cols["cap"][1:] != cols["cap"][:-1])
    starts = np.flatnonzero(new)
    n_rows = np.diff(np.r_[starts, codes.size])
    pts = {"cap": cols["cap"][starts], "n_rows": n_rows}
    if not starts.size:
        return codes[starts], {**pts, **{c: np.empty(0) for c in ("p", "t", "gpus", "sp", "st")}}
    for c in ("p", "t", "gpus"):
        pts[c] = np.add.reduceat(cols[c], starts) / n_rows
    for c in ("sp", "st"):  # NaN propagates through the sum, as wanted
        pts[c] = np.sqrt(np.add.reduceat(cols[c] ** 2, starts)) / n_rows
    return codes[starts], pts


def _group_max(codes: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group code, the largest value, NaN skipped (NaN where none)."""
    out = np.full(n_groups, -np.inf)
    keep = ~np.isnan(values)
    np.maximum.at(out, codes[keep], values[keep])
    out[np.isneginf(out)] = np.nan
    return out


def _nan_row(group: Any) -> dict[str, Any]:
    nan = float("nan")
    return dict(
        group=group,
        n_caps=0,
        pfi_ratio=nan,
        pfi_area=nan,
        pfi_elasticity=nan,
        ci95_low=nan,
        ci95_high=nan,
        pfi_robust=nan,
        pfi_robust_ci95_low=nan,
        pfi_robust_ci95_high=nan,
        robust_status="too_few_caps",
        n_binding=0,
        uncapped_cap_w=nan,
        uncapped_power_w=nan,
        uncapped_throughput=nan,
        per_cap="[]",
    )


def _analyse_all(
    df: pd.DataFrame, names: pd.Index, s: _Settings, clock: _Progress
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], _MonteCarloJob]]]:
    """Every group's row (``notes`` still lists) and the Monte Carlo jobs, run across groups
    by ``_monte_carlo_all``. The numbers are computed for all groups with the same number of
    points at once (``_Size``, padded-free (groups, n) arrays); only the notes and ``per_cap``
    JSON are written group by group."""
    n_groups = len(names)
    codes_all = df["code"].to_numpy()
    bad = df["bad"].to_numpy(bool)
    cap_all = df["cap"].to_numpy(dtype=float)
    top_cap_all = _group_max(codes_all, cap_all, n_groups)
    expected = _group_max(codes_all[~bad], df["expect"].to_numpy(dtype=float)[~bad], n_groups)
    bad_caps: dict[int, list[float]] = {}
    for code, cap in zip(codes_all[bad].tolist(), cap_all[bad].tolist()):
        bad_caps.setdefault(code, []).append(cap)
    codes, pts = _averaged_points(df)
    n_caps = np.bincount(codes, minlength=n_groups)
    first = np.r_[0, np.cumsum(n_caps)[:-1]]
    rows: list[dict[str, Any]] = [_nan_row(g) for g in names]
    notes: list[list[str]] = [[] for _ in range(n_groups)]
    statuses: list[set[str]] = [set() for _ in range(n_groups)]
    for code, caps in bad_caps.items():
        statuses[code].add("invalid_values")
        notes[code].append(
            f"invalid_values: dropped {len(caps)} row(s) with a missing or non-positive "
            f"cap/power/throughput or negative SEM (cap_w: {', '.join(map(_fmt, caps))})"
        )
    for code in np.unique(codes[pts["n_rows"] > 1]).tolist():
        at = slice(first[code], first[code] + n_caps[code])
        notes[code].append(
            "averaged repeats at cap_w "
            + ", ".join(
                f"{_fmt(c)} (n={k})"
                for c, k in zip(pts["cap"][at].tolist(), pts["n_rows"][at].tolist())
                if k > 1
            )
        )
    for code in np.flatnonzero(n_caps < 2).tolist():
        rows[code]["n_caps"] = int(n_caps[code])
        statuses[code].add("too_few_caps")
        notes[code].append(
            f"too_few_caps: {n_caps[code]} valid cap(s); need an uncapped and at "
            "least one capped point"
        )
    out, done = _Table(rows, notes, statuses, top_cap_all, expected), 0
    for n in np.unique(n_caps[n_caps >= 2]).tolist():
        members = np.flatnonzero(n_caps == n)
        index = first[members][:, None] + np.arange(n)
        _Size({c: a[index] for c, a in pts.items()}, s).write(members, out, s)
        done += len(members)
        clock.tick(lambda: f"PFI of {done} of {n_groups} groups")
    for code in range(n_groups):
        rows[code] = _finish(rows[code], statuses[code], notes[code])
    return rows, out.jobs


class _Points:
    """One group's points (views into its ``_Size`` arrays), what its Monte Carlo job needs."""

    def __init__(
        self, p: np.ndarray, sp: np.ndarray, t: np.ndarray, st: np.ndarray, included: np.ndarray
    ) -> None:
        self.p, self.sp, self.t, self.st, self.included, self.n = p, sp, t, st, included, len(p)


class _Size:
    """The analysis of all groups with the same number ``n`` of points, each (groups, n)
    array a group per row, sorted by cap; the last column is the uncapped reference. The
    same steps as the module docstring gives, on whole arrays."""

    def __init__(self, x: dict[str, np.ndarray], s: _Settings) -> None:
        self.cap, self.p, self.t, self.sp, self.st = (x[c] for c in ("cap", "p", "t", "sp", "st"))
        self.n_rows = x["n_rows"]
        g, n = self.p.shape
        ref = n - 1
        p, t = self.p, self.t
        p_ref, t_ref = p[:, [ref]], t[:, [ref]]
        capped = np.arange(n) < ref
        self.included = capped & eq1_counts(t, t_ref)  # Eq. 1's exclusion
        self.ratio = pfi_ratio_curves(p, t)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.terms = eq1_term(p, p_ref, t, t_ref)
            # pfi_area: trapezoid from (0, 0) through the points sorted by relative power
            xr, yr = p / p_ref, t / t_ref
            order = np.argsort(xr, axis=1, kind="stable")
            xs = np.concatenate([np.zeros((g, 1)), np.take_along_axis(xr, order, axis=1)], axis=1)
            ys = np.concatenate([np.zeros((g, 1)), np.take_along_axis(yr, order, axis=1)], axis=1)
            self.area = np.trapezoid(ys, xs, axis=1) - 0.5
            # pfi_elasticity: OLS slope of log T on log P in closed form (all values > 0 here)
            lx, ly = np.log(p), np.log(t)
            dx = lx - lx.mean(axis=1, keepdims=True)
            flat = np.ptp(p, axis=1) == 0
            self.elasticity = np.where(
                flat,
                np.nan,
                1.0
                - (dx * (ly - ly.mean(axis=1, keepdims=True))).sum(axis=1)
                / np.where(flat, 1.0, (dx**2).sum(axis=1)),
            )
        self.sem_ok = (
            s.has_sem & np.isfinite(self.sp).all(axis=1) & np.isfinite(self.st).all(axis=1)
        )
        ok = self.sem_ok[:, None]
        noise_p = np.where(ok, s.z * np.hypot(self.sp, self.sp[:, [ref]]), s.rel_tol * p_ref)
        noise_t = np.where(ok, s.z * np.hypot(self.st, self.st[:, [ref]]), s.rel_tol * t_ref)
        noise_t_own = np.where(ok, s.z * self.st, s.rel_tol * t)
        power_near_cap = p / x["gpus"] >= (1 - s.power_tol) * self.cap
        t_sig_below = t_ref - t > noise_t
        self.flags = {
            "capped_faster": capped & (t > t_ref),
            "capped_more_power": capped & (p >= p_ref),
            "nonbinding_cap": capped & ~power_near_cap & ~t_sig_below,
            "ill_conditioned": self.included & (np.abs(t_ref - t) <= noise_t),
        }
        # Robust: monotone fit over all points, Eq. 1 on binding points that lost throughput
        self.binding = capped & (p_ref - p > noise_p) & (power_near_cap | t_sig_below)
        with np.errstate(divide="ignore"):
            self.weight = np.where(ok, 1.0 / np.maximum(self.st, 1e-12 * t) ** 2, 1.0)
        self.fit = self._isotonic()
        self.moved = np.abs(self.fit - t) > noise_t_own
        fit_ref = self.fit[:, [ref]]
        self.pooled = self.fit >= fit_ref * (1 - _POOL_RTOL)
        self.no_loss = fit_ref - self.fit <= noise_t  # pooled, or a loss within noise: noise/noise
        self.used = self.binding & ~self.no_loss
        with np.errstate(divide="ignore", invalid="ignore"):
            self.robust_terms = np.where(
                self.used, eq1_term(p, p_ref, self.fit, self.fit[:, [ref]]), np.nan
            )
            n_used = self.used.sum(axis=1)
            self.robust = np.where(
                n_used > 0,
                np.where(self.used, self.robust_terms, 0.0).sum(axis=1) / np.maximum(n_used, 1),
                np.nan,
            )
        self.n_binding = self.binding.sum(axis=1)

    def _isotonic(self) -> np.ndarray:
        """``isotonic_fit`` of every row: rows already non-decreasing in power are their own fit,
        rows with equal powers go to scikit-learn one by one (they need its pooling of ties),
        the others to the vectorised ``isotonic_fit_batch``."""
        p, t = self.p, self.t
        order = np.argsort(p, axis=1, kind="stable")
        ps, ts = np.take_along_axis(p, order, axis=1), np.take_along_axis(t, order, axis=1)
        ties = (np.diff(ps, axis=1) == 0).any(axis=1)
        fit = t.copy()
        batch = np.flatnonzero(~ties & (np.diff(ts, axis=1) < 0).any(axis=1))
        if batch.size:
            fit[batch] = isotonic_fit_batch(p[batch], t[batch], self.weight[batch])
        for i in np.flatnonzero(ties):
            fit[i] = isotonic_fit(p[i], t[i], self.weight[i] if self.sem_ok[i] else None)
        return fit

    def write(self, members: np.ndarray, out: _Table, s: _Settings) -> None:
        """Each group's row, notes and statuses into ``out`` (``members``: the group codes, one
        per row of the arrays), and its Monte Carlo job if it has CIs."""
        writer = _GroupWriter(self, out, s)
        for k, code in enumerate(members.tolist()):
            writer.write(k, code)


class _Table:
    """What ``_analyse_all`` fills, by group code: each group's row, notes and statuses; the
    Monte Carlo jobs; the caps the uncapped reference is checked against (the highest cap
    of any of its rows, valid or not, and the uncapped cap expected)."""

    def __init__(
        self,
        rows: list[dict[str, Any]],
        notes: list[list[str]],
        statuses: list[set[str]],
        top_cap: np.ndarray,
        expected: np.ndarray,
    ) -> None:
        self.rows, self.notes, self.statuses = rows, notes, statuses
        self.top_cap, self.expected = top_cap, expected
        self.jobs: list[tuple[dict[str, Any], _MonteCarloJob]] = []


class _GroupWriter:
    """``_Size.write``'s steps for one group (row ``k`` of the arrays, group code ``code``):
    the numbers, the notes on the reference, on the points and on the robust PFI, the CI job,
    the ``per_cap`` JSON. The arrays are read as Python lists made once per size: indexing
    numpy element by element costs several times more."""

    def __init__(self, size: _Size, out: _Table, s: _Settings) -> None:
        self.size, self.out, self.s = size, out, s
        self.n = size.p.shape[1]
        self.ref = self.n - 1
        self.cap, self.p, self.t = size.cap.tolist(), size.p.tolist(), size.t.tolist()
        self.sp, self.st, self.n_rows = size.sp.tolist(), size.st.tolist(), size.n_rows.tolist()
        self.flags = {k: v.tolist() for k, v in size.flags.items()}
        self.flag_any = {k: v.any(axis=1).tolist() for k, v in size.flags.items()}
        self.included, self.binding = size.included.tolist(), size.binding.tolist()
        self.pooled, self.no_loss = size.pooled.tolist(), size.no_loss.tolist()
        with np.errstate(divide="ignore", invalid="ignore"):
            self.terms = np.where(size.included, size.terms, np.nan).tolist()
        self.fit, self.robust_terms = size.fit.tolist(), size.robust_terms.tolist()
        self.moved_any, self.used_any = (
            size.moved.any(axis=1).tolist(),
            size.used.any(axis=1).tolist(),
        )
        self.sem_ok = size.sem_ok.tolist()
        self.sem_finite = (np.isfinite(size.sp) & np.isfinite(size.st)).tolist()
        self.ratio, self.area, self.elasticity = (
            size.ratio.tolist(),
            size.area.tolist(),
            size.elasticity.tolist(),
        )
        self.robust, self.n_binding = size.robust.tolist(), size.n_binding.tolist()

    def write(self, k: int, code: int) -> None:
        row, note, status = self.out.rows[code], self.out.notes[code], self.out.statuses[code]
        self.numbers(k, row)
        self.reference_notes(k, code, note, status)
        self.point_notes(k, note, status)
        self.robust_status(k, row, note, status)
        self.ci(k, row, note)
        row["per_cap"] = self.per_cap(k)

    def caps_where(self, k: int, at: list[bool]) -> str:
        """The caps of group ``k`` where ``at`` holds, for a note."""
        return ", ".join(_fmt(self.cap[k][i]) for i in range(self.n) if at[i])

    def numbers(self, k: int, row: dict[str, Any]) -> None:
        ref = self.ref
        row.update(
            n_caps=self.n,
            uncapped_cap_w=self.cap[k][ref],
            uncapped_power_w=self.p[k][ref],
            uncapped_throughput=self.t[k][ref],
            pfi_ratio=self.ratio[k],
            pfi_area=self.area[k],
            pfi_elasticity=self.elasticity[k],
            n_binding=self.n_binding[k],
        )

    def reference_notes(self, k: int, code: int, note: list[str], status: set[str]) -> None:
        """missing_uncapped: the reference is not the uncapped run."""
        ref_cap, top, expected = (
            self.cap[k][self.ref],
            self.out.top_cap[code],
            self.out.expected[code],
        )
        if np.isfinite(top) and top > ref_cap:
            status.add("missing_uncapped")
            note.append(
                f"missing_uncapped: the rows at the highest cap {_fmt(top)} W were "
                f"invalid; reference is cap {_fmt(ref_cap)} W"
            )
        elif np.isfinite(expected) and ref_cap < expected:
            status.add("missing_uncapped")
            note.append(
                f"missing_uncapped: highest cap {_fmt(ref_cap)} W is below the uncapped "
                f"{_fmt(expected)} W; PFIs are relative to a capped run"
            )

    def point_notes(self, k: int, note: list[str], status: set[str]) -> None:
        """Eq. 1's exclusions, a flat power, SEMs taken as rel_tol, the point flags, non_monotone."""
        ref, c, pk, tk = self.ref, self.cap[k], self.p[k], self.t[k]
        equal = [i for i in range(ref) if tk[i] == tk[ref]]
        if len(equal) == ref:
            note.append("pfi_ratio: every capped point has T == T_max exactly, no term left")
        elif equal:
            note.append(
                "pfi_ratio: Eq. 1 excludes cap_w "
                + ", ".join(_fmt(c[i]) for i in equal)
                + " (T == T_max)"
            )
        if max(pk) == min(pk):
            note.append("pfi_elasticity: all points at the same power, no fit")
        if not self.sem_ok[k]:
            why = "SEM missing at some cap" if self.s.has_sem else "no SEMs"
            note.append(f"{why}: noise taken as rel_tol={_fmt(self.s.rel_tol)} of the reference")
        for name, flagged in self.flags.items():
            if self.flag_any[name][k]:
                status.add(name)
                note.append(f"{name} at cap_w " + self.caps_where(k, flagged[k]))
        if self.moved_any[k]:
            status.add("non_monotone")
            note.append(
                "non_monotone: the monotone fit moved throughput beyond noise at cap_w "
                + self.caps_where(k, self.size.moved[k])
            )

    def robust_status(self, k: int, row: dict[str, Any], note: list[str], status: set[str]) -> None:
        """pfi_robust, or why there is none."""
        n_binding = self.n_binding[k]
        if n_binding < 2:
            row["robust_status"] = "too_few_binding"
            note.append(f"too_few_binding: {n_binding} binding cap(s), pfi_robust needs 2")
        elif not self.used_any[k]:
            row["robust_status"] = "no_throughput_loss"
            note.append(
                "no_throughput_loss: no binding cap lost throughput beyond noise in the "
                "monotone fit (PFI unbounded over the swept range)"
            )
        else:
            row["robust_status"] = "ok"
            row["pfi_robust"] = self.robust[k]
        if row["robust_status"] != "ok":
            status.add(row["robust_status"])

    def ci(self, k: int, row: dict[str, Any], note: list[str]) -> None:
        """The group's Monte Carlo job, or why it has no CI. The job's notes come last, as the
        row's last notes (the status does not depend on them)."""
        s, size = self.s, self.size
        if s.mc_samples <= 0:
            note.append("no CI: mc_samples=0")
        elif not s.has_sem:
            note.append("no CI: no SEM columns given")
        elif not self.sem_ok[k]:
            note.append(
                "no CI: SEM missing at cap_w "
                + ", ".join(
                    _fmt(self.cap[k][i]) for i in range(self.n) if not self.sem_finite[k][i]
                )
            )
        else:
            points = _Points(size.p[k], size.sp[k], size.t[k], size.st[k], size.included[k])
            used = size.used[k] if row["robust_status"] == "ok" else None
            self.out.jobs.append((row, _MonteCarloJob(points, used, size.weight[k])))

    def per_cap(self, k: int) -> str:
        """The capped points of group ``k`` as JSON, with their point flags."""
        ref, c, pk, tk = self.ref, self.cap[k], self.p[k], self.t[k]
        sp, st, n_rows, terms = self.sp[k], self.st[k], self.n_rows[k], self.terms[k]
        binding, fit, pooled, no_loss = (
            self.binding[k],
            self.fit[k],
            self.pooled[k],
            self.no_loss[k],
        )
        included, robust_terms, flags = self.included[k], self.robust_terms[k], self.flags
        return json.dumps(
            [
                {
                    "cap_w": c[i],
                    "power_w": pk[i],
                    "throughput": tk[i],
                    "n_rows": n_rows[i],
                    "power_w_sem": _finite(sp[i]),
                    "throughput_sem": _finite(st[i]),
                    "power_ratio": _finite(pk[i] / pk[ref]),
                    "throughput_ratio": _finite(tk[i] / tk[ref]),
                    "term": _finite(terms[i]),
                    "binding": binding[i],
                    "robust_throughput": _finite(fit[i]),
                    "robust_term": _finite(robust_terms[i]),
                    "flags": [f for f in _POINT_STATUS_FLAGS if flags[f][k][i]]
                    + (["excluded_t_equals_tmax"] if not included[i] else [])
                    + (["pooled_with_uncapped"] if binding[i] and pooled[i] else [])
                    + (
                        ["loss_within_noise"] if binding[i] and no_loss[i] and not pooled[i] else []
                    ),
                }
                for i in range(ref)
            ],
            allow_nan=False,
        )


def _finite(v: float) -> float | None:
    """JSON-safe: NaN/inf to null."""
    return v if math.isfinite(v) else None


class _MonteCarloJob:
    """What one group's CIs need: its points, the points of its robust PFI (None: no robust
    CI) and the isotonic weights."""

    def __init__(self, x: _Points, robust_used: np.ndarray | None, weight: np.ndarray) -> None:
        self.x, self.robust_used, self.weight = x, robust_used, weight


# Resampled rows (groups x mc_samples) per batch: bounds the (rows, n, n) isotonic blocks
# to ~100 MB at n = 6 points.
_MC_ROWS_PER_BATCH = 100_000


# glibc mallopt parameters (malloc.h) and values: each batch allocates and frees tens of MB of
# ~1 MB arrays; by default glibc hands that memory back to the OS after each batch (heap trim),
# so the next batch page-faults it in again: 2,000 bench groups 3.9 CPU-s by default, 1.8 CPU-s
# with freed memory kept (h27b, benchmarks/results/pfi_scale.md).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_TRIM_THRESHOLD_B = 256 * 2**20  # freed memory kept for reuse, at most
_MMAP_THRESHOLD_B = 32 * 2**20  # glibc's largest: arrays below it come from the reusable heap


@functools.cache  # a process-wide setting: asked once, not on every pfi_table call
def _keep_freed_memory() -> None:
    """Ask glibc (if this is glibc) to keep freed memory for reuse instead of returning it
    to the OS and faulting it in again at the next batch; elsewhere nothing is done."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)  # the process's own symbols: libc's where it is linked in
        if hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version"):
            libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_B)
            libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_B)
    except OSError:  # no loadable C library: the defaults stay
        pass


def _monte_carlo_all(
    jobs: list[tuple[dict[str, Any], _MonteCarloJob]], s: _Settings, clock: _Progress
) -> None:
    """Percentile CIs of pfi_ratio and pfi_robust for every job's row, written into it, from
    N(mean, sem) resamples of every point; the sets of terms are those of the point
    estimates. Groups with the same number of points share one draw of standard normals
    (seeded from seed and that number, so a group's CI does not depend on the other groups)
    and are stacked, in batches: numbers identical to one group at a time."""
    _keep_freed_memory()
    by_size: dict[int, list[tuple[dict[str, Any], _MonteCarloJob]]] = {}
    for item in jobs:
        by_size.setdefault(item[1].x.n, []).append(item)
    per_batch = max(1, _MC_ROWS_PER_BATCH // max(s.mc_samples, 1))
    done = 0
    for n, items in by_size.items():
        z = np.random.default_rng([s.seed, n]).standard_normal((2, s.mc_samples, n))
        z = np.ascontiguousarray(
            z.transpose(0, 2, 1)
        )  # (2, n, mc_samples): each point's draws contiguous
        for batch in (items[i : i + per_batch] for i in range(0, len(items), per_batch)):
            _monte_carlo_batch(batch, z, s)
            done += len(batch)
        clock.tick(lambda: f"Monte Carlo CIs of {done} of {len(jobs)} groups")


def _monte_carlo_batch(
    batch: list[tuple[dict[str, Any], _MonteCarloJob]], z: np.ndarray, s: _Settings
) -> None:
    """``_monte_carlo_all`` on groups of one size; ``z`` the shared standard normals of P and
    T, (2, mc_samples, n). Column by column: each point's resamples are one contiguous
    (groups, mc_samples) array, so a sweep's few points cost a few passes over memory."""
    jobs = [job for _, job in batch]
    n, ref = jobs[0].x.n, jobs[0].x.n - 1
    stack = lambda name: np.stack([getattr(job.x, name) for job in jobs])  # noqa: E731  (groups, n)
    p, sp, t, st, included = stack("p"), stack("sp"), stack("t"), stack("st"), stack("included")
    ps = [p[:, [i]] + sp[:, [i]] * z[0, i] for i in range(n)]
    ts = [t[:, [i]] + st[:, [i]] * z[1, i] for i in range(n)]
    with np.errstate(invalid="ignore", divide="ignore"):
        terms = [eq1_term(ps[i], ps[ref], ts[i], ts[ref]) for i in range(ref)]
        ratio = (
            sum(np.where(included[:, [i]], terms[i], 0.0) for i in range(ref))
            / included.sum(axis=1)[:, None]
        )
    robust_rows = np.asarray(
        [i for i, job in enumerate(jobs) if job.robust_used is not None], dtype=int
    )
    robust = unbounded = None
    if robust_rows.size:
        pick = (lambda a: a) if robust_rows.size == len(jobs) else (lambda a: a[robust_rows])  # noqa: E731  (no copy)
        robust, unbounded = _robust_resamples(
            [pick(a) for a in ps],
            [pick(a) for a in ts],
            [pick(a) for a in terms],
            np.stack([jobs[i].robust_used for i in robust_rows]),
            np.stack([jobs[i].weight for i in robust_rows]),
        )
    nan, robust_of = (float("nan"), float("nan")), {i: j for j, i in enumerate(robust_rows)}
    q = [s.alpha / 2, 1 - s.alpha / 2]
    ratio_q = np.quantile(ratio, q, axis=1).T  # one call for the batch: (groups, 2)
    ratio_unbounded = (~np.isfinite(ratio)).mean(axis=1)
    robust_q = np.quantile(robust, q, axis=1).T if robust is not None else None
    for i, (row, job) in enumerate(batch):
        notes = row["notes"]
        ratio_ci = (
            _interval(ratio_q[i], ratio_unbounded[i], notes, "ci95")
            if job.x.included.any()
            else nan
        )
        robust_ci = nan
        if job.robust_used is not None:
            j = robust_of[i]
            robust_ci = _interval(robust_q[j], unbounded[j], notes, "pfi_robust_ci95")
        row["ci95_low"], row["ci95_high"] = ratio_ci
        row["pfi_robust_ci95_low"], row["pfi_robust_ci95_high"] = robust_ci


def _robust_resamples(
    ps: list[np.ndarray],
    ts: list[np.ndarray],
    terms: list[np.ndarray],
    used: np.ndarray,
    weight: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The robust PFI of every resample, (groups, mc_samples), and each group's fraction of
    unbounded resamples (+inf: no used point lost throughput). ``ps, ts`` per point,
    ``terms`` Eq. 1 on the raw resamples per capped point, ``used`` (groups, n) the point
    estimate's contributing points. A resample already sorted by power with throughput
    non-decreasing is its own isotonic fit (its terms are ``terms``); only the others are refit."""
    n, ref = len(ps), len(ps) - 1
    ordered = np.ones(ps[0].shape, dtype=bool)
    for i in range(ref):
        ordered &= (ps[i + 1] >= ps[i]) & (ts[i + 1] >= ts[i])
    robust = _robust_mean(ts, terms, used)
    refit = np.nonzero(~ordered)  # (group, resample) pairs
    if refit[0].size:
        fitted = isotonic_fit_batch(
            np.stack([a[refit] for a in ps], axis=1),
            np.stack([a[refit] for a in ts], axis=1),
            weight[refit[0]],
        )
        fits = [fitted[:, [i]] for i in range(n)]  # (pairs, 1): one resample a row
        power = [a[refit][:, None] for a in ps]
        with np.errstate(invalid="ignore", divide="ignore"):
            refit_terms = [eq1_term(power[i], power[ref], fits[i], fits[ref]) for i in range(ref)]
        robust[refit] = _robust_mean(fits, refit_terms, used[refit[0]])[:, 0]
    return robust, np.isinf(robust).mean(axis=1)


def _robust_mean(fits: list[np.ndarray], terms: list[np.ndarray], used: np.ndarray) -> np.ndarray:
    """Mean of the Eq. 1 ``terms`` of the used points that lost throughput in ``fits`` (per
    point, each (groups, resamples); ``used`` (groups, n)), +inf where none did."""
    ref = len(fits) - 1
    total = np.zeros(fits[0].shape)
    counts = np.zeros(fits[0].shape, dtype=int)
    below = fits[ref] * (1 - _POOL_RTOL)
    for i in np.flatnonzero(used[:, :ref].any(axis=0)):  # a point no group uses adds nothing
        lost = used[:, [i]] & (fits[i] < below)
        counts += lost
        np.add(total, terms[i], out=total, where=lost & ~np.isnan(terms[i]))
    # a resample where no point lost throughput has an unbounded PFI
    return np.where(counts > 0, total / np.maximum(counts, 1), np.inf)


def _interval(
    bounds: np.ndarray, unbounded: float, notes: list[str], label: str
) -> tuple[float, float]:
    """The percentile interval ``bounds``; ``unbounded`` the fraction of resamples with an
    unbounded PFI. NaN is never returned silently: a bound that is not finite becomes NaN
    with a note."""
    lo, hi = bounds
    if unbounded:
        notes.append(f"{label}: {unbounded:.1%} of resamples unbounded (no throughput loss)")
    if not np.isfinite(hi):
        notes.append(f"{label}: upper bound unbounded, reported NaN")
    if not np.isfinite(lo):
        notes.append(f"{label}: lower bound unbounded, reported NaN")
    return (
        float(lo) if np.isfinite(lo) else float("nan"),
        float(hi) if np.isfinite(hi) else float("nan"),
    )


def _finish(row: dict[str, Any], statuses: set[str], notes: list[str]) -> dict[str, Any]:
    row["status"] = next((st for st in STATUSES if st in statuses), "ok")
    for key in ("pfi_ratio", "pfi_area", "pfi_elasticity", "pfi_robust"):
        if not np.isfinite(row[key]):
            row[key] = float("nan")
    row["notes"] = notes  # joined once the Monte Carlo notes are in (pfi_table)
    return row
