"""The oracle's certified fast path: the rounded hull solution is feasible on the
true curves, its certificate is a valid bound, the MILP runs exactly where the certificate
fails, and nothing changes where the greedy alone was already exact."""

import numpy as np
import pytest
from scipy.optimize import linprog

from wattflex.allocation import oracle as orc
from wattflex.allocation.curves import Curves, sla_floor


def random_curves(rng, shape, K=6, concave=False):
    """Curves (shape..., K): floors 100-800 W, segments 50-400 W, slopes -0.5-5 tokens/s per W
    (sorted decreasing when ``concave``)."""
    widths = rng.uniform(50, 400, (*shape, K - 1))
    floor = rng.uniform(100, 800, shape)
    P = np.concatenate([floor[..., None], floor[..., None] + np.cumsum(widths, -1)], -1)
    slopes = rng.uniform(-0.5, 5.0, (*shape, K - 1))
    if concave:
        slopes = -np.sort(-np.abs(slopes), -1)
    T = np.concatenate([rng.uniform(0, 300, shape)[..., None], np.zeros((*shape, K - 1))], -1)
    T[..., 1:] = T[..., :1] + np.cumsum(slopes * widths, -1)
    return P, T


def uncertified_instance(rng, n, K=6):
    """A workload of n distinct non-concave jobs whose marginal job sits under a hull bridge."""
    for _ in range(200):
        P, T = random_curves(rng, (n,), K)
        budget = rng.uniform(0.55, 0.9) * P[:, -1].sum()
        if not orc.hull_greedy(P[None], T[None], np.array([budget])).certified[0]:
            return P, T, budget
    raise AssertionError("no uncertified instance drawn")


def assert_feasible(P, T, budget, sol_power, sol_throughput):
    assert sol_power.sum() <= budget * (1 + 1e-12)
    assert (sol_power >= P[:, 0]).all() and (sol_power <= P[:, -1]).all()
    true = np.array([np.interp(p, Pj, Tj) for p, Pj, Tj in zip(sol_power, P, T)])
    np.testing.assert_allclose(sol_throughput, true, rtol=1e-12, atol=1e-9)


def hull_lp_bound(P, T, budget):
    """The hull relaxation's optimum by an LP (HiGHS) over the hull segments: an
    independent check of the greedy's bound."""
    hull = orc.concave_hull(P, T)
    width = np.diff(P, axis=-1).ravel()
    gain = np.diff(hull, axis=-1).ravel()
    res = linprog(
        -gain, A_ub=width[None], b_ub=[budget - P[:, 0].sum()], bounds=(0, 1), method="highs"
    )
    assert res.status == 0
    return hull[:, 0].sum() - res.fun


@pytest.mark.parametrize("seed", range(8))
def test_rounded_solution_is_feasible_and_its_certificate_holds_against_the_milp(seed):
    # gap_tol=1 keeps the rounding whatever its gap, so its certificate is always checked
    rng = np.random.default_rng(seed)
    P, T, budget = uncertified_instance(rng, int(rng.choice([5, 40, 150])))
    sol = orc.oracle(P, T, budget, gap_tol=1.0)
    exact = orc.milp_oracle(P, T, budget)
    value, opt = sol.throughput.sum(), exact.throughput.sum()
    assert sol.method == "hull-certified" and sol.certified
    assert_feasible(P, T, budget, sol.power_w, sol.throughput)
    assert sol.bound == pytest.approx(hull_lp_bound(P, T, budget), rel=1e-9)
    assert opt <= sol.bound + 1e-9 * abs(sol.bound)  # the certificate's bound is valid ...
    assert value >= opt - sol.gap - 1e-9 * abs(opt)  # ... so value is within gap of the optimum
    assert value <= opt + 1e-9 * abs(opt)
    assert sol.gap == pytest.approx(sol.bound - value, abs=1e-9)
    assert sol.gap_rel == pytest.approx(sol.gap / abs(sol.bound))


@pytest.mark.parametrize("seed", range(3))
def test_many_distinct_nonconcave_jobs_certify_without_the_milp(seed):
    rng = np.random.default_rng(100 + seed)
    P, T, budget = uncertified_instance(rng, 3000)
    sol = orc.oracle(P, T, budget)
    assert sol.method == "hull-certified" and sol.certified
    assert 0.0 <= sol.gap_rel <= orc.GAP_TOL
    assert_feasible(P, T, budget, sol.power_w, sol.throughput)
    assert sol.bound == pytest.approx(hull_lp_bound(P, T, budget), rel=1e-9)
    # the rounding moved only a few jobs off the greedy's allocation
    greedy = orc.hull_greedy(P, T, budget)
    assert (np.abs(sol.power_w - greedy.power_w) > 1e-6).sum() <= 10


