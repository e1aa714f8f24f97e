"""Nested (laminar) power limits: the site's feeds, PDUs, racks and nodes over the jobs.

A :class:`Laminar` family is a set of groups of items (jobs or (job, node) units), each
with a limit in W, any two groups either disjoint or one inside the other (a tree: every
group has at most one parent). The electrical tree of a site is one
(:mod:`wattflex.ops.adapters.topology` builds it); the site budget of an event is one more group
over every item.

**Exact allocation on concave curves** (:func:`nested_greedy`). With ``x_i = p_i - floor_i``
the feasible set ``{x >= 0 : x(S) <= limit_S - floor(S)}`` over a laminar family is a
polymatroid, and for a separable concave objective the greedy that takes curve segments in
decreasing order of marginal value (slope), each as far as every group above its job still
has room, is optimal (Federgruen & Groenevelt 1986, "The greedy procedure for resource
allocation problems: necessary and sufficient conditions for optimality", Oper. Res. 34(6);
Groenevelt 1991, "Two algorithms for maximizing a separable concave function over a
polymatroid feasible region", EJOR 54). On the concave hulls of any curves it is the exact
optimum of the relaxation, an upper bound; where every job ends on its own curve the bound
is attained. Otherwise :func:`wattflex.allocation.oracle.milp_oracle` with one row per group
is exact (:func:`nested_oracle`).

**Policies** (:func:`nested_water_fill`): a weighted policy's cut is water-filled top-down:
each group's budget (its limit, or what its parent gave it if less) is water-filled over
all the jobs under it in the policy's proportions; a child group that would get more than
it can hold (its limit, or its jobs' ceilings) is held there and the rest re-filled over
the others; then each child group is filled the same way from what it got. The policy's
proportions hold wherever no limit binds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from wattflex.allocation.oracle import (
    GAP_TOL,
    RTOL,
    Solution,
    concave_hull,
    interp,
    milp_oracle,
    price_domains,
)
from wattflex.allocation.waterfill import water_fill


@dataclass(frozen=True)
class Laminar:
    """Groups over ``n`` items: ``parent[g]`` (-1: a top group), ``limit_w[g]`` (inf: none),
    ``leaf[i]`` the smallest group holding item ``i`` (-1: none); every group holds the
    items of its descendants. ``names``/``kinds``: for reports (``rack:r1``, ``rack``)."""

    parent: np.ndarray
    limit_w: np.ndarray
    leaf: np.ndarray
    names: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    _paths: list = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        parent = np.asarray(self.parent, int)
        G = len(parent)
        for g in range(G):  # a tree: following parents ends at -1 within G steps
            a, steps = g, 0
            while a >= 0:
                a, steps = int(parent[a]), steps + 1
                if steps > G:
                    raise ValueError(f"group {self.label(g)}: its parents loop")
        if np.any((np.asarray(self.leaf) < -1) | (np.asarray(self.leaf) >= G)):
            raise ValueError("an item's group is out of range")

    @property
    def n(self) -> int:
        return len(self.leaf)

    def label(self, g: int) -> str:
        return self.names[g] if g < len(self.names) else f"group {g}"

    def path(self, i: int) -> list[int]:
        """The groups holding item ``i``, smallest first."""
        if not self._paths:
            for leaf in np.asarray(self.leaf, int):
                p, a = [], int(leaf)
                while a >= 0:
                    p.append(a)
                    a = int(self.parent[a])
                self._paths.append(p)
        return self._paths[i]

    def members(self) -> np.ndarray:
        """(G, n) bool: group g holds item i."""
        m = np.zeros((len(self.parent), self.n), bool)
        for i in range(self.n):
            m[self.path(i), i] = True
        return m

    def loads(self, power_w: np.ndarray) -> np.ndarray:
        """Per group (..., G): the summed power of its items (..., n)."""
        return np.asarray(power_w, float) @ self.members().T.astype(float)

    def with_budget(self, budget_w: float) -> Laminar:
        """The family with one more top group over every item (the event's site budget)."""
        G = len(self.parent)
        parent = np.append(np.where(np.asarray(self.parent) < 0, G, self.parent), -1)
        leaf = np.where(np.asarray(self.leaf) < 0, G, self.leaf)
        return Laminar(
            parent,
            np.append(self.limit_w, budget_w),
            leaf,
            (*self.names, "budget"),
            (*self.kinds, "budget"),
        )

    def subset(self, keep: np.ndarray, reserved_w: np.ndarray) -> Laminar:
        """The family over items ``keep`` (bool mask), every limit less the power
        ``reserved_w`` (n,) of the items left out that it holds."""
        keep = np.asarray(keep, bool)
        held = self.loads(np.where(keep, 0.0, np.asarray(reserved_w, float)))
        return Laminar(
            self.parent,
            np.asarray(self.limit_w, float) - held,
            np.asarray(self.leaf)[keep],
            self.names,
            self.kinds,
        )

    def report(self, power_w: np.ndarray) -> dict[str, dict[str, object]]:
        """Per group (by name): its ``kind``, ``limit_w`` and ``load_w`` under ``power_w``."""
        return {
            self.label(g): {
                "kind": self.kinds[g] if g < len(self.kinds) else "",
                "limit_w": float(lim),
                "load_w": float(load),
            }
            for g, (lim, load) in enumerate(zip(self.limit_w, self.loads(power_w)))
        }

    def violations(self, power_w: np.ndarray, rtol: float = 1e-9) -> list[tuple[str, float, float]]:
        """(group, load, limit) of every group over its limit."""
        load = self.loads(power_w)
        lim = np.asarray(self.limit_w, float)
        return [
            (self.label(g), float(load[g]), float(lim[g]))
            for g in np.flatnonzero(load > lim + rtol * np.maximum(np.abs(lim), 1.0))
        ]


def _room(fam: Laminar, floor_w: np.ndarray) -> list[float]:
    """Each group's room above its items' floors."""
    return list(np.asarray(fam.limit_w, float) - fam.loads(floor_w))


def floors_fit(fam: Laminar, floor_w: np.ndarray) -> bool:
    return all(r >= -RTOL * max(abs(lim), 1.0) for r, lim in zip(_room(fam, floor_w), fam.limit_w))


def nested_greedy(
    power_w: np.ndarray,
    throughput: np.ndarray,
    fam: Laminar,
    hull: np.ndarray | None = None,
    full_at: list[float] | None = None,
) -> np.ndarray:
    """The greedy on the concave hulls of curves (n, K) under ``fam``'s limits (module
    docstring): each hull segment, steepest first (positive slopes only), takes as much of
    its width as every group above its job has room for. Floors must fit. Returns powers;
    ``full_at`` (a list, filled): per group the slope at which it filled (0: it did not)."""
    P = np.asarray(power_w, float)
    n, K = P.shape
    H = concave_hull(P, throughput) if hull is None else hull
    floor = P[:, 0]
    if K == 1:
        return floor.copy()
    width = np.diff(P, axis=-1)
    slope = np.divide(np.diff(H, axis=-1), width, out=np.full_like(width, -np.inf), where=width > 0)
    flat = slope.ravel()
    order = np.argsort(-flat, kind="stable")  # equal slopes keep segment order (bottom-up)
    order = order[flat[order] > 0]
    room = _room(fam, floor)
    paths = [fam.path(i) for i in range(n)]
    w = width.ravel().tolist()
    add = [0.0] * n
    full = [False] * len(room)
    slopes = flat.tolist()
    at = [0.0] * len(room)
    for t in order.tolist():
        j = t // (K - 1)
        p = paths[j]
        if any(full[g] for g in p):
            continue
        take = w[t]
        for g in p:
            if room[g] < take:
                take = room[g]
        if take <= 0.0:
            continue
        add[j] += take
        for g in p:
            room[g] -= take
            if room[g] <= 1e-12 * max(abs(fam.limit_w[g]), 1.0):
                full[g], at[g] = True, slopes[t]
    if full_at is not None:
        full_at[:] = at
    return np.clip(floor + np.asarray(add), floor, P[:, -1])


def group_prices(fam: Laminar, full_at: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Dual prices from the greedy: a group's effective price ``e_g`` is the highest slope at
    which it or a group above it filled; ``mu_g = e_g - e_parent >= 0``, and a job's price
    (the sum of ``mu`` over the groups holding it) is ``e`` of its smallest group. Any
    ``mu >= 0`` gives the Lagrangian bound ``sum_i max_p (T_i(p) - price_i p) + sum_g mu_g
    limit_g`` (weak duality); these make it the greedy's hull bound. Returns (mu (G,),
    price (n,))."""
    G = len(fam.parent)
    e = np.zeros(G)
    done = np.zeros(G, bool)

    def eff(g: int) -> float:
        if g < 0:
            return 0.0
        if not done[g]:
            e[g], done[g] = max(float(full_at[g]), eff(int(fam.parent[g]))), True
        return float(e[g])

    for g in range(G):
        eff(g)
    parent_e = np.array([e[p] if p >= 0 else 0.0 for p in np.asarray(fam.parent, int)])
    leaf = np.asarray(fam.leaf, int)
    return e - parent_e, np.where(leaf >= 0, e[np.maximum(leaf, 0)], 0.0)


def freeze_round(
    P: np.ndarray,
    T: np.ndarray,
    hull: np.ndarray,
    fam: Laminar,
    alloc: np.ndarray,
    rounds: int = 64,
) -> np.ndarray:
    """A feasible allocation on the true curves from the nested greedy's: every job left
    inside a hull bridge (off its curve) is held at the bridge's lower end (a hull vertex,
    on its curve: the loads only fall, so every limit still holds) and the greedy re-runs
    for the others with what that freed, until no job is off its curve."""
    tol = RTOL * (np.abs(T).max(-1) + 1.0)
    on_hull = T >= hull - tol[:, None]
    Pr, Tr, Hr = P.copy(), T.copy(), hull.copy()
    for _ in range(rounds):
        off = np.flatnonzero(interp(P, T, alloc) < interp(Pr, Hr, alloc) - tol)
        if not len(off):
            break
        for j in off:
            end = P[j][on_hull[j] & (P[j] <= alloc[j] + 1e-9)].max()
            Pr[j], Tr[j], Hr[j] = (
                end,
                interp(P[j], T[j], np.array(end)),
                interp(P[j], T[j], np.array(end)),
            )
        alloc = nested_greedy(Pr, Tr, fam, Hr)
    return alloc


def polish(P: np.ndarray, T: np.ndarray, fam: Laminar, power_w: np.ndarray) -> np.ndarray:
    """The MILP's allocation made exactly feasible and exactly optimal for its choice of
    curve segment: each job restricted to the segment it sits on (the one below a vertex it
    sits at, so it can give back what HiGHS's feasibility tolerance let it overdraw), where
    the curves are linear, so the nested greedy is exact on them."""
    n, K = P.shape
    rows = np.arange(n)
    p = np.asarray(power_w, float)
    s = np.clip((P[:, 1:-1] <= p[:, None]).sum(-1), 0, K - 2) if K > 2 else np.zeros(n, int)
    at_vertex = (np.abs(p - P[rows, s]) <= 1e-6 * np.maximum(np.abs(p), 1.0)) & (s > 0)
    s = np.where(at_vertex, s - 1, s)
    lo, hi = P[rows, s], P[rows, s + 1]
    Pr = np.clip(P, lo[:, None], hi[:, None])
    if not floors_fit(fam, Pr[:, 0]):
        return p
    return nested_greedy(Pr, interp(P, T, Pr), fam)


def nested_oracle(
    power_w: np.ndarray,
    throughput: np.ndarray,
    budget_w: float,
    fam: Laminar,
    time_limit_s: float = 120.0,
    gap_tol: float = GAP_TOL,
) -> Solution:
    """The throughput-maximising allocation of one workload (n, K) under the site budget and
    every limit of ``fam``: the nested greedy on the hulls, certified where every job ends
    on its curve (always, for concave curves, ``method`` "nested-greedy"); else
    :func:`freeze_round`, kept when its proven gap to the hull bound is at most ``gap_tol``
    (``"nested-rounded"``, as the flat oracle's ``"hull-certified"``; 0: never); else the
    MILP with a row per group (``"milp"``). Floors that do not fit some group: the floors,
    ``feasible`` False."""
    P = np.asarray(power_w, float)
    T = np.asarray(throughput, float)
    full = fam.with_budget(float(budget_w)) if math.isfinite(budget_w) else fam
    floor = P[:, 0]
    if not floors_fit(full, floor):
        return Solution(
            floor.copy(),
            T[:, 0].copy(),
            np.asarray(False),
            np.asarray(True),
            np.asarray(T[:, 0].sum()),
            np.asarray(0.0),
            np.asarray("infeasible"),
            np.asarray(0.0),
        )
    hull = concave_hull(P, T)
    alloc = nested_greedy(P, T, full, hull)
    value = interp(P, T, alloc)
    bound = float(interp(P, hull, alloc).sum())
    tol = RTOL * (np.abs(T).max(-1) + 1.0)
    if np.all(value >= interp(P, hull, alloc) - tol):
        gap = max(bound - float(value.sum()), 0.0)
        return Solution(
            alloc,
            value,
            np.asarray(True),
            np.asarray(True),
            np.asarray(bound),
            np.asarray(gap),
            np.asarray("nested-greedy"),
            np.asarray(gap / max(abs(bound), 1e-12)),
        )
    rounded = freeze_round(P, T, hull, full, alloc)
    r_value = interp(P, T, rounded)
    r_gap = max(bound - float(r_value.sum()), 0.0)
    if r_gap <= gap_tol * max(abs(bound), 1e-12):
        return Solution(
            rounded,
            r_value,
            np.asarray(True),
            np.asarray(True),
            np.asarray(bound),
            np.asarray(r_gap),
            np.asarray("nested-rounded"),
            np.asarray(r_gap / max(abs(bound), 1e-12)),
        )
    # Lagrangian fixing with the greedy's prices (as the flat oracle's): no allocation better
    # than the rounding leaves these ranges, so the MILP only sees them
    at: list[float] = []
    nested_greedy(P, T, full, hull, at)
    mu, price = group_prices(full, at)
    lag = float(
        (T - price[:, None] * P).max(-1).sum()
        + (mu * np.where(np.isfinite(full.limit_w), full.limit_w, 0.0)).sum()
    )
    lo, hi = price_domains(P, T, price, lag - float(r_value.sum()))
    Pr = np.clip(P, lo[:, None], hi[:, None])
    groups = [(m, float(lim)) for m, lim in zip(fam.members(), fam.limit_w) if math.isfinite(lim)]
    one = milp_oracle(
        Pr,
        interp(P, T, Pr),
        float(budget_w),
        time_limit_s,
        groups=groups,
        leaf=np.asarray(fam.leaf),
    )
    one.power_w = polish(P, T, full, one.power_w)
    one.throughput = interp(P, T, one.power_w)
    one.bound = np.asarray(min(max(float(one.bound), float(r_value.sum())), lag, bound))
    if float(one.throughput.sum()) < float(r_value.sum()):  # never worse than the rounding
        one.power_w, one.throughput = rounded, r_value
    gap = max(float(one.bound) - float(one.throughput.sum()), 0.0)
    return Solution(
        one.power_w,
        one.throughput,
        np.asarray(True),
        np.asarray(False),
        one.bound,
        np.asarray(gap),
        np.asarray("milp"),
        np.asarray(gap / max(abs(float(one.bound)), 1e-12)),
    )


def nested_water_fill(
    budget_w: float, floor_w: np.ndarray, ceiling_w: np.ndarray, weights: np.ndarray, fam: Laminar
) -> np.ndarray:
    """A weighted policy's powers (n,) under ``budget_w`` and every limit (module docstring).
    Floors that do not fit: every job at its floor (the caller reports it)."""
    floor, ceil = np.asarray(floor_w, float), np.asarray(ceiling_w, float)
    full = fam.with_budget(float(budget_w)) if math.isfinite(budget_w) else fam
    if not floors_fit(full, floor):
        return floor.copy()
    G = len(full.parent)
    members = full.members()
    children: list[list[int]] = [[] for _ in range(G + 1)]  # G: the virtual root
    for g in range(G):
        children[int(full.parent[g]) if full.parent[g] >= 0 else G].append(g)
    # what each group can hold: its limit, its jobs' ceilings, its children's capacities
    depth_first: list[int] = []
    stack = list(children[G])
    while stack:
        g = stack.pop()
        depth_first.append(g)
        stack += children[g]
    cap = np.empty(G)
    for g in reversed(depth_first):
        direct = ceil[np.asarray(full.leaf) == g].sum()
        cap[g] = min(float(full.limit_w[g]), direct + sum(cap[c] for c in children[g]))
    power = ceil.copy()
    w = np.asarray(weights, float)

    def fill(g: int, budget: float) -> None:
        mask = np.ones(full.n, bool) if g == G else members[g]
        kids = children[g]
        fixed: dict[int, float] = {}
        while True:
            rest = mask.copy()
            for c in fixed:
                rest &= ~members[c]
            b = budget - sum(fixed.values())
            cut = np.array(max(ceil[rest].sum() - b, 0.0))
            power[rest] = ceil[rest] - water_fill(cut, (ceil - floor)[rest], w[rest])
            over = [
                c
                for c in kids
                if c not in fixed and power[members[c]].sum() > cap[c] * (1 + 1e-12) + 1e-9
            ]
            if not over:
                break
            for c in over:
                fixed[c] = cap[c]
        for c in kids:
            fill(c, min(float(power[members[c]].sum()), cap[c]))

    fill(
        G,
        min(
            float(budget_w),
            float(sum(cap[c] for c in children[G])) + ceil[np.asarray(full.leaf) < 0].sum(),
        ),
    )
    return np.clip(power, floor, ceil)


def random_laminar(
    rng: np.random.Generator,
    n: int,
    levels: Sequence[int],
    slack: float = 0.8,
    ceiling_w: np.ndarray | None = None,
    floor_w: np.ndarray | None = None,
) -> Laminar:
    """A random tree of ``levels`` (groups per level, top first) over ``n`` items, each
    group's limit a fraction in ``[floor share, slack * ceiling share]``-ish of its items'
    range (tests and benchmarks)."""
    parent: list[int] = []
    prev: list[int] = []
    for k, count in enumerate(levels):
        ids = list(range(len(parent), len(parent) + count))
        parent += [int(rng.choice(prev)) if prev else -1 for _ in ids]
        prev = ids
    leaf = rng.choice(prev, size=n) if prev else np.full(n, -1)
    fam = Laminar(np.array(parent), np.full(len(parent), np.inf), np.asarray(leaf))
    if ceiling_w is not None:
        lo = fam.loads(floor_w if floor_w is not None else np.zeros(n))
        hi = fam.loads(ceiling_w)
        limit = lo + rng.uniform(0.2, 1.0 + (1 - slack), size=len(parent)) * (hi - lo)
        fam = Laminar(fam.parent, limit, fam.leaf)
    return fam
