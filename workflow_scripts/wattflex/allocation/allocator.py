"""The allocation policies' algorithms: split a cluster power budget across jobs.

The cluster budget is ``(1 - cut) * sum(ceiling)``; a policy returns each job's power with
total <= budget (curves, floors and ceilings: :mod:`wattflex.allocation.curves`; the policy
names and what each reads: :mod:`wattflex.policies`).

**Policies** (``C_i`` = job i's share of the cut, ``sum C_i = sum ceiling - budget``):

- ``equal-weight``: ``C_i ∝ P_max_i``;
- ``pfi-aware``: ``C_i ∝ (P_max_i / T_max_i) * PFI_i`` with PFI *predicted* from uncapped
  telemetry (``pfi-aware-measured``: the measured PFI, a reference for the predictor);
- ``moe-ft-weighted``: equal weight, MoE fine-tuning jobs take ``moe_ft_share`` (2x) the share;
- ``raw-dcgm``: ``C_i ∝`` DRAM copy product (``dram_active * mem_copy_util``);
- all four **water-fill** (:func:`water_fill`): a job whose share would take it below its
  floor stops there and the rest of its share is spread over the others in the same
  proportions, so the budget is met exactly whenever the floors allow it (jobs with zero
  weight are cut last, in proportion to their headroom);
- ``oracle``: the throughput-maximising allocation, exact for piecewise-linear curves of
  any shape (:mod:`wattflex.allocation.oracle`);
- ``curve-aware`` (beyond the paper): the oracle applied to curves *predicted* from
  uncapped telemetry, no sweep (:func:`predicted_curves`). The family:
  ``T(P) = T_max * (P / P_max) ** beta`` on the job's ``[floor, ceiling]``, sampled at
  ``curve_nodes`` evenly spaced powers, with ``beta`` chosen so that the family's ratio PFI
  (paper Eq. 1 over those nodes) equals the predicted PFI (PFI > 1 gives a concave curve,
  beta < 1). Only ``P_max``, ``T_max``, the floor (the lowest cap's power, about
  ``min_cap * gpus`` when the cap binds) and the predicted PFI are used.

**SLA tiers** (beyond the paper): every policy works on ``[raised floor, ceiling]``
(:func:`wattflex.allocation.curves.sla_floor`), so all of them honour the tiers.
``curve-aware`` can only raise floors on its *predicted* curve, so it may miss a tier
(reported). When the raised floors exceed the budget the cut is infeasible:
:func:`allocate` reports ``feasible = False``; :func:`allocate_table` (the ``wattflex
allocate`` command) raises :class:`InfeasibleBudget`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from wattflex.allocation.curves import (
    Curves,
    check_points,
    curves_from_points,
    monotone_fit,
    power_to_cap,
    sla_floor,
)
from wattflex.allocation.oracle import RTOL, concave_hull, oracle, plan_greedy
from wattflex.allocation.waterfill import water_fill  # noqa: F401 (the policies' split, re-exported)
from wattflex.ingest.reader import CAP_RANGE_W, POWER_RANGE_W
from wattflex.policies import Policy, get, optimum
from wattflex.schema import section_defaults

_ALLOCATION = section_defaults("allocation")  # moe_ft_share, curve_nodes: the schema's


class InfeasibleBudget(ValueError):
    """The jobs' floors (raised by SLA tiers, if any) need more power than the budget."""


