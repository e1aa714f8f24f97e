"""The exact allocation oracle: maximise total throughput under a power budget.

Problem, for jobs with piecewise-linear power -> throughput curves ``T_i`` on
``[floor_i, ceiling_i]``::

    max  sum_i T_i(p_i)   s.t.  sum_i p_i <= budget,  floor_i <= p_i <= ceiling_i

Method (exact for any piecewise-linear curves, concave or not):

1. **Hull greedy** (vectorised over many workloads at once). Replace every curve by its
   upper concave envelope ("hull"); the relaxed problem is a fractional knapsack over the
   hull segments, solved exactly by filling segments in decreasing order of slope from
   the floors (segments of a concave curve have decreasing slopes, so the order within a
   job is respected). Its value is an upper bound on the true optimum.
2. **Certificate.** At most one job ends inside a segment; every other job sits on a hull
   vertex, and hull vertices lie on the curve. If the true throughput equals the hull
   value for every job, the bound is attained and the greedy allocation is optimal. For
   concave curves (hull == curve) this always holds, so the greedy alone is the oracle.
3. **MILP** for the rare uncertified workload (a non-concave curve whose bridge holds the
   marginal job): :func:`milp_oracle`, an exact mixed-integer formulation solved by
   scipy's HiGHS, with identical jobs merged so that copies of one group do not make the
   search symmetric. Before it, Lagrangian reduced-cost fixing (:func:`lagrangian_domains`)
   confines each job to the power range where it could still be part of a better
   allocation than the greedy's; most jobs end up on a locally concave piece that needs no
   binary variable, which keeps workloads of 10,000 jobs tractable.

Tests check the greedy and the MILP against brute-force vertex enumeration on small
random instances, concave and not.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

# Relative tolerance on throughput (hull vs curve) and on power (budget feasibility).
RTOL = 1e-9


def interp(xp: np.ndarray, fp: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Row-wise ``np.interp``: ``xp, fp`` of shape (..., K) (``xp`` non-decreasing, repeated
    points allowed); ``x`` of shape (...) (one query per row) or (..., m) (m per row).
    Queries are clipped to ``[xp[..., 0], xp[..., -1]]``."""
    xp = np.asarray(xp, dtype=float)
    fp = np.asarray(fp, dtype=float)
    x = np.asarray(x, dtype=float)
    one = x.ndim < xp.ndim
    q = np.clip(x[..., None] if one else x, xp[..., :1], xp[..., -1:])
    K = xp.shape[-1]
    if K == 1:
        out = np.broadcast_to(fp[..., :1], q.shape).copy()
    else:
        # flat gathers: much faster than take_along_axis on large batches
        lead = np.broadcast_shapes(xp.shape[:-1], q.shape[:-1])
        xf = np.broadcast_to(xp, (*lead, K)).reshape(-1, K)
        ff = np.broadcast_to(fp, (*lead, K)).reshape(-1, K)
        qf = np.broadcast_to(q, (*lead, q.shape[-1])).reshape(len(xf), q.shape[-1])
        seg = np.zeros(qf.shape, dtype=np.intp)
        for k in range(1, K - 1):
            seg += xf[:, k:k + 1] <= qf
        base = seg + (np.arange(len(xf)) * K)[:, None]
        x0, x1 = xf.ravel()[base], xf.ravel()[base + 1]
        y0, y1 = ff.ravel()[base], ff.ravel()[base + 1]
        width = x1 - x0
        t = np.divide(qf - x0, width, out=np.zeros_like(width), where=width > 0)
        out = (y0 + t * (y1 - y0)).reshape(*lead, q.shape[-1])
    return out[..., 0] if one else out


def concave_hull(power_w: np.ndarray, throughput: np.ndarray) -> np.ndarray:
    """Upper concave envelope of each curve, evaluated at its own vertices (..., K).

    In one dimension the envelope at a vertex is the highest chord between two vertices
    on either side of it (Carathéodory), so K <= ~10 makes the O(K^3) scan cheap and fully
    vectorised; zero-length chords (padding, collapsed points) are skipped.
    """
    P = np.asarray(power_w, dtype=float)
    T = np.asarray(throughput, dtype=float)
    hull = T.copy()
    K = P.shape[-1]
    for i in range(K - 2):
        for j in range(i + 2, K):
            width = P[..., j] - P[..., i]
            ok = width > 0
            slope = np.divide(T[..., j] - T[..., i], width, out=np.zeros_like(width), where=ok)
            for k in range(i + 1, j):
                chord = T[..., i] + slope * (P[..., k] - P[..., i])
                hull[..., k] = np.where(ok, np.maximum(hull[..., k], chord), hull[..., k])
    return hull