def test_a_failed_certificate_runs_the_milp():
    # job 0 is convex: its hull bridge from 100 W to 300 W overstates T at 200 W; the hull
    # bound (250) is 25 % above the optimum (200), far beyond any tolerance
    P = np.array([[100.0, 200.0, 300.0], [100.0, 200.0, 300.0]])
    T = np.array([[0.0, 10.0, 200.0], [0.0, 150.0, 200.0]])
    sol = orc.oracle(P, T, 400.0)
    assert sol.method == "milp" and not sol.certified
    assert sol.throughput.sum() == pytest.approx(200.0)
    assert sol.gap == pytest.approx(0.0, abs=1e-6)
    # with a loose tolerance the rounding answers, certified at its true gap (0.2)
    loose = orc.oracle(P, T, 400.0, gap_tol=0.25)
    assert loose.method == "hull-certified" and loose.throughput.sum() == pytest.approx(200.0)
    assert loose.bound == pytest.approx(250.0) and loose.gap_rel == pytest.approx(0.2)


@pytest.mark.parametrize("n", [1, 7, 300, 3000])
def test_concave_curves_are_exact_by_the_greedy_alone(n):
    rng = np.random.default_rng(n)
    P, T = random_curves(rng, (n,), concave=True)
    budget = 0.7 * P[:, -1].sum()
    sol = orc.oracle(P, T, budget)
    assert sol.method == "hull-certified" and sol.gap_rel <= 1e-12
    assert sol.throughput.sum() == pytest.approx(hull_lp_bound(P, T, budget), rel=1e-12)
    before = orc.oracle(P, T, budget, method="milp")
    np.testing.assert_array_equal(sol.power_w, before.power_w)


def test_numbers_stay_the_same_where_the_old_oracle_was_exact():
    """On mixed batches: identical allocations wherever the greedy certified; where the old
    path ran its MILP and the new one certifies instead, within the certified gap."""
    rng = np.random.default_rng(7)
    for n in (20, 300):
        P, T = random_curves(rng, (30, n))
        conc = random_curves(rng, (30, n), concave=True)
        mix = rng.random((30, n, 1)) < 0.8  # most jobs concave, as measured curves are
        P, T = np.where(mix, conc[0], P), np.where(mix, conc[1], T)
        budget = rng.uniform(0.5, 0.95, 30) * P[..., -1].sum(-1)
        old, new = orc.oracle(P, T, budget, method="milp"), orc.oracle(P, T, budget)
        assert (old.method == "milp").any()
        same = old.method == "hull-certified"
        np.testing.assert_array_equal(new.power_w[same], old.power_w[same])
        assert (new.method[same] == "hull-certified").all()
        moved = (old.method == "milp") & (new.method == "hull-certified")
        assert moved.any() or n < 100  # with hundreds of jobs the rounding usually certifies
        opt, value = old.throughput.sum(-1), new.throughput.sum(-1)
        assert (value >= opt - new.gap - 1e-9 * np.abs(opt)).all()
        assert (new.gap_rel[moved] <= orc.GAP_TOL).all()
        assert (value <= opt + 1e-7 * np.abs(opt)).all()  # the old MILP was exact
        for w in range(30):
            assert_feasible(P[w], T[w], budget[w], new.power_w[w], new.throughput[w])


def test_copies_of_a_few_nonconcave_groups_round_within_the_certificate():
    # simulated workloads repeat a handful of group curves: equal slopes tie in the greedy
    rng = np.random.default_rng(11)
    groups = random_curves(rng, (6,))
    idx = rng.integers(0, 6, 2000)
    P, T = groups[0][idx], groups[1][idx]
    for frac in (0.5, 0.7, 0.9):
        budget = frac * P[:, -1].sum()
        sol = orc.oracle(P, T, budget, gap_tol=1.0)
        assert_feasible(P, T, budget, sol.power_w, sol.throughput)
        exact = orc.milp_oracle(P, T, budget)  # merges the copies: fast
        assert exact.throughput.sum() <= sol.bound * (1 + 1e-9)
        assert sol.throughput.sum() >= exact.throughput.sum() - sol.gap - 1e-9 * sol.bound