def policy_weights(
    policy: str,
    curves: Curves,
    features: Mapping[str, np.ndarray],
    moe_ft_share: float = _ALLOCATION["moe_ft_share"],
) -> np.ndarray:
    """Per-job weights of a weighted policy's cut: the registry's :meth:`Policy.weights`."""
    return get(policy).weights(curves, features, {"moe_ft_share": moe_ft_share})


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
    power_w: np.ndarray  # (..., n)
    throughput: np.ndarray  # (..., n), on the true curves
    budget_w: np.ndarray  # (...)
    feasible: np.ndarray  # (...) floors (SLA-raised) fit under the budget
    floor_w: np.ndarray  # (..., n) the floors the policy worked with
    exact_fallback: np.ndarray | None = None  # (...) the oracle needed its MILP (diagnostic)
    oracle_method: np.ndarray | None = None  # (...) the oracle's path: "hull-certified" or "milp"
    oracle_gap_rel: np.ndarray | None = None  # (...) its proven relative gap to the optimum
    oracle_gap: np.ndarray | None = None  # (...) the same in throughput units (bound - value)

    @property
    def total_throughput(self) -> np.ndarray:
        """Each workload's throughput summed over its jobs (...)."""
        return self.throughput.sum(-1)


def allocate(
    curves: Curves,
    budget_w: np.ndarray | float,
    policy: str,
    features: Mapping[str, np.ndarray] | None = None,
    *,
    max_slowdown: np.ndarray | None = None,
    moe_ft_share: float = _ALLOCATION["moe_ft_share"],
    curve_nodes: int = _ALLOCATION["curve_nodes"],
    cache: dict[str, Any] | None = None,
    nested: Any = None,
) -> Allocation:
    """Allocate ``budget_w`` (scalar or per workload) over the jobs of ``curves`` (..., n, K).

    ``nested``: the site's nested limits over the jobs (a
    :class:`wattflex.allocation.nested.Laminar`: feeds, PDUs, racks, nodes), held by every
    policy besides the budget (:func:`_allocate_nested`).

    ``features``: per-job arrays the policy needs (``pfi``, ``pfi_measured``, ``moe_ft``,
    ``dram_copy_product``; see ``POLICY_FEATURES``). ``max_slowdown``: per-job SLA tier
    (fraction, NaN = none). ``cache``: a dict reused across calls on the *same* curves,
    features and tiers (e.g. one per cut) to keep the curve-aware predictions
    (``"predicted"``) and the oracle's budget-independent greedy plans. The caller may put
    in it ``"curve_key"``, integers (..., n) equal for jobs whose curves (and tiers) are
    equal, e.g. group indices: each distinct curve's hull is then computed once.
    Infeasible workloads get their floors and ``feasible = False``; nothing is raised.
    """
    pol = get(policy, "allocation")
    features = features or {}
    if pol.feature is not None and pol.feature not in features:
        raise ValueError(f"policy {policy} needs per-job {pol.feature!r}")
    if nested is not None:
        return _allocate_nested(
            curves, budget_w, pol, features, nested, max_slowdown, moe_ft_share, curve_nodes
        )
    budget = np.broadcast_to(np.asarray(budget_w, float), curves.power_w.shape[:-2]).copy()
    keep_plan = (
        cache is not None
    )  # without a cache the oracle plans (and batches one workload) itself
    cache = {} if cache is None else cache
    if pol.curves == "predicted":
        if "predicted" not in cache:
            cache["predicted"] = predicted_curves(curves, features[pol.feature], curve_nodes)
        kind, base = "predicted", cache["predicted"]
    else:
        kind, base = "true", curves
    # the (SLA-raised) floors and the curves restricted to them depend on the curves and
    # tiers only: computed once per cache, not once per policy and cut
    if f"floor:{kind}" not in cache:
        cache[f"floor:{kind}"] = (
            sla_floor(base, max_slowdown) if max_slowdown is not None else base.floor_w
        )
    floor = cache[f"floor:{kind}"]
    fallback, oracle_path = None, {}
    if pol.curves is not None:
        if f"work:{kind}" not in cache:
            cache[f"work:{kind}"] = base.restrict(floor) if max_slowdown is not None else base
        work = cache[f"work:{kind}"]
        if keep_plan and f"plan:{policy}" not in cache:
            cache[f"plan:{policy}"] = plan_greedy(
                work.power_w, work.throughput, _hull_by_key(work, cache.get("curve_key"))
            )
        sol = oracle(work.power_w, work.throughput, budget, cache.get(f"plan:{policy}"))
        power, fallback = sol.power_w, ~sol.certified
        oracle_path = {
            "oracle_method": sol.method,
            "oracle_gap_rel": sol.gap_rel,
            "oracle_gap": sol.gap,
        }
    else:
        weights = pol.weights(curves, features, {"moe_ft_share": moe_ft_share})
        cut = curves.ceiling_w.sum(-1) - budget
        power = curves.ceiling_w - water_fill(cut, curves.ceiling_w - floor, weights)
    feasible = floor.sum(-1) <= budget + RTOL * np.maximum(np.abs(budget), 1.0)
    power = np.where(feasible[..., None], power, floor)
    return Allocation(
        policy, power, curves.throughput_at(power), budget, feasible, floor, fallback, **oracle_path
    )