@dataclass
class Solution:
    """Allocation of one or many workloads: arrays (..., n) and per-workload (...)."""
    power_w: np.ndarray        # allocated power per job
    throughput: np.ndarray     # true throughput at that power
    feasible: np.ndarray       # floors fit under the budget
    certified: np.ndarray      # hull greedy proved optimal (else an exact fallback ran)
    bound: np.ndarray          # upper bound on the optimum (hull, or the MILP's dual bound)
    gap: np.ndarray | None = None  # proven optimality gap, bound - value (0: exact)


def _throughput_tol(T: np.ndarray) -> np.ndarray:
    return RTOL * (np.abs(T).max(-1) + 1.0)


@dataclass
class GreedyPlan:
    """The budget-independent part of the hull greedy (reused across cuts)."""
    hull: np.ndarray           # (..., n, K) concave envelope at the vertices
    order: np.ndarray          # (..., n*(K-1)) segments by decreasing hull slope
    sorted_slope: np.ndarray   # (..., n*(K-1)) their slopes
    sorted_width: np.ndarray   # (..., n*(K-1)) usable (positive-slope) widths in that order
    before: np.ndarray         # (..., n*(K-1)) width of all earlier segments


def plan_greedy(power_w: np.ndarray, throughput: np.ndarray) -> GreedyPlan:
    P = np.asarray(power_w, dtype=float)
    hull = concave_hull(P, throughput)
    lead, (n, K) = P.shape[:-2], P.shape[-2:]
    width = np.diff(P, axis=-1)
    slope = np.divide(np.diff(hull, axis=-1), width, out=np.full_like(width, -np.inf), where=width > 0)
    usable = np.where(slope > 0, width, 0.0).reshape(*lead, n * (K - 1))
    # stable: equal slopes keep segment order, so a job's segments fill bottom-up
    flat_slope = slope.reshape(*lead, n * (K - 1))
    order = np.argsort(-flat_slope, axis=-1, kind="stable")
    sorted_width = np.take_along_axis(usable, order, -1)
    return GreedyPlan(hull, order, np.take_along_axis(flat_slope, order, -1), sorted_width,
                      np.cumsum(sorted_width, -1) - sorted_width)


def hull_greedy(power_w: np.ndarray, throughput: np.ndarray, budget_w: np.ndarray,
                plan: GreedyPlan | None = None) -> Solution:
    """Exact optimum of the hull relaxation for every workload at once (see module doc).

    ``power_w, throughput``: (..., n, K) curves; ``budget_w``: (...). Workloads whose
    floors exceed the budget get their floors and ``feasible = False``. ``plan``: from
    :func:`plan_greedy` on the same curves (saves the sort when solving many budgets).
    """
    P = np.asarray(power_w, dtype=float)
    T = np.asarray(throughput, dtype=float)
    budget = np.asarray(budget_w, dtype=float)
    lead, (n, K) = P.shape[:-2], P.shape[-2:]
    floor = P[..., 0]
    slack = budget - floor.sum(-1)
    feasible = slack >= -RTOL * np.maximum(np.abs(budget), 1.0)
    if K == 1:
        return Solution(floor.copy(), T[..., 0].copy(), feasible, np.ones(lead, bool), T[..., 0].sum(-1), np.zeros(lead))
    plan = plan or plan_greedy(P, T)
    taken_sorted = np.clip(slack[..., None] - plan.before, 0.0, plan.sorted_width)
    taken = np.empty_like(taken_sorted)
    np.put_along_axis(taken, plan.order, taken_sorted, -1)
    alloc = np.clip(floor + taken.reshape(*lead, n, K - 1).sum(-1), floor, P[..., -1])
    alloc = np.where(feasible[..., None], alloc, floor)
    hull_value = interp(P, plan.hull, alloc)
    true_value = interp(P, T, alloc)
    certified = np.all(true_value >= hull_value - _throughput_tol(T), axis=-1) | ~feasible
    bound = hull_value.sum(-1)
    return Solution(alloc, true_value, feasible, certified, bound, np.where(certified, 0.0, bound - true_value.sum(-1)))


