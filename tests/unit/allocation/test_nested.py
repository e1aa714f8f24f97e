"""Nested (laminar) limits: the oracle against brute force, and the policies under the limits.

Brute force: every choice of one curve segment per job (all (K-1)^n of them) is a linear
program (throughput linear in power on each segment), solved by scipy's HiGHS; the best of
them is the optimum for curves of any shape."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import linprog

from wattflex.allocation.allocator import allocate
from wattflex.allocation.curves import Curves
from wattflex.allocation.nested import Laminar, nested_oracle, nested_water_fill, random_laminar


def brute_force(P: np.ndarray, T: np.ndarray, budget: float, fam: Laminar) -> float:
    n, K = P.shape
    rows = [np.ones(n)] + [m.astype(float) for m in fam.members()]
    lims = [budget] + list(fam.limit_w)
    best = -np.inf
    for segs in itertools.product(range(K - 1), repeat=n):
        lo = P[np.arange(n), segs]
        hi = P[np.arange(n), np.array(segs) + 1]
        slope = np.divide(
            T[np.arange(n), np.array(segs) + 1] - T[np.arange(n), segs],
            hi - lo,
            out=np.zeros(n),
            where=hi > lo,
        )
        base = T[np.arange(n), segs] - slope * lo
        res = linprog(
            -slope,
            A_ub=np.array(rows),
            b_ub=np.array(lims),
            bounds=list(zip(lo, hi)),
            method="highs",
            options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10},
        )
        if res.status == 0:
            best = max(best, float(base.sum() - res.fun))
    return best


def random_curves(
    rng: np.random.Generator, n: int, K: int, concave: bool
) -> tuple[np.ndarray, np.ndarray]:
    floor = rng.uniform(100, 300, n)
    width = rng.uniform(20, 200, (n, K - 1))
    P = np.concatenate([floor[:, None], floor[:, None] + np.cumsum(width, -1)], -1)
    if concave:
        slopes = -np.sort(-rng.uniform(0.0, 2.0, (n, K - 1)), axis=-1)
    else:
        slopes = rng.uniform(0.0, 2.0, (n, K - 1))
    T = np.concatenate([rng.uniform(0, 50, n)[:, None], np.zeros((n, K - 1))], -1)
    T[:, 1:] = T[:, :1] + np.cumsum(slopes * width, -1)
    return P, T


@pytest.mark.parametrize("concave", [True, False])
def test_the_nested_oracle_equals_brute_force_on_random_laminar_instances(concave):
    rng = np.random.default_rng(7 if concave else 8)
    checked = milp = 0
    for trial in range(30):
        n, K = int(rng.integers(2, 5)), int(rng.integers(2, 5))
        P, T = random_curves(rng, n, K, concave)
        fam = random_laminar(
            rng,
            n,
            [int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 4))],
            ceiling_w=P[:, -1],
            floor_w=P[:, 0],
        )
        budget = P[:, 0].sum() + rng.uniform(0.1, 1.1) * (P[:, -1] - P[:, 0]).sum()
        sol = nested_oracle(P, T, budget, fam, gap_tol=0.0)  # exact: no rounding kept
        assert bool(sol.feasible)
        best = brute_force(P, T, budget, fam)
        value = float(sol.throughput.sum())
        assert abs(value - best) <= 1e-9 * max(abs(best), 1.0), (
            trial,
            value,
            best,
            str(sol.method),
        )
        quick = nested_oracle(P, T, budget, fam)  # the default: within its proven gap
        assert float(quick.throughput.sum()) >= best - float(quick.gap) - 1e-9 * abs(best)
        assert float(quick.gap_rel) <= 1e-6 + 1e-12 and not fam.violations(quick.power_w)
        assert not fam.violations(sol.power_w) and sol.power_w.sum() <= budget * (1 + 1e-12)
        assert np.all(sol.power_w >= P[:, 0] - 1e-9) and np.all(sol.power_w <= P[:, -1] + 1e-9)
        checked += 1
        milp += str(sol.method) == "milp"
    assert checked == 30
    if concave:
        assert milp == 0  # the greedy alone is exact on concave curves
    else:
        assert milp > 0  # some instances needed the MILP (the certificate failed)


def test_the_site_total_alone_would_overload_a_rack():
    """Two racks, a budget the site could meet by any split: without the rack rows the oracle
    gives the steep jobs of rack 0 more than the rack holds."""
    P = np.array([[100.0, 500.0]] * 4)
    T = np.array([[0.0, 800.0], [0.0, 800.0], [0.0, 100.0], [0.0, 100.0]])
    fam = Laminar(
        np.array([-1, -1]), np.array([500.0, 900.0]), np.array([0, 0, 1, 1]), ("rack:a", "rack:b")
    )
    sol = nested_oracle(P, T, 1200.0, fam)
    assert fam.loads(sol.power_w)[0] == pytest.approx(500.0) and sol.power_w.sum() == pytest.approx(
        1200.0
    )
    flat = allocate(Curves(P[None], T[None]), 1200.0, "oracle")
    assert fam.loads(flat.power_w[0])[0] > 500.0  # what the site-only oracle did
    nested = allocate(Curves(P[None], T[None]), 1200.0, "oracle", nested=fam)
    assert not fam.violations(nested.power_w[0]) and nested.total_throughput[0] == pytest.approx(
        sol.throughput.sum()
    )


@pytest.mark.parametrize("policy", ["equal-weight", "pfi-aware", "curve-aware", "oracle"])
def test_every_policy_holds_every_level_and_meets_the_budget(policy):
    rng = np.random.default_rng(3)
    n = 30
    P, T = random_curves(rng, n, 4, concave=True)
    fam = random_laminar(rng, n, [2, 3, 5], ceiling_w=P[:, -1], floor_w=P[:, 0])
    # the fullest rack (a group of the last level) held to a tenth of its range: tighter than its share
    rack = int(np.bincount(fam.leaf, minlength=len(fam.parent)).argmax())
    lo, hi = fam.loads(P[:, 0])[rack], fam.loads(P[:, -1])[rack]
    fam = Laminar(
        fam.parent,
        np.where(np.arange(len(fam.parent)) == rack, lo + 0.1 * (hi - lo), fam.limit_w),
        fam.leaf,
    )
    cap = nested_water_fill(
        np.inf, P[:, 0], P[:, -1], np.ones(n), fam
    ).sum()  # the most the limits allow
    budget = P[:, 0].sum() + 0.8 * (cap - P[:, 0].sum())
    a = allocate(
        Curves(P[None], T[None]), budget, policy, {"pfi": rng.uniform(1, 2, (1, n))}, nested=fam
    )
    assert bool(a.feasible[0])
    assert not fam.violations(a.power_w[0])
    assert a.power_w[0].sum() == pytest.approx(budget, rel=1e-9)
    # and the flat allocation of the same budget overloads some group (the test could fail)
    flat = allocate(Curves(P[None], T[None]), budget, policy, {"pfi": rng.uniform(1, 2, (1, n))})
    assert fam.violations(flat.power_w[0])


def test_water_fill_keeps_the_policy_split_where_no_limit_binds():
    floor, ceil = np.full(4, 100.0), np.full(4, 500.0)
    fam = Laminar(np.array([-1, -1]), np.array([np.inf, np.inf]), np.array([0, 0, 1, 1]))
    p = nested_water_fill(1200.0, floor, ceil, np.array([1.0, 1.0, 3.0, 3.0]), fam)
    assert p == pytest.approx([400.0, 400.0, 200.0, 200.0])  # cut 800 in proportion 1:1:3:3
    tight = Laminar(fam.parent, np.array([np.inf, 500.0]), fam.leaf)
    p = nested_water_fill(1200.0, floor, ceil, np.array([1.0, 1.0, 3.0, 3.0]), tight)
    assert p[2:].sum() == pytest.approx(400.0) and p.sum() == pytest.approx(1200.0)
    assert p[:2] == pytest.approx([400.0, 400.0])


def test_infeasible_floors_are_reported():
    P = np.array([[300.0, 500.0]] * 2)
    fam = Laminar(np.array([-1]), np.array([500.0]), np.array([0, 0]))
    assert not bool(nested_oracle(P, P, 2000.0, fam).feasible)
    a = allocate(Curves(P[None], P[None]), 2000.0, "equal-weight", nested=fam)
    assert not bool(a.feasible[0])


def test_a_family_whose_parents_loop_is_refused():
    with pytest.raises(ValueError, match="loop"):
        Laminar(np.array([1, 0]), np.array([1.0, 1.0]), np.array([0]))