def _allocate_nested(
    curves: Curves,
    budget_w: Any,
    pol: Policy,
    features: Mapping[str, np.ndarray],
    nested: Any,
    max_slowdown: np.ndarray | None,
    moe_ft_share: float,
    curve_nodes: int,
) -> Allocation:
    """:func:`allocate` under nested limits, one workload at a time: the curve policies by
    :func:`wattflex.allocation.nested.nested_oracle` (exact), the weighted ones by
    :func:`wattflex.allocation.nested.nested_water_fill`. Infeasible (floors over the budget
    or over a group's limit): the floors, ``feasible`` False."""
    from wattflex.allocation.nested import floors_fit, nested_oracle, nested_water_fill

    lead = curves.power_w.shape[:-2]
    budget = np.broadcast_to(np.asarray(budget_w, float), lead).copy()
    base = (
        predicted_curves(curves, features[pol.feature], curve_nodes)
        if pol.curves == "predicted"
        else curves
    )
    floor = sla_floor(base, max_slowdown) if max_slowdown is not None else base.floor_w
    power = np.empty(curves.power_w.shape[:-1])
    feasible = np.empty(lead, bool)
    method = np.full(lead, "", dtype="<U14")
    gap = np.zeros(lead)
    for idx in np.ndindex(*lead):
        b, fl = float(budget[idx]), floor[idx]
        feasible[idx] = floors_fit(nested.with_budget(b), fl)
        if pol.curves is not None:
            work = base.take(idx).restrict(fl) if max_slowdown is not None else base.take(idx)
            sol = nested_oracle(work.power_w, work.throughput, b, nested)
            power[idx], method[idx], gap[idx] = sol.power_w, str(sol.method), float(sol.gap_rel)
        else:
            w = pol.weights(
                curves.take(idx),
                {k: np.asarray(v)[idx] for k, v in features.items()},
                {"moe_ft_share": moe_ft_share},
            )
            power[idx] = nested_water_fill(b, fl, curves.take(idx).ceiling_w, w, nested)
    power = np.where(feasible[..., None], power, floor)
    path = {"oracle_method": method, "oracle_gap_rel": gap} if pol.curves is not None else {}
    return Allocation(
        pol.name, power, curves.throughput_at(power), budget, feasible, floor, None, **path
    )


def _hull_by_key(curves: Curves, key: np.ndarray | None) -> np.ndarray | None:
    """The concave hull of ``curves`` (..., n, K), computed once per distinct ``key``
    (..., n) and gathered (rows are independent, so the numbers are those of the full
    computation); None without a key."""
    if key is None:
        return None
    K = curves.power_w.shape[-1]
    _, first, inverse = np.unique(np.asarray(key).ravel(), return_index=True, return_inverse=True)
    P, T = curves.power_w.reshape(-1, K), curves.throughput.reshape(-1, K)
    return concave_hull(P[first], T[first])[inverse.ravel()].reshape(curves.power_w.shape)


# ---------------------------------------------------------------------------------------
# One workload from a table (the ``wattflex allocate`` command)
# ---------------------------------------------------------------------------------------

