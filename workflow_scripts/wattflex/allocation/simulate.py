"""Splitting a cluster power cut across running training jobs (paper §6, and beyond).

**Model.** A job is its measured power–throughput points (one per cap; repeats averaged).
Between its lowest and highest measured power its throughput is the piecewise-linear
interpolant; it cannot go below its lowest-cap power (*floor*) nor above its uncapped
power (*ceiling*, the highest-power point; ``T_max`` is the throughput there). The cluster
budget is ``(1 - cut) * sum(ceiling)``; a policy returns each job's power with total <=
budget. Allocated power maps back to a per-GPU cap by inverting the measured cap -> power
relation piecewise-linearly (or ``power / gpus`` when no caps are known, a cap the job
cannot exceed).

**Policies** (``C_i`` = job i's share of the cut, ``sum C_i = sum ceiling - budget``):

- ``equal-weight``: ``C_i ∝ P_max_i``;
- ``pfi-aware``: ``C_i ∝ (P_max_i / T_max_i) * PFI_i`` with PFI *predicted* from uncapped
  telemetry (``pfi-aware-measured``: the measured PFI, a reference for the predictor);
- ``moe-ft-weighted``: equal weight, MoE fine-tuning jobs take ``moe_ft_share`` (2x) the share;
- ``raw-dcgm``: ``C_i ∝`` DRAM copy product (``dram_active * mem_copy_util``);
- all four **water-fill**: a job whose share would take it below its floor stops there and
  the rest of its share is spread over the others in the same proportions, so the budget
  is met exactly whenever the floors allow it (jobs with zero weight are cut last, in
  proportion to their headroom);
- ``oracle``: the throughput-maximising allocation, exact for piecewise-linear curves of
  any shape (:mod:`wattflex.allocation.oracle`);
- ``curve-aware`` (beyond the paper): the oracle applied to curves *predicted* from
  uncapped telemetry, no sweep. The family: ``T(P) = T_max * (P / P_max) ** beta`` on
  the job's ``[floor, ceiling]``, sampled at ``curve_nodes`` evenly spaced powers, with
  ``beta`` chosen so that the family's ratio PFI (paper Eq. 1 over those nodes) equals the
  predicted PFI (PFI > 1 gives a concave curve, beta < 1). Only ``P_max``, ``T_max``, the
  floor (the lowest cap's power, about ``min_cap * gpus`` when the cap binds) and the
  predicted PFI are used.

**SLA tiers** (beyond the paper): a job's maximum slowdown ``s`` becomes a raised floor,
the lowest power from which throughput stays >= ``(1 - s) * T_max`` up to the uncapped
point; every policy then works on ``[raised floor, ceiling]``, so all of them honour the
tiers. ``curve-aware`` can only raise floors on its *predicted* curve, so it may miss a
tier (reported). When the raised floors exceed the budget the cut is infeasible:
:func:`allocate` reports ``feasible = False`` (the CLI exits with an error).

**Simulation** (:func:`simulate`): workloads of jobs drawn from the campaign's groups
("random": uniform with replacement; "production": a job is pretraining with probability
``pretraining_fraction``, else fine-tuning, then uniform within its kind), every policy at
every cut; summaries, the paper's headline, SLA tiers and an out-of-sample check
(policies fitted on one half of the groups, evaluated on workloads of the other half).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from wattflex.allocation import oracle as _oracle
from wattflex.allocation.oracle import interp

log = logging.getLogger("wattflex.allocation.simulate")

WEIGHTED_POLICIES = ("equal-weight", "pfi-aware", "pfi-aware-measured", "moe-ft-weighted", "raw-dcgm")
POLICIES = WEIGHTED_POLICIES + ("curve-aware", "oracle")
# Per-job inputs each policy needs besides the curves.
POLICY_FEATURES = {"pfi-aware": "pfi", "pfi-aware-measured": "pfi_measured", "curve-aware": "pfi",
                   "moe-ft-weighted": "moe_ft", "raw-dcgm": "dram_copy_product"}


class InfeasibleBudget(ValueError):
    """The jobs' floors (raised by SLA tiers, if any) need more power than the budget."""


# ---------------------------------------------------------------------------------------
# Curves
# ---------------------------------------------------------------------------------------

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

    def take(self, index: np.ndarray) -> "Curves":
        """Curves of jobs ``index`` (any shape) out of a (n_groups, K) table."""
        return Curves(self.power_w[index], self.throughput[index],
                      None if self.cap_w is None else self.cap_w[index])

    def throughput_at(self, power_w: np.ndarray) -> np.ndarray:
        return interp(self.power_w, self.throughput, power_w)

    def restrict(self, lo_w: np.ndarray, hi_w: np.ndarray | None = None) -> "Curves":
        """The same curves on ``[lo_w, hi_w]`` (points outside collapse onto the ends)."""
        hi = self.ceiling_w if hi_w is None else hi_w
        P = np.clip(self.power_w, np.asarray(lo_w)[..., None], np.asarray(hi)[..., None])
        cap = None if self.cap_w is None else interp(self.power_w, self.cap_w, P)
        return Curves(P, self.throughput_at(P), cap)


def curves_from_points(job: Sequence[Any], power_w: Sequence[float], throughput: Sequence[float],
                       cap_w: Sequence[float] | None = None) -> tuple[list[Any], Curves]:
    """Build curves from long-format points (one row per job and measured point).

    Points of a job at the same power are averaged. Returns the job ids (first-seen order)
    and their curves.
    """
    df = pd.DataFrame({"job": list(job), "power_w": np.asarray(power_w, float),
                       "throughput": np.asarray(throughput, float)})
    df["cap_w"] = np.nan if cap_w is None else np.asarray(cap_w, float)
    bad = ~np.isfinite(df[["power_w", "throughput"]]).all(axis=1) | (df["power_w"] < 0)
    if bad.any():
        raise ValueError(f"non-finite or negative power/throughput for job(s) "
                         f"{sorted(map(str, df.loc[bad, 'job'].unique()))[:5]}")
    jobs = list(dict.fromkeys(df["job"]))
    merged = df.groupby(["job", "power_w"], sort=False, as_index=False).mean()
    K = int(merged.groupby("job", sort=False).size().max()) if len(merged) else 0
    if K == 0:
        raise ValueError("no curve points")
    P = np.empty((len(jobs), K))
    T = np.empty_like(P)
    C = np.empty_like(P)
    for i, (_, pts) in enumerate(merged.groupby("job", sort=False)):
        pts = pts.sort_values("power_w")
        m = len(pts)
        for arr, col in ((P, "power_w"), (T, "throughput"), (C, "cap_w")):
            v = pts[col].to_numpy()
            arr[i, :m], arr[i, m:] = v, v[-1]
    order = [list(dict.fromkeys(merged["job"])).index(j) for j in jobs]
    has_cap = cap_w is not None and np.isfinite(C).all()
    return jobs, Curves(P[order], T[order], C[order] if has_cap else None)