def test_sla_raised_floors_and_collapsed_points_are_respected():
    # SLA tiers reach the oracle as restricted curves (floors raised, points collapsed)
    rng = np.random.default_rng(3)
    P, T = random_curves(rng, (2000,))
    T = np.maximum.accumulate(T, -1)  # non-decreasing, as monotone_fit leaves measured curves
    curves = Curves(P, T)
    tiers = np.where(rng.random(2000) < 0.3, rng.choice([0.05, 0.1, 0.2], 2000), np.nan)
    floor = sla_floor(curves, tiers)
    ceiling = np.maximum(P[:, -1] - 20.0, floor)  # and a lowered ceiling (a max cap)
    work = curves.restrict(floor, ceiling)
    budget = 0.5 * (work.floor_w.sum() + work.ceiling_w.sum())
    sol = orc.oracle(work.power_w, work.throughput, budget, gap_tol=1.0)
    assert (sol.power_w >= floor).all() and (sol.power_w <= ceiling).all()
    assert sol.power_w.sum() <= budget * (1 + 1e-12)
    assert sol.method == "hull-certified"
    hit = np.isfinite(tiers)
    assert (
        curves.throughput_at(sol.power_w)[hit] >= (1 - tiers[hit]) * T[hit, -1] * (1 - 1e-9)
    ).all()


def test_infeasible_floors_get_the_floors_and_an_exact_certificate():
    rng = np.random.default_rng(2)
    P, T = random_curves(rng, (50,))
    sol = orc.oracle(P, T, 0.9 * P[:, 0].sum())
    assert not sol.feasible and sol.method == "hull-certified" and sol.gap == 0.0
    np.testing.assert_array_equal(sol.power_w, P[:, 0])


def test_one_workload_and_a_batch_report_the_same_path_and_gap():
    rng = np.random.default_rng(4)
    P, T, budget = uncertified_instance(rng, 1500)
    one = orc.oracle(P, T, budget)
    batch = orc.oracle(P[None], T[None], np.array([budget]))
    assert one.method == batch.method[0] and one.method.shape == () and batch.method.shape == (1,)
    assert one.gap_rel == batch.gap_rel[0]
    np.testing.assert_array_equal(one.power_w, batch.power_w[0])


def test_unknown_method_is_rejected():
    P = np.array([[100.0, 200.0]])
    with pytest.raises(ValueError, match="unknown oracle method"):
        orc.oracle(P, P, 150.0, method="hull")


def reference_hull(P, T):
    """The envelope at each vertex as the highest chord over it, one vertex at a time."""
    hull = T.copy()
    for idx in np.ndindex(P.shape[:-1]):
        p, t = P[idx], T[idx]
        for k in range(len(p)):
            for i in range(k):
                for j in range(k + 1, len(p)):
                    if p[j] > p[i]:
                        hull[idx + (k,)] = max(
                            hull[idx + (k,)], t[i] + (t[j] - t[i]) / (p[j] - p[i]) * (p[k] - p[i])
                        )
    return hull


@pytest.mark.parametrize("K", [1, 2, 3, 6, 9])
def test_vertex_major_hull_equals_the_chord_scan_bit_for_bit(K):
    rng = np.random.default_rng(K)
    P, T = (
        random_curves(rng, (4, 7), K)
        if K > 1
        else (rng.uniform(100, 800, (4, 7, 1)), rng.uniform(0, 9, (4, 7, 1)))
    )
    if K > 3:
        P[..., -1] = P[..., -2]  # padding: a zero-width last segment
    np.testing.assert_array_equal(orc.concave_hull(P, T), reference_hull(P, T))
    np.testing.assert_array_equal(orc.concave_hull(P[0, 0], T[0, 0]), reference_hull(P, T)[0, 0])


def test_dive_reusing_its_parents_hulls_equals_recomputing_them():
    # the dive carries each child's restricted curves and hull over from its parent; the
    # MILP-only path it feeds must match plan_greedy recomputed from scratch at every child
    rng = np.random.default_rng(11)
    P, T, budget = uncertified_instance(rng, 30)
    start = orc.hull_greedy(P, T, budget)
    calls = []
    real = orc.plan_greedy

    def checked(Pc, Tc, hull=None):
        if hull is not None:
            np.testing.assert_array_equal(hull, orc.concave_hull(Pc, Tc))
            calls.append(1)
        return real(Pc, Tc, hull)

    orc.plan_greedy = checked
    try:
        p, v = orc.dive(P, T, budget, start)
    finally:
        orc.plan_greedy = real
    assert calls and p.sum() <= budget * (1 + 1e-12)
    assert v >= float(start.throughput.sum())