PROGRESS_JOBS = 1000  # workloads at least this large report their phases to ``log``
JOB_COLUMNS = (
    "pfi",
    "pfi_measured",
    "gpus",
    "max_slowdown",
    "cluster",
    "dram_copy_product",
    "node",
)


def _check_units(
    jobs: Sequence[str],
    curves: Curves,
    per_job: Mapping[str, Any],
    points: pd.DataFrame,
    source: str | None,
) -> None:
    """Each job's uncapped power per GPU in the range a GPU draws, the range the sweep reader
    holds ``power_w / gpus`` to (``POWER_RANGE_W``; the highest point at least the lowest cap,
    ``CAP_RANGE_W``): curves in kW (0.7 for 700 W) would cap nothing and say nothing. Without
    a ``gpus`` column only the floor is held (a job of one GPU draws at least that)."""
    gpus = (
        pd.to_numeric(pd.Series(per_job["gpus"]), errors="coerce").to_numpy(float)
        if "gpus" in per_job
        else np.ones(len(jobs))
    )
    per_gpu = curves.ceiling_w / gpus
    # without a gpus column a job may hold any number of GPUs: only the floor can be held
    low, high = CAP_RANGE_W[0], POWER_RANGE_W[1] if "gpus" in per_job else np.inf
    bad = np.flatnonzero((per_gpu < low) | (per_gpu > high))
    if bad.size:
        i = int(bad[0])
        line = int(np.flatnonzero((points["job"] == jobs[i]).to_numpy())[0]) + 2
        hint = "in kW? power_w is watts" if per_gpu[i] < low else "in mW? power_w is watts"
        raise ValueError(
            f"{'' if source is None else f'{source}:{line}: '}job {jobs[i]!r}: uncapped "
            f"power_w {curves.ceiling_w[i]:.6g} is {per_gpu[i]:.4g} W per GPU "
            f"({'gpus ' + format(gpus[i], 'g') if 'gpus' in per_job else 'no gpus column: 1 GPU'}), "
            f"outside the {low:g}-{POWER_RANGE_W[1]:g} W a GPU draws ({hint})"
            + (f" (and {bad.size - 1} more such job(s))" if bad.size > 1 else "")
        )