def dive(power_w: np.ndarray, throughput: np.ndarray, budget_w: float, start: Solution,
         max_steps: int = 64) -> tuple[np.ndarray, float]:
    """A good feasible allocation of one workload (n, K) from a greedy solution: fix the job
    that sits under a hull bridge at the better end of the bridge, re-solve the others,
    repeat until every job is on its curve. Returns (power, true value); a heuristic that
    only feeds :func:`lagrangian_domains` a tight incumbent."""
    P, T = power_w, throughput
    tol = RTOL * (np.abs(T).max(-1).sum() + 1.0)
    lo, hi = P[:, 0].copy(), P[:, -1].copy()
    best_p, best_v = start.power_w, float(start.throughput.sum())
    cur = start
    for _ in range(max_steps):
        Pr = np.clip(P, lo[:, None], hi[:, None])
        Tr = interp(P, T, Pr)
        hull = concave_hull(Pr, Tr)
        gap = interp(Pr, hull, cur.power_w) - cur.throughput
        j = int(np.argmax(gap))
        if gap[j] <= tol:
            break
        on_hull = Tr[j] >= hull[j] - tol
        ends = (Pr[j][on_hull & (Pr[j] <= cur.power_w[j])].max(), Pr[j][on_hull & (Pr[j] >= cur.power_w[j])].min())
        children = []
        for end in ends:
            lo_c, hi_c = lo.copy(), hi.copy()
            lo_c[j] = hi_c[j] = end
            if lo_c.sum() > budget_w:
                continue
            Pc = np.clip(P, lo_c[:, None], hi_c[:, None])
            child = hull_greedy(Pc, interp(P, T, Pc), budget_w)
            children.append((float(child.bound), lo_c, hi_c, child))
            if child.throughput.sum() > best_v:
                best_p, best_v = child.power_w, float(child.throughput.sum())
        if not children:
            break
        _, lo, hi, cur = max(children, key=lambda c: c[0])
    return best_p, best_v


def lagrangian_domains(power_w: np.ndarray, throughput: np.ndarray, budget_w: float,
                       incumbent: float, plan: GreedyPlan) -> tuple[np.ndarray, np.ndarray]:
    """Power ranges (lo, hi) per job (n, K) outside which no allocation can beat ``incumbent``.

    With the budget's LP dual price ``lam`` (the hull slope where the greedy's budget runs
    out), any allocation's value is at most ``L - sum_i (r_i* - r_i(p_i))`` where ``r_i(p) =
    T_i(p) - lam * p``, ``r_i* = max r_i`` and ``L = sum r_i* + lam * budget`` (the hull
    bound). So a better allocation keeps every job where ``r_i* - r_i(p) <= L - incumbent``:
    usually a small piece around its hull vertex, where the curve is locally concave.
    """
    P, T = power_w, throughput
    slack = budget_w - P[:, 0].sum()
    k = int(np.searchsorted(np.cumsum(plan.sorted_width), slack))
    lam = float(max(plan.sorted_slope[k], 0.0)) if k < len(plan.sorted_slope) else 0.0
    r = T - lam * P
    best = r.max(-1)
    gap = best.sum() + lam * budget_w - incumbent
    tol = RTOL * (np.abs(T).max(-1).sum() + 1.0)
    thr = (best - max(gap, 0.0) - tol)[:, None]
    ok = r >= thr
    K = P.shape[1]
    first = np.argmax(ok, axis=-1)
    last = K - 1 - np.argmax(ok[:, ::-1], axis=-1)
    rows = np.arange(len(P))

    def crossing(a, b):  # where r falls to the threshold between vertices a and b
        ra, rb = r[rows, a], r[rows, b]
        t = np.divide(thr[:, 0] - ra, rb - ra, out=np.zeros_like(ra), where=rb != ra)
        return P[rows, a] + np.clip(t, 0.0, 1.0) * (P[rows, b] - P[rows, a])

    lo = np.where(first > 0, crossing(np.maximum(first - 1, 0), first), P[:, 0])
    hi = np.where(last < K - 1, crossing(np.minimum(last + 1, K - 1), last), P[:, -1])
    return lo, hi