def curves_from_runs(runs: pd.DataFrame) -> tuple[list[str], Curves]:
    """One curve per group of ``runs.parquet`` rows: (power_w, tokens_per_s) per cap_w,
    repeats averaged."""
    pts = runs.groupby(["group", "cap_w"], sort=True, as_index=False)[["power_w", "tokens_per_s"]].mean()
    return curves_from_points(pts["group"], pts["power_w"], pts["tokens_per_s"], pts["cap_w"])


def is_concave(curves: Curves) -> np.ndarray:
    """Per job: the curve equals its concave envelope (the greedy alone is then exact)."""
    hull = _oracle.concave_hull(curves.power_w, curves.throughput)
    tol = _oracle.RTOL * (np.abs(curves.throughput).max(-1, keepdims=True) + 1.0)
    return np.all(curves.throughput >= hull - tol, axis=-1)


def power_to_cap(curves: Curves, power_w: np.ndarray, gpus: np.ndarray | None = None) -> np.ndarray | None:
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
    tol = _oracle.RTOL * (np.abs(T).max(-1) + 1.0)
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


# ---------------------------------------------------------------------------------------
# Policies
# ---------------------------------------------------------------------------------------

def water_fill(cut_w: np.ndarray, headroom_w: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Split ``cut_w`` (...) over jobs (..., n) in proportion to ``weights``, no job giving
    more than its ``headroom_w``; what saturated jobs cannot give goes to the others in the
    same proportions (``C_i = min(lambda * w_i, h_i)``, ``sum C_i = cut``). Zero/NaN-weight
    jobs are cut last, in proportion to their headroom. If the cut exceeds the total
    headroom every job gives all of it (the caller reports infeasibility)."""
    cut = np.maximum(np.asarray(cut_w, float), 0.0)
    h = np.maximum(np.asarray(headroom_w, float), 0.0)
    w = np.asarray(weights, float)
    w = np.where(np.isfinite(w) & (w > 0) & (h > 0), w, 0.0)
    ratio = np.divide(h, w, out=np.full_like(h, np.inf), where=w > 0)
    order = np.argsort(ratio, axis=-1, kind="stable")
    r = np.take_along_axis(ratio, order, -1)
    hs = np.take_along_axis(h, order, -1)
    ws = np.take_along_axis(w, order, -1)
    h_before = np.cumsum(hs, -1) - hs
    w_from = np.cumsum(ws[..., ::-1], -1)[..., ::-1]
    with np.errstate(invalid="ignore"):
        reach = np.where(np.isfinite(r), h_before + r * w_from, np.inf)
    m = np.argmax(reach >= cut[..., None], axis=-1)[..., None]
    w_rest = np.take_along_axis(w_from, m, -1)[..., 0]
    lam = np.divide(cut - np.take_along_axis(h_before, m, -1)[..., 0], w_rest,
                    out=np.full_like(cut, np.inf), where=w_rest > 0)
    with np.errstate(invalid="ignore"):  # inf * 0 where a job has no weight
        c = np.where(w > 0, np.minimum(lam[..., None] * w, h), 0.0)
    rest = np.maximum(cut - c.sum(-1), 0.0)
    h_left = h - c
    share = np.divide(rest, h_left.sum(-1), out=np.zeros_like(rest), where=h_left.sum(-1) > 0)
    return c + h_left * np.minimum(share, 1.0)[..., None]


def policy_weights(policy: str, curves: Curves, features: Mapping[str, np.ndarray],
                   moe_ft_share: float = 2.0) -> np.ndarray:
    p_max, t_max = curves.ceiling_w, curves.uncapped_throughput
    if policy == "equal-weight":
        return p_max
    if policy in ("pfi-aware", "pfi-aware-measured"):
        pfi = np.asarray(features[POLICY_FEATURES[policy]], float)
        return np.divide(p_max, t_max, out=np.zeros_like(p_max), where=t_max > 0) * pfi
    if policy == "moe-ft-weighted":
        return p_max * np.where(np.asarray(features["moe_ft"], bool), moe_ft_share, 1.0)
    if policy == "raw-dcgm":
        return np.asarray(features["dram_copy_product"], float)
    raise ValueError(f"{policy!r} is not a weighted policy ({', '.join(WEIGHTED_POLICIES)})")


def family_exponent(x: np.ndarray, pfi: np.ndarray, iters: int = 60) -> np.ndarray:
    """``beta`` such that mean over ``x < 1`` of ``(1 - x) / (1 - x**beta)`` equals ``pfi``.

    ``x`` (..., m) are normalised powers P/P_max of the capped nodes. The ratio falls
    monotonically with beta, so bisection (on log beta, in [1e-2, 1e2]) finds it; a NaN PFI
    gives beta = 1 (linear).
    """
    x = np.asarray(x, float)
    pfi = np.asarray(pfi, float)
    capped = x < 1.0 - 1e-12
    n_capped = capped.sum(-1)
    xs = np.where(capped, x, 0.5)

    def mean_ratio(beta):
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = (1.0 - xs) / (1.0 - xs ** beta[..., None])
        return np.where(capped, terms, 0.0).sum(-1) / np.maximum(n_capped, 1)

    lo = np.full(pfi.shape, np.log(1e-2))
    hi = np.full(pfi.shape, np.log(1e2))
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        too_flexible = mean_ratio(np.exp(mid)) > pfi  # ratio too high -> raise beta
        lo, hi = np.where(too_flexible, mid, lo), np.where(too_flexible, hi, mid)
    beta = np.exp(0.5 * (lo + hi))
    return np.where(np.isfinite(pfi) & (n_capped > 0), beta, 1.0)


def predicted_curves(curves: Curves, pfi: np.ndarray, nodes: int = 6) -> Curves:
    """Sweep-free curves from ``P_max``, ``T_max``, the floor and a (predicted) PFI: the
    one-parameter family ``T_max * (P/P_max)**beta`` (see module docstring)."""
    floor, ceiling, t_max = curves.floor_w, curves.ceiling_w, curves.uncapped_throughput
    grid = np.linspace(0.0, 1.0, max(int(nodes), 2))
    P = floor[..., None] + (ceiling - floor)[..., None] * grid
    x = np.divide(P, ceiling[..., None], out=np.ones_like(P), where=ceiling[..., None] > 0)
    beta = family_exponent(x[..., :-1], pfi)
    return Curves(P, t_max[..., None] * x ** beta[..., None])


@dataclass
class Allocation:
    """A policy's allocation for one or many workloads."""
    policy: str
    power_w: np.ndarray          # (..., n)
    throughput: np.ndarray       # (..., n), on the true curves
    budget_w: np.ndarray         # (...)
    feasible: np.ndarray         # (...) floors (SLA-raised) fit under the budget
    floor_w: np.ndarray          # (..., n) the floors the policy worked with
    exact_fallback: np.ndarray | None = None  # (...) the oracle needed its MILP (diagnostic)

    @property
    def total_throughput(self) -> np.ndarray:
        return self.throughput.sum(-1)


def allocate(curves: Curves, budget_w: np.ndarray | float, policy: str,
             features: Mapping[str, np.ndarray] | None = None, *,
             max_slowdown: np.ndarray | None = None, moe_ft_share: float = 2.0,
             curve_nodes: int = 6, cache: dict[str, Any] | None = None) -> Allocation:
    """Allocate ``budget_w`` (scalar or per workload) over the jobs of ``curves`` (..., n, K).

    ``features``: per-job arrays the policy needs (``pfi``, ``pfi_measured``, ``moe_ft``,
    ``dram_copy_product``; see ``POLICY_FEATURES``). ``max_slowdown``: per-job SLA tier
    (fraction, NaN = none). ``cache``: a dict reused across calls on the *same* curves,
    features and tiers (e.g. one per cut) to keep the curve-aware predictions
    (``"predicted"``) and the oracle's budget-independent greedy plans.
    Infeasible workloads get their floors and ``feasible = False``; nothing is raised.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    features = features or {}
    need = POLICY_FEATURES.get(policy)
    if need is not None and need not in features:
        raise ValueError(f"policy {policy} needs per-job {need!r}")
    budget = np.broadcast_to(np.asarray(budget_w, float), curves.power_w.shape[:-2]).copy()
    if policy == "curve-aware":
        cache = {} if cache is None else cache
        if "predicted" not in cache:
            cache["predicted"] = predicted_curves(curves, features["pfi"], curve_nodes)
        pred = cache["predicted"]
        floor = sla_floor(pred, max_slowdown) if max_slowdown is not None else pred.floor_w
        work = pred.restrict(floor) if max_slowdown is not None else pred
    else:
        floor = sla_floor(curves, max_slowdown) if max_slowdown is not None else curves.floor_w
        work = curves.restrict(floor) if max_slowdown is not None else curves
    fallback = None
    if policy in ("oracle", "curve-aware"):
        plan = None
        if cache is not None:
            if f"plan:{policy}" not in cache:
                cache[f"plan:{policy}"] = _oracle.plan_greedy(work.power_w, work.throughput)
            plan = cache[f"plan:{policy}"]
        sol = _oracle.oracle(work.power_w, work.throughput, budget, plan)
        power, fallback = sol.power_w, ~sol.certified
    else:
        weights = policy_weights(policy, curves, features, moe_ft_share)
        cut = curves.ceiling_w.sum(-1) - budget
        power = curves.ceiling_w - water_fill(cut, curves.ceiling_w - floor, weights)
    feasible = floor.sum(-1) <= budget + _oracle.RTOL * np.maximum(np.abs(budget), 1.0)
    power = np.where(feasible[..., None], power, floor)
    return Allocation(policy, power, curves.throughput_at(power), budget, feasible, floor, fallback)


# ---------------------------------------------------------------------------------------
# One workload from a table (the ``wattflex allocate`` command)
# ---------------------------------------------------------------------------------------

JOB_COLUMNS = ("pfi", "gpus", "max_slowdown", "cluster", "dram_copy_product")


def allocate_table(points: pd.DataFrame, policy: str, *, cut: float | None = None,
                   budget_w: float | None = None, moe_ft_share: float = 2.0,
                   curve_nodes: int = 6) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Allocate one workload given as long-format points.

    ``points``: columns ``job, power_w, throughput`` (one row per measured point; the
    highest-power point is the uncapped one), optional per-point ``cap_w`` and per-job
    ``pfi``, ``gpus``, ``max_slowdown``, ``cluster`` (``moe-ft`` for MoE-FT weighting),
    ``dram_copy_product``. Give ``cut`` (fraction of the uncapped power) or ``budget_w``.
    Returns one row per job (``job, power_w, throughput`` and ``cap_w`` per GPU when caps
    or ``gpus`` are known) and totals (with the oracle's throughput for comparison).
    Raises :class:`InfeasibleBudget` when the floors exceed the budget.
    """
    missing = {"job", "power_w", "throughput"} - set(points.columns)
    if missing:
        raise ValueError(f"missing column(s) {', '.join(sorted(missing))} (need job, power_w, throughput)")
    if (cut is None) == (budget_w is None):
        raise ValueError("give exactly one of cut or budget_w")
    if cut is not None and not 0.0 <= cut < 1.0:
        raise ValueError(f"cut must be a fraction in [0, 1), got {cut}")
    has_cap = "cap_w" in points.columns and points["cap_w"].notna().all()
    jobs, curves = curves_from_points(points["job"], points["power_w"], points["throughput"],
                                      points["cap_w"] if has_cap else None)
    per_job = {}
    for col in JOB_COLUMNS:
        if col not in points.columns:
            continue
        varying = points.groupby("job", sort=False)[col].nunique(dropna=False) > 1
        if varying.any():
            raise ValueError(f"column {col!r} must be constant within a job (varies for {list(varying[varying].index)[:3]})")
        per_job[col] = points.groupby("job", sort=False)[col].first().reindex(jobs).to_numpy()
    features = {"pfi": per_job.get("pfi"), "dram_copy_product": per_job.get("dram_copy_product"),
                "moe_ft": None if "cluster" not in per_job else per_job["cluster"] == "moe-ft"}
    need = POLICY_FEATURES.get(policy)
    if need is not None and features.get(need) is None:
        column = "cluster" if need == "moe_ft" else need
        raise ValueError(f"policy {policy} needs a per-job {column!r} column")
    features = {k: v for k, v in features.items() if v is not None}
    slowdown = per_job["max_slowdown"].astype(float) if "max_slowdown" in per_job else None
    uncapped_w = float(curves.ceiling_w.sum())
    budget = (1.0 - cut) * uncapped_w if budget_w is None else float(budget_w)
    kw = dict(max_slowdown=slowdown, moe_ft_share=moe_ft_share, curve_nodes=curve_nodes)
    a = allocate(curves, budget, policy, features, **kw)
    if not bool(a.feasible):
        floors = float(a.floor_w.sum())
        why = "lowest-power points" + (" raised by max_slowdown" if slowdown is not None else "")
        raise InfeasibleBudget(f"budget {budget:.1f} W is below the jobs' floors {floors:.1f} W "
                               f"(sum of their {why}); the deepest feasible cut is "
                               f"{1 - floors / uncapped_w:.1%} ({floors:.1f} W)")
    best = a if policy == "oracle" else allocate(curves, budget, "oracle", features, max_slowdown=slowdown)
    out = pd.DataFrame({"job": jobs, "power_w": a.power_w, "throughput": a.throughput})
    gpus = per_job.get("gpus")
    cap = power_to_cap(curves, a.power_w, None if gpus is None else gpus.astype(float))
    if cap is not None and (has_cap or gpus is not None):
        out["cap_w"] = cap
    uncapped_t = float(curves.uncapped_throughput.sum())
    totals = {
        "policy": policy, "n_jobs": len(jobs), "cut": 1.0 - budget / uncapped_w, "budget_w": budget,
        "uncapped_power_w": uncapped_w, "floors_w": float(a.floor_w.sum()),
        "total_power_w": float(a.power_w.sum()), "total_throughput": float(a.total_throughput),
        "uncapped_throughput": uncapped_t, "oracle_throughput": float(best.total_throughput),
        "gap_to_oracle": float(best.total_throughput - a.total_throughput),
        "cap_source": "measured cap_w" if has_cap else ("power_w / gpus" if gpus is not None else None),
    }
    if slowdown is not None:
        target = (1.0 - slowdown) * curves.uncapped_throughput
        totals["sla_violations"] = int(np.sum(np.isfinite(slowdown) & (a.throughput < target * (1 - 1e-9))))
    return out, totals


# ---------------------------------------------------------------------------------------
# Simulation
# ---------------------------------------------------------------------------------------

@dataclass
class SimulationConfig:
    """The ``allocation:`` config slice (defaults = the paper's setup, see config.yaml)."""
    groups_set: str = "headline"
    n_workloads: int = 500
    jobs_per_workload: int = 100
    cuts: list[float] = field(default_factory=lambda: [round(0.05 * i, 2) for i in range(9)])
    mixes: list[str] = field(default_factory=lambda: ["random", "production"])
    # Share of pretraining jobs in the "production" mix (count share among training jobs);
    # see config.yaml for the source and caveat.
    pretraining_fraction: float = 0.2
    policies: list[str] = field(default_factory=lambda: list(POLICIES))
    pfi_column: str = "pfi_pred"
    moe_ft_share: float = 2.0
    curve_nodes: int = 6
    seed: int = 20260911
    sla_tiers: list[float] = field(default_factory=lambda: [0.0, 0.10, 0.25, 0.50])
    sla_tier_weights: list[float] = field(default_factory=lambda: [0.25, 0.25, 0.25, 0.25])
    oos_splits: int = 10
    oos_workloads: int = 100
    headline_mix: str = "production"
    headline_cut: float = 0.30
    published_tokens_per_s_per_job: float = 1500.0
    published_gap_closed: float = 0.63

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any] | None) -> "SimulationConfig":
        """Accept the nested config layout (see config.yaml) or flat keys."""
        cfg = dict(cfg or {})
        flat: dict[str, Any] = {}
        for key, val in cfg.items():
            if key == "production":
                flat["pretraining_fraction"] = val.get("pretraining_fraction", cls.pretraining_fraction)
            elif key == "sla":
                flat.update({"sla_tiers": val.get("tiers"), "sla_tier_weights": val.get("tier_weights")})
            elif key == "out_of_sample":
                flat.update({"oos_splits": val.get("splits"), "oos_workloads": val.get("workloads")})
            elif key == "headline":
                flat.update({"headline_mix": val.get("mix"), "headline_cut": val.get("cut")})
            elif key == "published":
                flat.update({"published_tokens_per_s_per_job": val.get("tokens_per_s_per_job"),
                             "published_gap_closed": val.get("gap_closed")})
            else:
                flat[key] = val
        known = {f.name for f in fields(cls)}
        unknown = set(flat) - known
        if unknown:
            raise ValueError(f"unknown allocation config key(s): {', '.join(sorted(unknown))}")
        out = cls(**{k: v for k, v in flat.items() if v is not None})
        bad = set(out.policies) - set(POLICIES)
        if bad:
            raise ValueError(f"unknown allocation policies {sorted(bad)}; choose from {', '.join(POLICIES)}")
        out.policies = list(dict.fromkeys(["equal-weight", *out.policies, "oracle"]))
        if not 0.0 <= out.pretraining_fraction <= 1.0:
            raise ValueError("allocation.production.pretraining_fraction must be in [0, 1]")
        if any(not 0.0 <= c < 1.0 for c in out.cuts):
            raise ValueError("allocation.cuts must be fractions in [0, 1)")
        return out


