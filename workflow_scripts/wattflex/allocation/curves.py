"""A job as its measured power -> throughput curve, and what follows from the curve alone.

A job is its measured power-throughput points (one per cap; repeats averaged). Between its
lowest and highest measured power its throughput is the piecewise-linear interpolant; it
cannot go below its lowest-cap power (*floor*) nor above its uncapped power (*ceiling*, the
highest-power point; ``T_max`` is the throughput there). Allocated power maps back to a
per-GPU cap by inverting the measured cap -> power relation piecewise-linearly (or
``power / gpus`` when no caps are known, a cap the job cannot exceed).

**SLA tiers**: a job's maximum slowdown ``s`` becomes a raised floor (:func:`sla_floor`),
the lowest power from which throughput stays >= ``(1 - s) * T_max`` up to the uncapped
point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from wattflex.allocation.oracle import RTOL, concave_hull, interp
from wattflex.pfi import isotonic_fit_batch
from wattflex.run_ids import cap_rows  # noqa: F401 (also the curves' users' import)


@dataclass(frozen=True)
class Curves:
    """Piecewise-linear power -> throughput curves, arrays of shape (..., n_jobs, K).

    Points are sorted by power with distinct powers; shorter curves are padded by
    repeating their last point (a zero-width segment). ``cap_w`` (optional) is the per-GPU
    cap at each point.
    """

    power_w: np.ndarray
    throughput: np.ndarray
    cap_w: np.ndarray | None = None

    @property
    def floor_w(self) -> np.ndarray:
        return self.power_w[..., 0]

    @property
    def ceiling_w(self) -> np.ndarray:
        return self.power_w[..., -1]

    @property
    def uncapped_throughput(self) -> np.ndarray:
        return self.throughput[..., -1]

    def take(self, index: np.ndarray) -> Curves:
        """Curves of jobs ``index`` (any shape) out of a (n_groups, K) table."""
        return Curves(
            self.power_w[index],
            self.throughput[index],
            None if self.cap_w is None else self.cap_w[index],
        )

    def throughput_at(self, power_w: np.ndarray) -> np.ndarray:
        return interp(self.power_w, self.throughput, power_w)

    def restrict(self, lo_w: np.ndarray, hi_w: np.ndarray | None = None) -> Curves:
        """The same curves on ``[lo_w, hi_w]`` (points outside collapse onto the ends)."""
        hi = self.ceiling_w if hi_w is None else hi_w
        P = np.clip(self.power_w, np.asarray(lo_w)[..., None], np.asarray(hi)[..., None])
        cap = None if self.cap_w is None else interp(self.power_w, self.cap_w, P)
        return Curves(P, self.throughput_at(P), cap)


def curves_from_points(
    job: Sequence[Any],
    power_w: Sequence[float],
    throughput: Sequence[float],
    cap_w: Sequence[float] | None = None,
) -> tuple[list[Any], Curves]:
    """Build curves from long-format points (one row per job and measured point).

    Points of a job at the same power are averaged. Returns the job ids (first-seen order)
    and their curves. Vectorised (no per-job Python loop): 33,000 jobs take well under a
    second.
    """
    df = pd.DataFrame(
        {
            "job": list(job),
            "power_w": np.asarray(power_w, float),
            "throughput": np.asarray(throughput, float),
        }
    )
    df["cap_w"] = np.nan if cap_w is None else np.asarray(cap_w, float)
    bad = ~np.isfinite(df[["power_w", "throughput"]]).all(axis=1) | (df["power_w"] < 0)
    if bad.any():
        raise ValueError(
            f"non-finite or negative power/throughput for job(s) "
            f"{sorted(map(str, df.loc[bad, 'job'].unique()))[:5]}"
        )
    if df["job"].isna().any():
        raise ValueError("missing job id in the curve points")
    codes, uniques = pd.factorize(df["job"], sort=False)  # first-seen order
    jobs = list(uniques)
    if not len(jobs):
        raise ValueError("no curve points")
    df["_code"] = codes
    merged = df.groupby(["_code", "power_w"], sort=True, as_index=False)[
        ["throughput", "cap_w"]
    ].mean()
    code = merged["_code"].to_numpy()
    counts = np.bincount(code, minlength=len(jobs))
    K = int(counts.max())
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    # row of ``merged`` holding point k of job i (padding repeats the job's last point)
    rows = start[:, None] + np.minimum(np.arange(K)[None, :], counts[:, None] - 1)
    P = merged["power_w"].to_numpy()[rows]
    T = merged["throughput"].to_numpy()[rows]
    C = merged["cap_w"].to_numpy()[rows]
    has_cap = cap_w is not None and np.isfinite(C).all()
    return jobs, Curves(P, T, C if has_cap else None)


MAX_JOB_POWER_W = 1e9  # a gigawatt: a whole AI data centre, not one job


def check_points(points: pd.DataFrame, source: str | None = None, single_ok: bool = False) -> None:
    """Refuse curve points that would give a wrong allocation, with one line naming the job
    and (for a file ``source``) its line: a missing job id, power or throughput that is not
    a positive finite number, two rows of a job at the same power with different
    throughput, and (unless ``single_ok``: an offer reports such a job as one that cannot
    shed) a job with a single measured power (no curve: floor == ceiling)."""

    def where(pos: int) -> str:
        if source is None:
            return f"row {pos + 1}"
        if str(source).endswith((".parquet", ".pq")):
            return f"{source}: row {pos + 1}"
        return f"{source}:{pos + 2}"  # line 1 is the header

    def more(n: int) -> str:
        return f" (and {n - 1} more such row(s))" if n > 1 else ""

    job = points["job"]
    missing = np.flatnonzero(job.isna().to_numpy())
    if missing.size:
        raise ValueError(f"{where(missing[0])}: missing job id{more(missing.size)}")
    for col in ("power_w", "throughput"):
        v = pd.to_numeric(points[col], errors="coerce").to_numpy(float)
        bad = np.flatnonzero(~(np.isfinite(v) & (v > 0)))
        if bad.size:
            i, raw = bad[0], points[col].iloc[bad[0]]
            shown = repr(raw) if isinstance(raw, str) else str(raw)
            raise ValueError(
                f"{where(i)}: job {job.iloc[i]!r}: {col} {shown} is not a positive "
                f"finite number{more(bad.size)}"
            )
        # Budgets and shares are sums over jobs: values whose sum overflows (1e308) would make
        # the cut silently inf or nan. No GPU job draws a gigawatt (the largest AI sites do).
        limit = MAX_JOB_POWER_W if col == "power_w" else np.finfo(float).max / max(len(v), 1)
        over = np.flatnonzero(v > limit)
        if over.size:
            i = over[0]
            hint = (
                "not watts: check the units"
                if col == "power_w"
                else "too large to add up: rescale the column"
            )
            raise ValueError(
                f"{where(i)}: job {job.iloc[i]!r}: {col} {v[i]:.4g} is above {limit:.3g} "
                f"({hint}){more(over.size)}"
            )
    df = pd.DataFrame(
        {
            "job": job.to_numpy(),
            "power_w": points["power_w"].to_numpy(float),
            "throughput": points["throughput"].to_numpy(float),
        }
    )
    first = df.groupby(["job", "power_w"], sort=False)["throughput"].transform("first").to_numpy()
    conflict = np.flatnonzero(first != df["throughput"].to_numpy())
    if conflict.size:
        i = conflict[0]
        j, p = df["job"].iloc[i], df["power_w"].iloc[i]
        f = int(np.flatnonzero((df["job"] == j).to_numpy() & (df["power_w"] == p).to_numpy())[0])
        raise ValueError(
            f"{where(i)}: job {j!r}: power_w {p:g} is already measured at {where(f)} with "
            f"throughput {first[i]:g}, here {df['throughput'].iloc[i]:g} (conflicting duplicate; "
            f"average the repeats or drop one){more(conflict.size)}"
        )
    n_powers = df.groupby("job", sort=False)["power_w"].transform("nunique").to_numpy()
    single = np.flatnonzero(n_powers < 2) if not single_ok else np.array([], int)
    if single.size:
        i = single[0]
        n_jobs = df["job"].iloc[single].nunique()
        raise ValueError(
            f"{where(i)}: job {job.iloc[i]!r} has a single measured power ({df['power_w'].iloc[i]:g} W); "
            f"a curve needs at least its lowest-cap and its uncapped point"
            + (f" (and {n_jobs - 1} more such job(s))" if n_jobs > 1 else "")
        )


def monotone_fit(curves: Curves) -> tuple[Curves, np.ndarray]:
    """Curves whose throughput falls somewhere as power rises, replaced by their isotonic
    (least-squares non-decreasing) fit over their own points; returns the curves and the
    per-job mask of those fitted. Monotone curves are returned unchanged (same arrays)."""
    T = curves.throughput
    fitted = (np.diff(T, axis=-1) < 0).any(-1)
    if not fitted.any():
        return curves, fitted
    T = T.copy()
    P = curves.power_w
    # fit each job over its distinct points only (padding repeats the last one)
    n_pts = 1 + (np.diff(P, axis=-1) > 0).sum(-1)
    for m in np.unique(n_pts[fitted]):
        rows = np.flatnonzero(fitted & (n_pts == m))
        fit = isotonic_fit_batch(P[rows, :m], T[rows, :m])
        T[rows, :m] = fit
        T[rows, m:] = fit[:, -1:]
    return Curves(P, T, curves.cap_w), fitted


def curves_from_runs(runs: pd.DataFrame) -> tuple[list[str], Curves]:
    """One curve per group of ``runs.parquet`` rows: (power_w, tokens_per_s) per cap_w,
    repeats averaged (cap groups only: :func:`cap_rows`)."""
    runs = cap_rows(runs)
    pts = runs.groupby(["group", "cap_w"], sort=True, as_index=False)[
        ["power_w", "tokens_per_s"]
    ].mean()
    return curves_from_points(pts["group"], pts["power_w"], pts["tokens_per_s"], pts["cap_w"])


def is_concave(curves: Curves) -> np.ndarray:
    """Per job: the curve equals its concave envelope (the greedy alone is then exact)."""
    hull = concave_hull(curves.power_w, curves.throughput)
    tol = RTOL * (np.abs(curves.throughput).max(-1, keepdims=True) + 1.0)
    return np.all(curves.throughput >= hull - tol, axis=-1)


def power_to_cap(
    curves: Curves, power_w: np.ndarray, gpus: np.ndarray | None = None
) -> np.ndarray | None:
    """Per-GPU cap that gives each job its allocated power: the measured cap -> power relation
    inverted piecewise-linearly; without measured caps, ``power_w / gpus``; else None."""
    if curves.cap_w is not None:
        return interp(curves.power_w, curves.cap_w, power_w)
    if gpus is not None:
        return np.asarray(power_w, float) / np.asarray(gpus, float)
    return None


def sla_floor(curves: Curves, max_slowdown: np.ndarray) -> np.ndarray:
    """Lowest power from which throughput stays >= ``(1 - max_slowdown) * T_max`` all the
    way up to the uncapped point (NaN slowdown = no constraint)."""
    P, T = curves.power_w, curves.throughput
    s = np.asarray(max_slowdown, float)
    target = np.where(np.isfinite(s), (1.0 - s) * curves.uncapped_throughput, -np.inf)
    tol = RTOL * (np.abs(T).max(-1) + 1.0)
    below = T < (target - tol)[..., None]
    K = P.shape[-1]
    # last vertex below target; the crossing lies on the segment that starts there
    last = K - 1 - np.argmax(below[..., ::-1], axis=-1)
    any_below = below.any(-1)
    k = np.minimum(last, K - 2) if K > 1 else np.zeros_like(last)
    take = lambda a, i: np.take_along_axis(a, i[..., None], -1)[..., 0]  # noqa: E731
    if K == 1:
        return P[..., 0].copy()
    p0, p1, t0, t1 = take(P, k), take(P, k + 1), take(T, k), take(T, k + 1)
    rise = t1 - t0
    frac = np.divide(target - t0, rise, out=np.ones_like(rise), where=rise > 0)
    cross = p0 + np.clip(frac, 0.0, 1.0) * (p1 - p0)
    return np.where(any_below, cross, P[..., 0])