def milp_oracle(power_w: np.ndarray, throughput: np.ndarray, budget_w: float,
                time_limit_s: float = 120.0) -> Solution:
    """Exact optimum of one workload (n, K) as a MILP (scipy.optimize.milp / HiGHS).

    An optimal allocation exists with every job but one on a curve vertex (fix each job's
    segment: the rest is an LP with one budget row, whose vertices have at most one
    variable off its bounds). So identical jobs (the same group drawn several times) are
    merged into a class of ``k`` copies: ``k - 1`` copies are counted at vertices by
    integers ``m_v`` (``sum_v m_v = k - 1``), and one free copy follows the curve through
    the incremental piecewise-linear formulation: ``delta_s`` in [0, 1] is the filled
    fraction of segment ``s`` and binary ``y_s`` enforces ``delta_{s+1} <= y_s <= delta_s``
    (a segment is used only once the one below it is full), so power and throughput are
    exact for any curve shape. Merging removes the symmetry between identical copies that
    otherwise makes branching explode.
    """
    P = np.asarray(power_w, dtype=float)
    T = np.asarray(throughput, dtype=float)
    floor = P[:, 0]
    if floor.sum() > budget_w + RTOL * max(abs(budget_w), 1.0):
        return Solution(floor.copy(), T[:, 0].copy(), np.asarray(False), np.asarray(True), T[:, 0].sum(), np.asarray(0.0))
    classes, job_class, counts = np.unique(np.hstack([P, T]), axis=0, return_inverse=True, return_counts=True)
    job_class = job_class.ravel()
    K = P.shape[1]
    cost: list[float] = []
    watts: list[float] = []
    upper: list[float] = []
    integer: list[int] = []
    entries: list[tuple[int, int, float]] = []
    row_lo: list[float] = []
    row_hi: list[float] = []

    def var(gain: float, w: float, ub: float, is_int: bool) -> int:
        cost.append(-gain)
        watts.append(w)
        upper.append(ub)
        integer.append(int(is_int))
        return len(cost) - 1

    def row(terms: list[tuple[int, float]], lo: float, hi: float) -> None:
        entries.extend((len(row_lo), v, a) for v, a in terms)
        row_lo.append(lo)
        row_hi.append(hi)

    free, counted = [], []
    for curve, k in zip(classes, counts):
        Pc, Tc = curve[:K], curve[K:]
        segs = [s for s in range(K - 1) if Pc[s + 1] > Pc[s]]
        deltas = [var(Tc[s + 1] - Tc[s], Pc[s + 1] - Pc[s], 1.0, False) for s in segs]
        # a concave curve fills its segments in order at any optimum: no binaries needed
        concave = bool(np.all(Tc >= concave_hull(Pc, Tc) - RTOL * (np.abs(Tc).max() + 1.0)))
        for below, above in ([] if concave else zip(deltas[:-1], deltas[1:])):
            y = var(0.0, 0.0, 1.0, True)
            row([(above, 1.0), (y, -1.0)], -np.inf, 0.0)
            row([(y, 1.0), (below, -1.0)], -np.inf, 0.0)
        free.append((Pc[0], [(d, Pc[s + 1] - Pc[s]) for d, s in zip(deltas, segs)]))
        # the other k-1 copies sit on vertices; they pay the floor offset themselves
        vertices = np.unique(Pc, return_index=True)[1]
        copies = [(var(Tc[v] - Tc[0], Pc[v] - Pc[0], k - 1, True), Pc[v]) for v in vertices] if k > 1 else []
        if copies:
            row([(m, 1.0) for m, _ in copies], k - 1, k - 1)
        counted.append(copies)
    row([(v, w) for v, w in enumerate(watts) if w], -np.inf, budget_w - floor.sum())
    r, c, a = zip(*entries)
    A = coo_matrix((a, (r, c)), shape=(len(row_lo), len(cost))).tocsr()
    res = milp(np.asarray(cost), constraints=LinearConstraint(A, row_lo, row_hi),
               integrality=np.asarray(integer), bounds=Bounds(0.0, np.asarray(upper)),
               options={"mip_rel_gap": 1e-10, "time_limit": time_limit_s})
    if res.x is None or res.status not in (0, 1):
        raise RuntimeError(f"MILP oracle failed: {res.message}")
    dual = getattr(res, "mip_dual_bound", None)
    value, upper = T[:, 0].sum() - res.fun, T[:, 0].sum() - (res.fun if dual is None else dual)
    if res.status == 1:  # time limit with a feasible allocation: keep it, say how far off it may be
        warnings.warn(f"MILP oracle stopped at its {time_limit_s:g} s limit with a proven gap of "
                      f"{upper - value:.6g} ({(upper - value) / max(abs(upper), 1e-12):.2e} relative)", stacklevel=2)
    x = res.x
    alloc = np.empty(len(P))
    for cls, ((base, deltas), copies) in enumerate(zip(free, counted)):
        powers = [base + sum(np.clip(x[d], 0.0, 1.0) * w for d, w in deltas)]
        for m, p_v in copies:
            powers += [p_v] * int(round(x[m]))
        alloc[job_class == cls] = powers[:counts[cls]]
    alloc = np.clip(alloc, floor, P[:, -1])
    return Solution(alloc, interp(P, T, alloc), np.asarray(True), np.asarray(False), np.asarray(max(upper, value)),
                    np.asarray(0.0 if res.status == 0 else max(upper - value, 0.0)))