@dataclass
class GroupTable:
    """The campaign's groups as allocation sees them: curves (G, K) + per-group features."""
    groups: pd.DataFrame          # group, task, cluster, gpus, pfi_measured, pfi, dram_copy_product
    curves: Curves
    backend: str

    def features(self, index: np.ndarray, pfi: np.ndarray | None = None) -> dict[str, np.ndarray]:
        g = self.groups
        out = {c: g[c].to_numpy()[index] for c in ("pfi", "pfi_measured", "dram_copy_product", "gpus")}
        out["moe_ft"] = (g["cluster"] == "moe-ft").to_numpy()[index]
        if pfi is not None:
            out["pfi"] = np.asarray(pfi, float)[index]
        return out


def group_table(runs: pd.DataFrame, pfi: pd.DataFrame, predictions: pd.DataFrame,
                cfg: SimulationConfig) -> GroupTable:
    """Join runs (curves), pfi (measured PFI) and predictions (predicted PFI, DRAM copy
    product) for the groups of ``cfg.groups_set``."""
    runs = runs[runs["set"] == cfg.groups_set]
    if runs.empty:
        raise ValueError(f"no runs with set == {cfg.groups_set!r} to build workloads from")
    names, curves = curves_from_runs(runs)
    meta = runs.groupby("group", sort=False)[["task", "cluster", "gpus"]].first()
    pred = predictions.set_index("group")
    if cfg.pfi_column not in pred.columns:
        raise ValueError(f"predictions lack column {cfg.pfi_column!r} (allocation.pfi_column)")
    missing = sorted(set(names) - set(pred.index))
    if missing:
        raise ValueError(f"no PFI prediction for group(s) {missing[:5]}")
    groups = pd.DataFrame({"group": names})
    groups = groups.join(meta, on="group")
    groups["pfi_measured"] = pfi.set_index("group")["pfi_ratio"].reindex(names).to_numpy(float)
    groups["pfi"] = pred[cfg.pfi_column].reindex(names).to_numpy(float)
    groups["dram_copy_product"] = pred["dram_copy_product"].reindex(names).to_numpy(float)
    backends = sorted(set(runs["backend"].astype(str)))
    return GroupTable(groups, curves, backends[0] if len(backends) == 1 else "+".join(backends))