def allocate_table(
    points: pd.DataFrame,
    policy: str,
    *,
    cut: float | None = None,
    budget_w: float | None = None,
    moe_ft_share: float = _ALLOCATION["moe_ft_share"],
    curve_nodes: int = _ALLOCATION["curve_nodes"],
    source: str | None = None,
    log: Callable[[str], None] | None = None,
    site: Any = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Allocate one workload given as long-format points.

    ``points``: columns ``job, power_w, throughput`` (one row per measured point; the
    highest-power point is the uncapped one), optional per-point ``cap_w`` and per-job
    ``pfi``, ``gpus``, ``max_slowdown``, ``cluster`` (``moe-ft`` for MoE-FT weighting),
    ``dram_copy_product``. Give ``cut`` (fraction of the uncapped power) or ``budget_w``.
    Returns one row per job (``job, power_w, throughput`` and ``cap_w`` per GPU when caps
    or ``gpus`` are known) and totals (with the oracle's throughput for comparison).
    Raises :class:`InfeasibleBudget` when the floors exceed the budget.

    The points are checked first (:func:`~wattflex.allocation.curves.check_points`; errors
    name ``source``'s line). A curve whose throughput falls as power rises is replaced by
    its isotonic fit (``monotone_fit``; ``log`` gets a note, ``totals["monotone_fit_jobs"]``
    counts them): such a dip is measurement noise on a saturated curve or a bad point, and
    a budget can always run a job at a lower cap, so no allocation should depend on it.
    ``log`` (e.g. a stderr printer) also gets one line per phase on workloads of 1,000 jobs
    or more. No job is ever allocated below its floor.

    ``site`` (:class:`wattflex.ops.adapters.topology.Site`): every level of the site's electrical tree
    (feeds, PDUs, racks, nodes) is held as well as the budget; each job's ``node`` column
    places it (a job on a node the site does not name is held by the site's limit only, said
    to ``log``). ``totals["levels"]`` then gives each level's limit and allocated load, and
    :class:`InfeasibleBudget` names the level the floors overload.
    """
    t0 = time.perf_counter()
    missing = {"job", "power_w", "throughput"} - set(points.columns)
    if missing:
        raise ValueError(
            f"missing column(s) {', '.join(sorted(missing))} (need job, power_w, throughput)"
        )
    progress = log if (log is not None and points["job"].nunique() >= PROGRESS_JOBS) else None

    def phase(msg: str) -> None:
        if progress is not None:
            progress(f"[{time.perf_counter() - t0:6.1f} s] {msg}")

    if (cut is None) == (budget_w is None):
        raise ValueError("give exactly one of cut or budget_w")
    if cut is not None and not 0.0 <= cut < 1.0:
        percent = f" (a percentage? {cut:g}% is {cut / 100:g})" if 1 < cut <= 100 else ""
        raise ValueError(f"cut must be a fraction in [0, 1), got {cut}{percent}")
    if budget_w is not None and not (np.isfinite(budget_w) and budget_w > 0):
        raise ValueError(f"budget_w must be a positive number of watts, got {budget_w}")
    check_points(points, source)
    has_cap = "cap_w" in points.columns and points["cap_w"].notna().all()
    jobs, curves = curves_from_points(
        points["job"], points["power_w"], points["throughput"], points["cap_w"] if has_cap else None
    )
    phase(
        f"{len(points)} points -> {len(jobs)} job curves (up to {curves.power_w.shape[-1]} points each)"
    )
    curves, fitted = monotone_fit(curves)
    if fitted.any() and log is not None:
        i = int(np.flatnonzero(fitted)[0])
        log(
            f"note: {int(fitted.sum())} job(s) have throughput falling as power rises (e.g. {jobs[i]!r}); "
            f"allocating on their isotonic (non-decreasing least-squares) fit instead"
        )
    per_job = {}
    for col in JOB_COLUMNS:
        if col not in points.columns:
            continue
        varying = points.groupby("job", sort=False)[col].nunique(dropna=False) > 1
        if varying.any():
            raise ValueError(
                f"column {col!r} must be constant within a job (varies for {list(varying[varying].index)[:3]})"
            )
        per_job[col] = points.groupby("job", sort=False)[col].first().reindex(jobs).to_numpy()
    if "gpus" in per_job:
        g = pd.to_numeric(pd.Series(per_job["gpus"]), errors="coerce").to_numpy(float)
        bad = ~(np.isfinite(g) & (g > 0))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            line = int(np.flatnonzero((points["job"] == jobs[i]).to_numpy())[0]) + 2
            raise ValueError(
                f"{'' if source is None else f'{source}:{line}: '}job {jobs[i]!r}: gpus "
                f"{per_job['gpus'][i]} is not a positive number"
            )
    _check_units(jobs, curves, per_job, points, source)
    features = {
        "pfi": per_job.get("pfi"),
        "pfi_measured": per_job.get("pfi_measured"),
        "dram_copy_product": per_job.get("dram_copy_product"),
        "moe_ft": None if "cluster" not in per_job else per_job["cluster"] == "moe-ft",
    }
    need = get(policy, "allocation").feature
    if need is not None and features.get(need) is None:
        column = "cluster" if need == "moe_ft" else need
        raise ValueError(f"policy {policy} needs a per-job {column!r} column")
    features = {k: v for k, v in features.items() if v is not None}
    slowdown = per_job["max_slowdown"].astype(float) if "max_slowdown" in per_job else None
    uncapped_w = float(curves.ceiling_w.sum())
    budget = (1.0 - cut) * uncapped_w if budget_w is None else float(budget_w)
    if budget > uncapped_w:  # nothing to cut: every job runs uncapped (not a negative cut)
        if log is not None:
            log(
                f"note: budget {budget:.6g} W is above the jobs' uncapped power {uncapped_w:.1f} W: no job is capped"
            )
        budget = uncapped_w
    nested = None
    if site is not None:
        if "node" not in per_job:
            raise ValueError("a site's limits need a node column: the node each job runs on")
        nodes = [str(n) for n in per_job["node"]]
        nested = site.laminar(nodes)
        note = site.unplaced_note(nodes)
        if note and log is not None:
            log(note)
    kw = dict(
        max_slowdown=slowdown, moe_ft_share=moe_ft_share, curve_nodes=curve_nodes, nested=nested
    )
    phase(f"allocating {budget:.1f} W over {len(jobs)} jobs ({policy})")
    a = allocate(curves, budget, policy, features, **kw)
    if not bool(a.feasible):
        floors = float(a.floor_w.sum())
        over = nested.violations(a.floor_w) if nested is not None else []
        if over:
            name, load, limit = over[0]
            raise InfeasibleBudget(
                f"the site's {name} (limit {limit:.1f} W) is below the floors of its jobs, "
                f"{load:.1f} W: no allocation holds it"
            )
        why = "lowest-power points" + (" raised by max_slowdown" if slowdown is not None else "")
        raise InfeasibleBudget(
            f"budget {budget:.1f} W is below the jobs' floors {floors:.1f} W "
            f"(sum of their {why}); the deepest feasible cut is "
            f"{1 - floors / uncapped_w:.1%} ({floors:.1f} W)"
        )
    below = a.power_w < a.floor_w - RTOL * np.maximum(a.floor_w, 1.0)
    if below.any():  # a policy bug must never reach the output
        i = int(np.flatnonzero(below)[0])
        raise ValueError(
            f"internal error: {policy} allocated job {jobs[i]!r} {a.power_w[i]:.1f} W, below its floor "
            f"{a.floor_w[i]:.1f} W"
        )
    best_name = optimum()
    if policy != best_name:
        phase(f"{best_name} over {len(jobs)} jobs (for comparison)")
    best = (
        a
        if policy == best_name
        else allocate(curves, budget, best_name, features, max_slowdown=slowdown, nested=nested)
    )
    out = pd.DataFrame({"job": jobs, "power_w": a.power_w, "throughput": a.throughput})
    gpus = per_job.get("gpus")
    cap = power_to_cap(curves, a.power_w, None if gpus is None else gpus.astype(float))
    if cap is not None and (has_cap or gpus is not None):
        out["cap_w"] = cap
    uncapped_t = float(curves.uncapped_throughput.sum())
    totals = {
        "policy": policy,
        "n_jobs": len(jobs),
        "cut": 1.0 - budget / uncapped_w,
        "budget_w": budget,
        "uncapped_power_w": uncapped_w,
        "floors_w": float(a.floor_w.sum()),
        "total_power_w": float(a.power_w.sum()),
        "total_throughput": float(a.total_throughput),
        "uncapped_throughput": uncapped_t,
        "oracle_throughput": float(best.total_throughput),
        "gap_to_oracle": float(best.total_throughput - a.total_throughput),
        # how the oracle answered: certified rounding or MILP, and its proven relative gap
        "oracle_method": str(best.oracle_method),
        "oracle_gap_rel": float(best.oracle_gap_rel),
        "cap_source": "measured cap_w"
        if has_cap
        else ("power_w / gpus" if gpus is not None else None),
    }
    if nested is not None:
        totals["levels"] = nested.report(a.power_w)
    if fitted.any():
        totals["monotone_fit_jobs"] = int(fitted.sum())
    if slowdown is not None:
        target = (1.0 - slowdown) * curves.uncapped_throughput
        totals["sla_violations"] = int(
            np.sum(np.isfinite(slowdown) & (a.throughput < target * (1 - 1e-9)))
        )
    phase("done")
    return out, totals