def oracle(power_w: np.ndarray, throughput: np.ndarray, budget_w: np.ndarray,
           plan: GreedyPlan | None = None) -> Solution:
    """Exact optimum for every workload: the hull greedy, then :func:`milp_oracle` on the
    workloads it could not certify. Shapes as in :func:`hull_greedy`; ``certified`` is
    False where the MILP ran; ``gap`` is 0 wherever optimality is proven (always, unless
    the MILP hit its time limit: then a warning and the proven gap). Before the MILP, a
    dive finds a good incumbent and Lagrangian fixing narrows every job's power range."""
    P = np.asarray(power_w, dtype=float)
    T = np.asarray(throughput, dtype=float)
    if P.ndim == 2 and plan is None:
        # One workload: solve it as a batch of one (the per-workload fixes below index
        # writable (workloads,) arrays), then drop the leading axis again.
        many = oracle(P[None], T[None], np.asarray(budget_w, dtype=float).reshape(1))
        return Solution(*(None if v is None else np.asarray(v)[0] for v in
                          (many.power_w, many.throughput, many.feasible, many.certified, many.bound, many.gap)))
    budget = np.broadcast_to(np.asarray(budget_w, dtype=float), P.shape[:-2])
    plan = plan or plan_greedy(P, T)
    sol = hull_greedy(P, T, budget, plan)
    for idx in map(tuple, np.argwhere(~sol.certified)):
        Pi, Ti, Bi = P[idx], T[idx], float(budget[idx])
        sub = GreedyPlan(**{f.name: getattr(plan, f.name)[idx] for f in fields(GreedyPlan)})
        start = Solution(sol.power_w[idx], sol.throughput[idx], sol.feasible[idx], sol.certified[idx], sol.bound[idx])
        best_p, best_v = dive(Pi, Ti, Bi, start)
        lo, hi = lagrangian_domains(Pi, Ti, Bi, best_v, sub)
        Pr = np.clip(Pi, lo[:, None], hi[:, None])
        one = milp_oracle(Pr, interp(Pi, Ti, Pr), Bi)
        if one.throughput.sum() > best_v:
            best_p, best_v = one.power_w, float(one.throughput.sum())
        sol.power_w[idx] = best_p
        sol.throughput[idx] = interp(Pi, Ti, best_p)
        # nothing outside the fixed domains beats best_v, so the MILP's bound covers it all
        sol.bound[idx] = max(float(one.bound), best_v)
        sol.gap[idx] = max(float(one.bound) - best_v, 0.0) if float(one.gap) > 0 else 0.0
    return sol