def sample_workloads(groups: pd.DataFrame, mix: str, n_workloads: int, n_jobs: int,
                     rng: np.random.Generator, pretraining_fraction: float) -> np.ndarray:
    """Indices (n_workloads, n_jobs) into ``groups`` for one mix."""
    G = len(groups)
    if mix == "random":
        return rng.integers(0, G, size=(n_workloads, n_jobs))
    if mix != "production":
        raise ValueError(f"unknown mix {mix!r} (random | production)")
    is_pt = (groups["task"] == "pt").to_numpy()
    pt, ft = np.flatnonzero(is_pt), np.flatnonzero(~is_pt)
    if len(pt) == 0 or len(ft) == 0:
        raise ValueError("the production mix needs both pretraining and fine-tuning groups")
    draw_pt = rng.random((n_workloads, n_jobs)) < pretraining_fraction
    return np.where(draw_pt, pt[rng.integers(0, len(pt), (n_workloads, n_jobs))],
                    ft[rng.integers(0, len(ft), (n_workloads, n_jobs))])


def evaluate_policies(table: GroupTable, index: np.ndarray, cuts: Sequence[float],
                      cfg: SimulationConfig, pfi: np.ndarray | None = None,
                      policies: Sequence[str] | None = None, max_slowdown: np.ndarray | None = None,
                      tiers: np.ndarray | None = None) -> pd.DataFrame:
    """Every policy on every workload (rows of ``index``) at every cut: one row per
    (cut, workload, policy) with total throughput and power. ``max_slowdown``: SLA tiers
    the policies must honour; ``tiers``: tiers to count violations against
    (``sla_violations``, jobs per workload), honoured or not."""
    curves = table.curves.take(index)
    feats = table.features(index, pfi)
    # a predicted curve depends only on its group: predict per group, then gather
    group_pfi = table.groups["pfi"].to_numpy(float) if pfi is None else np.asarray(pfi, float)
    cache = {"predicted": predicted_curves(table.curves, group_pfi, cfg.curve_nodes).take(index)}
    uncapped_w = curves.ceiling_w.sum(-1)
    uncapped_t = curves.uncapped_throughput.sum(-1)
    target = None if tiers is None else (1.0 - tiers) * curves.uncapped_throughput
    frames = []
    for cut in cuts:
        budget = (1.0 - cut) * uncapped_w
        oracle_total = None
        for policy in policies or cfg.policies:
            a = allocate(curves, budget, policy, feats, max_slowdown=max_slowdown,
                         moe_ft_share=cfg.moe_ft_share, curve_nodes=cfg.curve_nodes, cache=cache)
            row = {"cut": cut, "workload": np.arange(len(index)), "policy": policy,
                   "total_tokens_per_s": a.total_throughput, "total_power_w": a.power_w.sum(-1),
                   "budget_w": budget, "uncapped_tokens_per_s": uncapped_t, "n_jobs": index.shape[1],
                   "feasible": a.feasible,
                   "exact_fallback": False if a.exact_fallback is None else a.exact_fallback}
            if target is not None:
                row["sla_violations"] = (a.throughput < target * (1 - 1e-9)).sum(-1)
            frames.append(pd.DataFrame(row))
            if policy == "oracle":
                oracle_total = a.total_throughput
        # with SLA tiers curve-aware works on its own (predicted) floors and may break a tier
        _check_oracle_dominates(frames, cut, oracle_total,
                                skip=("oracle",) if max_slowdown is None else ("oracle", "curve-aware"))
    return pd.concat(frames, ignore_index=True)


def _check_oracle_dominates(frames: list[pd.DataFrame], cut: float, oracle_total: np.ndarray | None,
                            skip: Sequence[str]) -> None:
    """Guard: a policy beating the oracle on a feasible workload means the oracle is wrong."""
    if oracle_total is None:
        return
    oracle_feasible = next(f for f in frames if f["cut"].iat[0] == cut and f["policy"].iat[0] == "oracle")["feasible"]
    for f in frames:
        if f["cut"].iat[0] != cut or f["policy"].iat[0] in skip:
            continue
        ok = f["feasible"].to_numpy() & oracle_feasible.to_numpy()
        excess = (f["total_tokens_per_s"].to_numpy() - oracle_total)[ok]
        if (excess > 1e-6 * np.abs(oracle_total[ok]).max(initial=1.0)).any():
            raise AssertionError(f"policy {f['policy'].iat[0]} beat the oracle at cut {cut}: oracle is not exact")


def _pct(x: pd.Series, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else np.nan


def summarize(results: pd.DataFrame, keys: Sequence[str] = ("mix", "cut")) -> pd.DataFrame:
    """Per (mix, cut, policy): mean/sd/p5/p95 of total and per-job tokens/s over feasible
    workloads, difference to the oracle, and the fraction of the equal-weight-to-oracle gap
    closed (ratio of means over workloads; NaN when there is no gap, e.g. at 0 % cut)."""
    keys = list(keys)
    df = results.copy()
    wide = df.pivot_table(index=keys + ["workload"], columns="policy", values="total_tokens_per_s")
    df = df.join(wide[["equal-weight", "oracle"]].rename(columns={"equal-weight": "_eq", "oracle": "_or"}),
                 on=keys + ["workload"])
    df["per_job"] = df["total_tokens_per_s"] / df["n_jobs"]
    rows = []
    for (*key, policy), part in df.groupby(keys + ["policy"], sort=False):
        feas = part[part["feasible"]]
        total, per_job = feas["total_tokens_per_s"], feas["per_job"]
        gap = (feas["_or"] - feas["_eq"]).mean()
        rows.append({
            **dict(zip(keys, key)), "policy": policy, "n_workloads": len(part),
            "feasible_fraction": float(part["feasible"].mean()),
            "total_tokens_per_s_mean": total.mean(), "total_tokens_per_s_sd": total.std(),
            "total_tokens_per_s_p5": _pct(total, 5), "total_tokens_per_s_p95": _pct(total, 95),
            "per_job_tokens_per_s_mean": per_job.mean(), "per_job_tokens_per_s_sd": per_job.std(),
            "per_job_tokens_per_s_p5": _pct(per_job, 5), "per_job_tokens_per_s_p95": _pct(per_job, 95),
            "retained_fraction_mean": (total / feas["uncapped_tokens_per_s"]).mean(),
            "diff_to_oracle_total_mean": (total - feas["_or"]).mean(),
            "diff_to_oracle_per_job_mean": ((total - feas["_or"]) / feas["n_jobs"]).mean(),
            "gain_over_equal_per_job_mean": ((total - feas["_eq"]) / feas["n_jobs"]).mean(),
            "gap_closed": ((total - feas["_eq"]).mean() / gap) if gap > 1e-9 * max(total.mean(), 1.0) else np.nan,
            "frac_workloads_ge_equal": float((total >= feas["_eq"] - 1e-9 * feas["_eq"].abs()).mean()),
        })
    return pd.DataFrame(rows)


def headline(summary: pd.DataFrame, results: pd.DataFrame, cfg: SimulationConfig, backend: str) -> pd.DataFrame:
    """The paper's headline: at ``headline_cut`` on ``headline_mix``, tokens/s per job each
    policy recovers over equal weight and its share of the equal-weight-to-oracle gap,
    beside the published 1.5k tokens/s and 63 % (for PFI-aware)."""
    at = summary[(summary["mix"] == cfg.headline_mix) & np.isclose(summary["cut"], cfg.headline_cut)]
    if at.empty:
        raise ValueError(f"headline cut {cfg.headline_cut} / mix {cfg.headline_mix} not simulated")
    res = results[(results["mix"] == cfg.headline_mix) & np.isclose(results["cut"], cfg.headline_cut)]
    wide = res.pivot_table(index="workload", columns="policy", values="total_tokens_per_s")
    n_jobs = res["n_jobs"].iat[0]
    rows = []
    for _, r in at[~at["policy"].isin(["equal-weight"])].iterrows():
        gain = (wide[r["policy"]] - wide["equal-weight"]) / n_jobs
        rows.append({
            "mix": cfg.headline_mix, "cut": cfg.headline_cut, "policy": r["policy"],
            "tokens_per_s_per_job_recovered": r["gain_over_equal_per_job_mean"],
            "recovered_p5": _pct(gain, 5), "recovered_p95": _pct(gain, 95),
            "gap_closed": r["gap_closed"],
            "published_tokens_per_s_per_job_recovered": cfg.published_tokens_per_s_per_job if r["policy"] == "pfi-aware" else np.nan,
            "published_gap_closed": cfg.published_gap_closed if r["policy"] == "pfi-aware" else np.nan,
            "equal_weight_per_job_tokens_per_s": float(wide["equal-weight"].mean() / n_jobs),
            "oracle_per_job_tokens_per_s": float(wide["oracle"].mean() / n_jobs),
            "backend": backend,
        })
    return pd.DataFrame(rows)


def draw_tiers(shape: tuple[int, ...], cfg: SimulationConfig, rng: np.random.Generator) -> np.ndarray:
    """Per-job maximum slowdown drawn from ``sla_tiers`` with ``sla_tier_weights``."""
    weights = np.asarray(cfg.sla_tier_weights, float)
    return rng.choice(np.asarray(cfg.sla_tiers, float), p=weights / weights.sum(), size=shape)


def sla_study(blind: pd.DataFrame, honoured: pd.DataFrame) -> pd.DataFrame:
    """Per (mix, cut, policy) with per-job SLA tiers: feasibility, tokens/s per job over
    feasible workloads, the gap to the SLA-constrained oracle, tier violations (0 for
    every policy that knows the curves), the share of jobs the same policy pushes past
    their tier when it ignores them (``blind``, the main run scored against the same
    tiers) and the oracle's throughput cost of the tiers."""
    keys = ["mix", "cut", "workload"]
    sla_oracle = honoured[honoured["policy"] == "oracle"].set_index(keys)["total_tokens_per_s"]
    free_oracle = blind[blind["policy"] == "oracle"].set_index(keys)["total_tokens_per_s"]
    blind_viol = blind.set_index(keys + ["policy"])["sla_violations"]
    rows = []
    for (mix, cut, policy), part in honoured.groupby(["mix", "cut", "policy"], sort=False):
        feas = part[part["feasible"]]
        at = pd.MultiIndex.from_frame(feas[keys])
        n = feas["n_jobs"].to_numpy()
        pb = part.set_index(keys + ["policy"]).index
        rows.append({
            "mix": mix, "cut": cut, "policy": policy, "n_workloads": len(part),
            "feasible_fraction": float(part["feasible"].mean()),
            "per_job_tokens_per_s_mean": float(np.mean(feas["total_tokens_per_s"] / n)) if len(feas) else np.nan,
            "diff_to_sla_oracle_per_job_mean": float(np.mean((feas["total_tokens_per_s"].to_numpy()
                                                               - sla_oracle.reindex(at).to_numpy()) / n)) if len(feas) else np.nan,
            "sla_violating_job_fraction": float(np.mean(feas["sla_violations"] / n)) if len(feas) else np.nan,
            "violations_if_sla_blind_job_fraction": float(np.mean(blind_viol.reindex(pb).to_numpy() / part["n_jobs"].to_numpy())),
            "oracle_cost_of_sla_per_job_mean": float(np.mean((free_oracle.reindex(at).to_numpy()
                                                              - feas["total_tokens_per_s"].to_numpy()) / n))
            if policy == "oracle" and len(feas) else np.nan,
        })
    return pd.DataFrame(rows)


def stratified_halves(groups: pd.DataFrame, rng: np.random.Generator) -> np.ndarray:
    """Boolean training mask: half of each (cluster, task) stratum, odd remainders random."""
    train = np.zeros(len(groups), bool)
    for _, idx in groups.groupby(["cluster", "task"], sort=True).indices.items():
        idx = rng.permutation(idx)
        k = len(idx) // 2 + (rng.random() < 0.5 if len(idx) % 2 else 0)
        train[idx[:k]] = True
    return train


def fit_pfi_ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """One-feature OLS ``PFI = intercept + slope * dram_copy_product`` (the paper's best
    predictor, refitted here on a training half only). Returns (slope, intercept)."""
    from scipy.stats import linregress

    ok = np.isfinite(x) & np.isfinite(y)
    fit = linregress(np.asarray(x, float)[ok], np.asarray(y, float)[ok])
    return float(fit.slope), float(fit.intercept)


def out_of_sample(table: GroupTable, cfg: SimulationConfig, rng: np.random.Generator) -> pd.DataFrame:
    """Policies whose PFI comes from a predictor fitted on one half of the groups, evaluated
    on workloads drawn from the other half, beside the same policies fed the in-sample
    prediction (``pfi_column``, fitted on all groups) and the oracle; repeated over
    ``oos_splits`` stratified random halves. Per (mix, cut, policy, variant): mean and
    spread over splits."""
    g = table.groups
    x, y = g["dram_copy_product"].to_numpy(float), g["pfi_measured"].to_numpy(float)
    uses_pfi = ["pfi-aware", "curve-aware"]
    per_split = []
    for split in range(cfg.oos_splits):
        train = stratified_halves(g, rng)
        slope, intercept = fit_pfi_ols(x[train], y[train])
        pfi_oos = intercept + slope * x
        resid = y[~train] - pfi_oos[~train]
        r2 = 1.0 - (resid ** 2).sum() / ((y[~train] - y[~train].mean()) ** 2).sum()
        test = np.flatnonzero(~train)
        for mix in cfg.mixes:
            index = test[sample_workloads(g.iloc[test].reset_index(drop=True), mix, cfg.oos_workloads,
                                          cfg.jobs_per_workload, rng, cfg.pretraining_fraction)]
            ins = evaluate_policies(table, index, cfg.cuts, cfg, policies=["equal-weight", *uses_pfi, "raw-dcgm", "oracle"])
            oos = evaluate_policies(table, index, cfg.cuts, cfg, pfi=pfi_oos, policies=uses_pfi)
            ins["variant"] = np.where(ins["policy"].isin(uses_pfi), "in-sample", "no PFI")
            oos["variant"] = "out-of-sample"
            both = pd.concat([ins, oos], ignore_index=True)
            both["mix"] = mix
            both["policy"] = both["policy"] + "|" + both["variant"]
            both.loc[both["variant"] == "no PFI", "policy"] = both["policy"].str.split("|").str[0]
            s = summarize(both)
            s["split"], s["test_r2"] = split, r2
            per_split.append(s)
    if not per_split:
        return pd.DataFrame(columns=["mix", "cut", "policy", "variant", "n_splits", "gap_closed_mean"])
    per_split = pd.concat(per_split, ignore_index=True)
    parts = per_split["policy"].str.split("|", expand=True)
    per_split["policy"], per_split["variant"] = parts[0], parts[1].fillna("no PFI")
    agg = per_split.groupby(["mix", "cut", "policy", "variant"], sort=False).agg(
        n_splits=("split", "nunique"),
        per_job_tokens_per_s_mean=("per_job_tokens_per_s_mean", "mean"),
        per_job_tokens_per_s_sd_over_splits=("per_job_tokens_per_s_mean", "std"),
        gain_over_equal_per_job_mean=("gain_over_equal_per_job_mean", "mean"),
        gap_closed_mean=("gap_closed", "mean"),
        gap_closed_sd_over_splits=("gap_closed", "std"),
        gap_closed_p5=("gap_closed", lambda v: _pct(v.dropna(), 5)),
        gap_closed_p95=("gap_closed", lambda v: _pct(v.dropna(), 95)),
        frac_workloads_ge_equal=("frac_workloads_ge_equal", "mean"),
        pfi_test_r2_mean=("test_r2", "mean"),
    ).reset_index()
    agg.loc[agg["variant"] != "out-of-sample", "pfi_test_r2_mean"] = np.nan
    return agg


def simulate(table: GroupTable, cfg: SimulationConfig) -> dict[str, pd.DataFrame]:
    """The full study: ``results`` (per workload), ``summary``, ``headline``, ``sla``,
    ``out_of_sample``, plus ``diagnostics`` (curve concavity, oracle fallbacks)."""
    rng = np.random.default_rng(cfg.seed)
    indices = {mix: sample_workloads(table.groups, mix, cfg.n_workloads, cfg.jobs_per_workload,
                                     rng, cfg.pretraining_fraction) for mix in cfg.mixes}
    tier_rng = np.random.default_rng([cfg.seed, 1])
    frames, sla_frames = [], []
    for mix, index in indices.items():
        tiers = draw_tiers(index.shape, cfg, tier_rng)
        res = evaluate_policies(table, index, cfg.cuts, cfg, tiers=tiers)
        res["mix"] = mix
        frames.append(res)
        log.info("mix %s: %d workloads x %d cuts x %d policies", mix, len(index), len(cfg.cuts), len(cfg.policies))
        sla = evaluate_policies(table, index, cfg.cuts, cfg, max_slowdown=tiers, tiers=tiers)
        sla["mix"] = mix
        sla_frames.append(sla)
    results = pd.concat(frames, ignore_index=True)
    summary = summarize(results)
    out = {"results": results, "summary": summary,
           "headline": headline(summary, results, cfg, table.backend) if cfg.headline_mix in indices else pd.DataFrame()}
    out["sla"] = sla_study(results, pd.concat(sla_frames, ignore_index=True))
    out["out_of_sample"] = out_of_sample(table, cfg, np.random.default_rng([cfg.seed, 2]))
    oracle_rows = results[results["policy"] == "oracle"]
    out["diagnostics"] = pd.DataFrame([{
        "groups": len(table.groups), "concave_groups": int(is_concave(table.curves).sum()),
        "non_concave_groups": ",".join(table.groups["group"][~is_concave(table.curves)]),
        "oracle_workload_cuts": len(oracle_rows),
        "oracle_milp_fraction": float(oracle_rows["exact_fallback"].mean()),
    }])
    return out


# ---------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------

FIGURE_POLICIES = {  # label, color, line style
    "equal-weight": ("equal weight", "#555555", "-"), "pfi-aware": ("PFI-aware (predicted PFI)", "#1f77b4", "-"),
    "pfi-aware-measured": ("PFI-aware (measured PFI)", "#1f77b4", ":"),
    "moe-ft-weighted": ("MoE-FT-weighted", "#2ca02c", "-"), "raw-dcgm": ("raw DCGM", "#9467bd", "-"),
    "curve-aware": ("curve-aware (predicted curves)", "#ff7f0e", "--"), "oracle": ("oracle", "#d62728", "-"),
}


def fig8_figure(summary: pd.DataFrame, headline_table: pd.DataFrame, backends: Any):
    """Fig. 8 analog: per mix, tokens/s per job vs cut (mean; p5-p95 over workloads for equal
    weight and the oracle) and the share of the equal-weight-to-oracle gap closed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from wattflex.plots.core import label_backend

    mixes = list(dict.fromkeys(summary["mix"]))
    fig, axes = plt.subplots(2, len(mixes), figsize=(5.2 * len(mixes), 7.5), sharex=True, squeeze=False)
    for col, mix in enumerate(mixes):
        part = summary[summary["mix"] == mix]
        top, bottom = axes[0, col], axes[1, col]
        for policy, (label, color, style) in FIGURE_POLICIES.items():
            p = part[part["policy"] == policy].sort_values("cut")
            if p.empty:
                continue
            x = 100 * p["cut"]
            top.plot(x, p["per_job_tokens_per_s_mean"] / 1e3, style, color=color, label=label, marker="o", ms=3)
            if policy in ("equal-weight", "oracle"):  # spread over workloads (p5-p95)
                top.fill_between(x, p["per_job_tokens_per_s_p5"] / 1e3, p["per_job_tokens_per_s_p95"] / 1e3,
                                 color=color, alpha=0.12, lw=0)
            if policy not in ("equal-weight", "oracle"):
                bottom.plot(x, 100 * p["gap_closed"], style, color=color, label=label, marker="o", ms=3)
        top.set_title(f"{mix} mix")
        top.set_ylabel("tokens/s per job (x1000)")
        bottom.axhline(0, color="#555555", lw=0.8)
        bottom.axhline(100, color="#d62728", lw=0.8)
        bottom.set_ylabel("% of equal-weight-to-oracle gap closed")
        bottom.set_xlabel("cluster power cut (%)")
        lo = np.nanmin(100 * part.loc[~part["policy"].isin(["equal-weight", "oracle"]), "gap_closed"].to_numpy(float),
                       initial=0.0)
        bottom.set_ylim(max(lo - 5, -150), 110)
        h = headline_table[(headline_table["mix"] == mix) & (headline_table["policy"] == "pfi-aware")]
        if not h.empty:
            r = h.iloc[0]
            bottom.set_title(f"{100 * r['cut']:.0f}% cut, PFI-aware: {r['tokens_per_s_per_job_recovered']:+,.0f} "
                             f"tokens/s/job, {100 * r['gap_closed']:.0f}% of gap (paper: "
                             f"{r['published_tokens_per_s_per_job_recovered']:+,.0f}, "
                             f"{100 * r['published_gap_closed']:.0f}%)", fontsize=8)
    axes[0, -1].legend(fontsize=7, loc="lower left")
    fig.suptitle("Allocation under a cluster power cut (Fig. 8 analog)")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    label_backend(fig, backends)
    return fig


def out_of_sample_figure(oos: pd.DataFrame, backends: Any):
    """Gap closed by PFI-aware and curve-aware with the predictor fitted in-sample vs on the
    other half of the groups (mean and p5-p95 over splits)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from wattflex.plots.core import label_backend

    mixes = list(dict.fromkeys(oos["mix"]))
    if not mixes:  # allocation.out_of_sample.splits: 0 (or no split could be drawn)
        fig, ax = plt.subplots(figsize=(5.2, 4))
        ax.text(0.5, 0.5, "no out-of-sample splits\n(allocation.out_of_sample.splits: 0)", ha="center", va="center")
        ax.axis("off")
        label_backend(fig, backends)
        return fig
    fig, axes = plt.subplots(1, len(mixes), figsize=(5.2 * len(mixes), 4), squeeze=False)
    for ax, mix in zip(axes[0], mixes):
        for policy in ("pfi-aware", "curve-aware"):
            _, color, _ = FIGURE_POLICIES[policy]
            for variant, style in (("in-sample", "-"), ("out-of-sample", "--")):
                p = oos[(oos["mix"] == mix) & (oos["policy"] == policy) & (oos["variant"] == variant)].sort_values("cut")
                p = p[p["cut"] > 0]
                ax.plot(100 * p["cut"], 100 * p["gap_closed_mean"], style, color=color, marker="o", ms=3,
                        label=f"{policy}, {variant}")
                ax.fill_between(100 * p["cut"], 100 * p["gap_closed_p5"], 100 * p["gap_closed_p95"],
                                color=color, alpha=0.08, lw=0)
        ax.set_title(f"{mix} mix: workloads from held-out groups")
        ax.set_xlabel("cluster power cut (%)")
        ax.set_ylabel("% of equal-weight-to-oracle gap closed")
        ax.axhline(100, color="#d62728", lw=0.8)
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    label_backend(fig, backends)
    return fig
