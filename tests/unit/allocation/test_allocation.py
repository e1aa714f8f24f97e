"""Allocation under a power cut: the exact oracle, the paper's policies, SLA tiers, the
simulation. Curves are built in code (no workflow outputs needed)."""

import itertools

import numpy as np
import pandas as pd
import pytest

from wattflex.allocation import oracle as orc
from wattflex.allocation.allocator import allocate, predicted_curves, water_fill
from wattflex.allocation.curves import (
    Curves,
    curves_from_points,
    is_concave,
    power_to_cap,
    sla_floor,
)
from wattflex.allocation.settings import MERGE_ONLY_KEYS, cut_label
from wattflex.allocation.simulate import (
    HEADLINE_COLUMNS,
    PART_TABLES,
    SimulationConfig,
    combine,
    fit_pfi_ols,
    group_table,
    sample_workloads,
    simulate,
    simulate_cuts,
    stratified_halves,
)
from wattflex.pfi import pfi_ratio
from wattflex.plots.allocation import fig8_figure, out_of_sample_figure
from wattflex.policies import POLICIES, WEIGHTED_POLICIES


def random_curves(rng, shape, K, concave):
    """Curves (shape..., K) with increasing power; concave ones have decreasing slopes."""
    widths = rng.uniform(50, 400, (*shape, K - 1))
    floor = rng.uniform(100, 800, shape)
    P = np.concatenate([floor[..., None], floor[..., None] + np.cumsum(widths, -1)], -1)
    if concave:
        slopes = np.sort(rng.uniform(0.05, 5.0, (*shape, K - 1)), -1)[..., ::-1]
    else:
        slopes = rng.uniform(-0.5, 5.0, (*shape, K - 1))
    T = np.concatenate([rng.uniform(0, 300, shape)[..., None], np.zeros((*shape, K - 1))], -1)
    T[..., 1:] = T[..., :1] + np.cumsum(slopes * widths, -1)
    return P, T


def brute_force(P, T, budget):
    """Exact optimum by enumeration: an optimum has every job but one on a vertex, the
    free one taking what the budget leaves (capped at its ceiling)."""
    n = len(P)
    best = -np.inf
    for combo in itertools.product(*[range(P.shape[1])] * n):
        p = P[np.arange(n), combo]
        t = T[np.arange(n), combo]
        if p.sum() <= budget + 1e-9:
            best = max(best, t.sum())
        for j in range(n):
            rest = budget - (p.sum() - p[j])
            pj = min(P[j, -1], rest)
            if pj >= P[j, 0] - 1e-9:
                best = max(best, t.sum() - t[j] + np.interp(pj, P[j], T[j]))
    return best


def grid_search(P, T, budget, m=41):
    """A feasible lower bound from a grid over each job's power range."""
    grids = [np.linspace(P[i, 0], P[i, -1], m) for i in range(len(P))]
    best = -np.inf
    for combo in itertools.product(*grids):
        if sum(combo) <= budget:
            best = max(best, sum(np.interp(c, P[i], T[i]) for i, c in enumerate(combo)))
    return best


# --------------------------------------------------------------------------- geometry


def test_interp_matches_numpy_rowwise_with_padding():
    rng = np.random.default_rng(0)
    P, T = random_curves(rng, (30,), 5, concave=False)
    P[:10, 3:] = P[:10, 3:4]  # padded rows repeat their last real point
    T[:10, 3:] = T[:10, 3:4]
    x = rng.uniform(P[:, 0] - 50, P[:, -1] + 50)
    expected = [np.interp(x[i], P[i], T[i]) for i in range(30)]
    np.testing.assert_allclose(orc.interp(P, T, x), expected, rtol=1e-12)
    many = rng.uniform(P[:, :1], P[:, -1:], (30, 7))
    np.testing.assert_allclose(
        orc.interp(P, T, many), [np.interp(many[i], P[i], T[i]) for i in range(30)]
    )


def test_concave_hull_is_the_least_concave_majorant():
    rng = np.random.default_rng(1)
    P, T = random_curves(rng, (200,), 6, concave=False)
    H = orc.concave_hull(P, T)
    assert (H >= T - 1e-9).all()
    slopes = np.diff(H, axis=-1) / np.diff(P, axis=-1)
    assert (np.diff(slopes, axis=-1) <= 1e-9).all()
    assert np.allclose(H[:, [0, -1]], T[:, [0, -1]])  # endpoints are always on the hull
    Pc, Tc = random_curves(rng, (50,), 6, concave=True)
    np.testing.assert_allclose(orc.concave_hull(Pc, Tc), Tc)
    assert is_concave(Curves(Pc, Tc)).all() and not is_concave(Curves(P, T)).all()


# --------------------------------------------------------------------------- the oracle


@pytest.mark.parametrize("concave", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_oracle_equals_brute_force(seed, concave):
    rng = np.random.default_rng(seed)
    n, K = int(rng.integers(1, 5)), int(rng.integers(2, 5))
    P, T = random_curves(rng, (n,), K, concave)
    budget = rng.uniform(P[:, 0].sum(), P[:, -1].sum() * 1.05)
    exact = brute_force(P, T, budget)
    sol = orc.oracle(P[None], T[None], np.array([budget]))
    milp = orc.milp_oracle(P, T, budget)
    for s in (sol.power_w[0], milp.power_w):
        assert s.sum() <= budget * (1 + 1e-9)
        assert (s >= P[:, 0] - 1e-9).all() and (s <= P[:, -1] + 1e-9).all()
    assert sol.throughput[0].sum() == pytest.approx(exact, rel=1e-9, abs=1e-6)
    assert milp.throughput.sum() == pytest.approx(exact, rel=1e-7, abs=1e-6)
    if concave:
        assert sol.certified[0], "the hull greedy alone must be exact on concave curves"
    if n <= 2:
        assert grid_search(P, T, budget) <= exact + 1e-6


def test_milp_merges_identical_jobs_and_stays_exact():
    rng = np.random.default_rng(5)
    P1, T1 = random_curves(rng, (2,), 4, concave=False)
    idx = np.array([0, 1, 0, 0, 1])  # copies of the same curve, as in simulated workloads
    P, T = P1[idx], T1[idx]
    for budget in np.linspace(P[:, 0].sum(), P[:, -1].sum(), 7):
        milp = orc.milp_oracle(P, T, budget)
        assert milp.throughput.sum() == pytest.approx(brute_force(P, T, budget), rel=1e-7, abs=1e-6)
        assert milp.power_w.sum() <= budget * (1 + 1e-9)


def test_fallback_with_domain_fixing_matches_the_plain_milp():
    # larger non-concave workloads: the greedy rarely certifies, so oracle() runs its
    # dive + Lagrangian domain fixing + reduced MILP; the unreduced MILP is the reference
    rng = np.random.default_rng(21)
    P, T = random_curves(rng, (12, 30), 6, concave=False)
    budget = rng.uniform(0.55, 0.9, 12) * P[..., -1].sum(-1)
    sol = orc.oracle(P, T, budget)
    assert (~sol.certified).sum() >= 6
    for w in range(12):
        ref = orc.milp_oracle(P[w], T[w], budget[w])
        assert sol.throughput[w].sum() == pytest.approx(ref.throughput.sum(), rel=1e-9, abs=1e-6)
        assert sol.power_w[w].sum() <= budget[w] * (1 + 1e-9)
        lo, hi = orc.lagrangian_domains(
            P[w], T[w], budget[w], ref.throughput.sum() - 1e-6, orc.plan_greedy(P[w], T[w])
        )
        assert (ref.power_w >= lo - 1e-6).all() and (ref.power_w <= hi + 1e-6).all()  # optimum kept


def test_greedy_certificate_catches_a_bridge():
    # one convex job: the hull bridge from 100 W to 300 W overstates T at 200 W
    P = np.array([[100.0, 200.0, 300.0], [100.0, 200.0, 300.0]])
    T = np.array([[0.0, 10.0, 200.0], [0.0, 150.0, 200.0]])
    g = orc.hull_greedy(P[None], T[None], np.array([400.0]))
    assert not g.certified[0] and g.bound[0] > g.throughput[0].sum()
    best = orc.oracle(P[None], T[None], np.array([400.0]))
    assert (
        best.throughput[0].sum() == pytest.approx(brute_force(P, T, 400.0)) == pytest.approx(200.0)
    )


# --------------------------------------------------------------------------- policies


def workload_batch(seed, W=40, n=8, K=5, concave_share=0.7):
    rng = np.random.default_rng(seed)
    P, T = random_curves(rng, (W, n), K, concave=True)
    Pn, Tn = random_curves(rng, (W, n), K, concave=False)
    swap = rng.random((W, n)) > concave_share
    P[swap], T[swap] = Pn[swap], Tn[swap]
    feats = {
        "pfi": rng.uniform(0.9, 2.5, (W, n)),
        "pfi_measured": rng.uniform(1.0, 2.5, (W, n)),
        "moe_ft": rng.random((W, n)) < 0.3,
        "dram_copy_product": rng.uniform(0.0, 5.0, (W, n)),
    }
    return Curves(P, T), feats, rng


@pytest.mark.parametrize("cut", [0.05, 0.2, 0.35])
def test_every_policy_meets_the_budget_and_never_beats_the_oracle(cut):
    curves, feats, _ = workload_batch(7)
    budget = (1 - cut) * curves.ceiling_w.sum(-1)
    best = allocate(curves, budget, "oracle", feats)
    floors_fit = curves.floor_w.sum(-1) <= budget
    assert (best.feasible == floors_fit).all() and floors_fit.any()
    assert (best.power_w.sum(-1)[floors_fit] <= budget[floors_fit] * (1 + 1e-9)).all()
    for policy in POLICIES:
        a = allocate(curves, budget, policy, feats)
        ok = a.feasible
        assert (a.power_w >= curves.floor_w - 1e-9).all() and (
            a.power_w <= curves.ceiling_w + 1e-9
        ).all()
        assert (a.total_throughput[ok] <= best.total_throughput[ok] * (1 + 1e-9) + 1e-6).all(), (
            policy
        )
        if policy in WEIGHTED_POLICIES:  # water-filling spends exactly the budget
            np.testing.assert_allclose(a.power_w.sum(-1)[ok], budget[ok], rtol=1e-9)


def test_water_filling_redistributes_at_the_floor():
    # job 0 can give only 10 W; the rest of its equal share moves to the others
    c = water_fill(np.array(60.0), np.array([10.0, 100.0, 100.0]), np.array([1.0, 1.0, 1.0]))
    np.testing.assert_allclose(c, [10.0, 25.0, 25.0])
    # proportional while nobody saturates
    np.testing.assert_allclose(
        water_fill(np.array(30.0), np.array([50.0, 50.0]), np.array([1.0, 2.0])), [10, 20]
    )
    # zero-weight jobs are cut only once the weighted ones reach their floors
    c = water_fill(np.array(70.0), np.array([30.0, 20.0, 40.0]), np.array([1.0, 1.0, 0.0]))
    np.testing.assert_allclose(c, [30.0, 20.0, 20.0])
    # more than the total headroom: everyone at the floor (the caller flags infeasibility)
    np.testing.assert_allclose(
        water_fill(np.array(500.0), np.array([30.0, 20.0]), np.array([1.0, 1.0])), [30, 20]
    )


def test_equal_weight_cut_is_proportional_to_uncapped_power_until_floors():
    P = np.array([[100.0, 1000.0], [500.0, 1000.0], [100.0, 2000.0]])
    T = P * 2.0
    a = allocate(Curves(P, T), 0.7 * 4000.0, "equal-weight")  # cut 1200 W
    # shares 300/300/600 of the 1200 W cut; nobody reaches a floor
    np.testing.assert_allclose(a.power_w, [700.0, 700.0, 1400.0])
    a = allocate(Curves(P, T), 0.4 * 4000.0, "equal-weight")  # cut 2400 W
    # shares 600/600/1200 would push job 1 (500 W headroom) below its floor: it gives
    # 500 W and the remaining 1900 W splits 1:2 over the other two
    np.testing.assert_allclose(a.power_w, [1000 - 1900 / 3, 500.0, 2000 - 2 * 1900 / 3])


def test_infeasible_budget_is_flagged_not_overspent():
    curves, feats, _ = workload_batch(3, W=5)
    budget = curves.floor_w.sum(-1) * 0.95
    for policy in POLICIES:
        a = allocate(curves, budget, policy, feats)
        assert not a.feasible.any()
        np.testing.assert_allclose(a.power_w, a.floor_w)


def test_pfi_aware_cuts_flexible_jobs_more():
    P = np.tile([[200.0, 600.0, 1000.0]], (2, 1))
    T = np.array([[100.0, 400.0, 500.0], [100.0, 400.0, 500.0]])
    a = allocate(Curves(P, T), 1500.0, "pfi-aware", {"pfi": np.array([1.0, 3.0])})
    # same P/T, PFI 3 vs 1: cut shares 1:3 of the 500 W cut
    np.testing.assert_allclose(1000.0 - a.power_w, [125.0, 375.0])
    m = allocate(Curves(P, T), 1500.0, "moe-ft-weighted", {"moe_ft": np.array([False, True])})
    np.testing.assert_allclose(1000.0 - m.power_w, [500 / 3, 1000 / 3])


# --------------------------------------------------------------------------- SLA tiers


def test_sla_floor_on_a_hand_curve():
    c = Curves(np.array([[200.0, 400.0, 600.0]]), np.array([[40.0, 80.0, 100.0]]))
    # 10% slowdown -> T >= 90 -> halfway up the top segment
    np.testing.assert_allclose(sla_floor(c, np.array([0.10])), [500.0])
    np.testing.assert_allclose(sla_floor(c, np.array([0.70])), [200.0])  # never binding
    np.testing.assert_allclose(sla_floor(c, np.array([np.nan])), [200.0])  # no tier
    np.testing.assert_allclose(sla_floor(c, np.array([0.0])), [600.0])


def test_sla_tiers_are_honoured_by_every_policy_that_knows_the_curves():
    curves, feats, rng = workload_batch(11, W=60, n=10)
    tiers = rng.choice([0.0, 0.1, 0.25, 0.5, np.nan], size=(60, 10))
    target = np.where(np.isnan(tiers), -np.inf, (1 - tiers) * curves.uncapped_throughput)
    seen = []
    for cut in (0.05, 0.15, 0.3):
        budget = (1 - cut) * curves.ceiling_w.sum(-1)
        best = allocate(curves, budget, "oracle", feats, max_slowdown=tiers)
        seen.append(best.feasible)
        for policy in POLICIES:
            a = allocate(curves, budget, policy, feats, max_slowdown=tiers)
            if policy == "curve-aware":
                continue  # floors from its predicted curve: may miss a tier (reported in sla.csv)
            ok = a.feasible
            assert (a.feasible == best.feasible).all()
            assert (a.throughput[ok] >= target[ok] - 1e-6 * np.abs(target[ok])).all(), policy
            assert (a.total_throughput[ok] <= best.total_throughput[ok] * (1 + 1e-9) + 1e-6).all()
    assert np.concatenate(seen).any() and not np.concatenate(seen).all()  # both cases exercised


# --------------------------------------------------------------------------- curves


def test_curves_from_points_sorts_merges_and_pads():
    jobs, c = curves_from_points(
        ["b", "a", "a", "a", "b", "a"],
        [300, 500, 100, 300, 100, 300],
        [3, 5, 1, 2, 1, 4],
        cap_w=[400, 700, 200, 400, 200, 400],
    )
    assert jobs == ["b", "a"]
    np.testing.assert_allclose(c.power_w, [[100, 300, 300], [100, 300, 500]])
    np.testing.assert_allclose(c.throughput, [[1, 3, 3], [1, 3, 5]])  # repeats at 300 W averaged
    np.testing.assert_allclose(c.cap_w, [[200, 400, 400], [200, 400, 700]])
    with pytest.raises(ValueError, match="non-finite"):
        curves_from_points(["a"], [np.nan], [1.0])


def test_power_to_cap_inverts_the_measured_relation():
    c = Curves(
        np.array([[1600.0, 3000.0, 5500.0]]),
        np.array([[1.0, 2.0, 3.0]]),
        cap_w=np.array([[200.0, 400.0, 700.0]]),
    )
    np.testing.assert_allclose(power_to_cap(c, np.array([2300.0])), [300.0])
    np.testing.assert_allclose(power_to_cap(c, np.array([5500.0])), [700.0])
    bare = Curves(c.power_w, c.throughput)
    np.testing.assert_allclose(power_to_cap(bare, np.array([2400.0]), gpus=np.array([8])), [300.0])
    assert power_to_cap(bare, np.array([2400.0])) is None


@pytest.mark.parametrize("pfi", [0.8, 1.0, 1.3, 2.1, 3.5])
def test_predicted_curve_reproduces_the_predicted_pfi(pfi):
    c = Curves(np.array([[1500.0, 5500.0]]), np.array([[30000.0, 100000.0]]))
    pred = predicted_curves(c, np.array([pfi]), nodes=6)
    assert pred.floor_w[0] == 1500.0 and pred.ceiling_w[0] == 5500.0
    assert pred.uncapped_throughput[0] == pytest.approx(100000.0)
    assert pfi_ratio(pred.power_w[0], pred.throughput[0]) == pytest.approx(pfi, rel=1e-6)
    assert is_concave(pred)[0] == (pfi >= 1.0)


# --------------------------------------------------------------------------- simulation


def synthetic_campaign(seed=0, n_groups=12):
    """runs / pfi / predictions tables shaped like the workflow's, from power-law curves."""
    rng = np.random.default_rng(seed)
    rows, groups = [], []
    clusters = ["dense", "moe-pt", "moe-ft"]
    for g in range(n_groups):
        cluster = clusters[g % 3]
        task = "lora" if cluster == "moe-ft" or (cluster == "dense" and g % 2) else "pt"
        gpus = [8, 16][g % 2]
        pfi = {"dense": 1.3, "moe-pt": 1.5, "moe-ft": 2.1}[cluster] + rng.normal(0, 0.1)
        t_max = rng.uniform(5e3, 1e5)
        p_max = 690.0 * gpus
        for cap in (200, 300, 400, 500, 600, 700):
            p = min(cap * gpus * 0.98, p_max)
            t = t_max * (p / p_max) ** (1 / pfi) * (1 + rng.normal(0, 0.002))
            for rep in range(2 if cap == 700 else 1):
                rows.append(
                    {
                        "group": f"g{g}",
                        "cap_w": cap,
                        "repeat": rep,
                        "set": "headline",
                        "task": task,
                        "cluster": cluster,
                        "gpus": gpus,
                        "backend": "emulated",
                        "power_w": p,
                        "tokens_per_s": t,
                    }
                )
        groups.append(
            {"group": f"g{g}", "pfi_ratio": pfi, "dram_copy_product": pfi * 2 + rng.normal(0, 0.3)}
        )
    runs = pd.DataFrame(rows)
    pfi_table = pd.DataFrame(groups)[["group", "pfi_ratio"]]
    preds = pd.DataFrame(groups).rename(columns={"pfi_ratio": "pfi"})
    preds["pfi_pred"] = preds["pfi"] + rng.normal(0, 0.15, len(preds))
    return runs, pfi_table, preds


def small_config(**kw):
    return SimulationConfig.from_dict(
        {
            "n_workloads": 24,
            "jobs_per_workload": 12,
            "cuts": [0.0, 0.2, 0.4],
            "out_of_sample": {"splits": 2, "workloads": 8},
            "headline": {"cut": 0.2},
            **kw,
        }
    )


def test_simulation_outputs_and_invariants():
    runs, pfi_table, preds = synthetic_campaign()
    cfg = small_config()
    table = group_table(runs, pfi_table, preds, cfg)
    assert table.backend == "emulated" and len(table.groups) == 12
    out = simulate(table, cfg)
    s = out["summary"]
    assert len(s) == len(cfg.mixes) * len(cfg.cuts) * len(cfg.policies)
    deep = s[s["cut"] > 0]
    assert np.allclose(deep.loc[deep["policy"] == "oracle", "gap_closed"], 1.0)
    assert np.allclose(deep.loc[deep["policy"] == "equal-weight", "gap_closed"], 0.0)
    assert (deep["diff_to_oracle_total_mean"] <= 1e-6).all()
    assert (s["feasible_fraction"] == 1.0).all()
    at0 = s[s["cut"] == 0]  # no cut: every policy keeps the uncapped throughput
    assert np.allclose(at0["retained_fraction_mean"], 1.0)
    h = out["headline"].set_index("policy")
    assert h.loc["pfi-aware", "published_tokens_per_s_per_job_recovered"] == 1500.0
    assert h.loc["pfi-aware", "published_gap_closed"] == 0.63
    assert h.loc["pfi-aware", "tokens_per_s_per_job_recovered"] > 0  # flexible jobs exist
    sla = out["sla"]
    honour = sla[sla["policy"] != "curve-aware"]
    assert (honour["sla_violating_job_fraction"].fillna(0) == 0).all()
    oos = out["out_of_sample"]
    assert set(oos["variant"]) == {"in-sample", "out-of-sample", "no PFI"}
    assert (oos["n_splits"] == 2).all()
    assert out["diagnostics"]["groups"].iat[0] == 12


def test_per_cut_parts_merge_to_exactly_the_single_run_tables():
    """The workflow runs one job per cut (rules/allocation.smk) and merges them: whatever the
    order the parts arrive in, the merged tables equal one run over every cut, bit for bit."""
    runs, pfi_table, preds = synthetic_campaign()
    cfg = small_config(cuts=[0.0, 0.2, 0.3, 0.4], headline={"cut": 0.3})
    table = group_table(runs, pfi_table, preds, cfg)
    whole = simulate(table, cfg)
    # a part job reads only the settings the cuts' numbers depend on
    part_cfg = SimulationConfig.from_dict(
        {
            k: v
            for k, v in {
                "n_workloads": 24,
                "jobs_per_workload": 12,
                "out_of_sample": {"splits": 2, "workloads": 8},
            }.items()
            if k not in MERGE_ONLY_KEYS
        }
    )
    parts = [simulate_cuts(table, part_cfg, [float(cut_label(c))]) for c in reversed(cfg.cuts)]
    merged = combine(parts, table, cfg)
    one_pass = simulate_cuts(
        table, cfg, cfg.cuts
    )  # every cut at once: rows in the study's own order
    for name in PART_TABLES:
        pd.testing.assert_frame_equal(merged[name], one_pass[name], check_exact=True, obj=name)
    for name in ("headline", "diagnostics"):
        pd.testing.assert_frame_equal(merged[name], whole[name], check_exact=True, obj=name)
    assert list(merged["out_of_sample"]["variant"].unique()) == [
        "no PFI",
        "in-sample",
        "out-of-sample",
    ]
    with pytest.raises(ValueError, match="no simulated part for cut"):
        combine(parts[1:], table, cfg)


def test_production_mix_follows_the_pretraining_fraction():
    runs, pfi_table, preds = synthetic_campaign()
    table = group_table(runs, pfi_table, preds, small_config())
    idx = sample_workloads(table.groups, "production", 200, 100, np.random.default_rng(0), 0.2)
    share = (table.groups["task"].to_numpy()[idx] == "pt").mean()
    assert share == pytest.approx(0.2, abs=0.01)  # 20,000 draws: sd ~0.003
    rnd = sample_workloads(table.groups, "random", 200, 100, np.random.default_rng(0), 0.2)
    counts = np.bincount(rnd.ravel(), minlength=len(table.groups))
    from scipy.stats import chisquare

    assert chisquare(counts).pvalue > 1e-4  # uniform over groups


def test_stratified_halves_split_every_stratum_and_ols_fits_the_half():
    runs, pfi_table, preds = synthetic_campaign(n_groups=12)
    table = group_table(runs, pfi_table, preds, small_config())
    g = table.groups
    train = stratified_halves(g, np.random.default_rng(3))
    for _, part in g.assign(train=train).groupby(["cluster", "task"]):
        assert abs(part["train"].sum() - (~part["train"]).sum()) <= 1
    slope, intercept = fit_pfi_ols(
        g["dram_copy_product"].to_numpy()[train], g["pfi_measured"].to_numpy()[train]
    )
    np.testing.assert_allclose(
        [slope, intercept], np.polyfit(g["dram_copy_product"][train], g["pfi_measured"][train], 1)
    )


def test_config_accepts_the_nested_layout_and_rejects_unknown_keys():
    cfg = SimulationConfig.from_dict(
        {
            "production": {"pretraining_fraction": 0.3},
            "sla": {"tiers": [0, 0.5], "tier_weights": [1, 1]},
            "policies": ["pfi-aware"],
        }
    )
    assert cfg.pretraining_fraction == 0.3 and cfg.sla_tiers == [0, 0.5]
    assert cfg.policies == ["equal-weight", "pfi-aware", "oracle"]  # the gap needs both ends
    with pytest.raises(ValueError, match="unknown allocation config"):
        SimulationConfig.from_dict({"n_workload": 5})
    with pytest.raises(ValueError, match="unknown allocation policies"):
        SimulationConfig.from_dict({"policies": ["best"]})


def test_out_of_sample_figure_without_splits_says_so():
    empty = pd.DataFrame(columns=["mix", "cut", "policy", "variant", "n_splits", "gap_closed_mean"])
    fig = out_of_sample_figure(empty, ["emulated"])
    assert any("no out-of-sample splits" in t.get_text() for ax in fig.axes for t in ax.texts)


def test_oracle_on_one_workload_without_a_leading_axis_matches_the_batched_call():
    """A single non-concave workload (no workload axis) goes through the MILP fallback."""
    rng = np.random.default_rng(3)
    P = np.sort(rng.uniform(100, 700, (6, 4)), axis=-1)
    T = np.cumsum(rng.uniform(0, 1, (6, 4)) ** 3, axis=-1)  # convex pieces: not concave
    budget = 0.7 * P[:, -1].sum()
    one = orc.oracle(P, T, budget)
    batch = orc.oracle(P[None], T[None], np.array([budget]))
    assert one.power_w.shape == (6,)
    assert one.power_w.sum() <= budget + 1e-6
    np.testing.assert_allclose(one.throughput.sum(), batch.throughput[0].sum(), rtol=1e-9)


def test_hull_per_distinct_curve_equals_the_full_hull_and_the_oracle_reports_its_path():
    from wattflex.allocation.allocator import _hull_by_key

    rng = np.random.default_rng(3)
    groups = Curves(
        np.cumsum(rng.uniform(50, 300, (5, 6)), -1), np.cumsum(rng.uniform(-1, 5, (5, 6)), -1)
    )
    index = rng.integers(0, 5, (4, 30))
    curves = groups.take(index)
    full = orc.concave_hull(curves.power_w, curves.throughput)
    np.testing.assert_array_equal(_hull_by_key(curves, index), full)
    assert _hull_by_key(curves, None) is None
    budget = 0.7 * curves.ceiling_w.sum(-1)
    keyed = allocate(curves, budget, "oracle", cache={"curve_key": index})
    plain = allocate(curves, budget, "oracle")
    np.testing.assert_array_equal(keyed.power_w, plain.power_w)
    assert set(keyed.oracle_method) <= {"hull-certified", "milp"}
    assert (keyed.oracle_gap_rel >= 0).all() and (keyed.oracle_gap_rel <= orc.GAP_TOL).all()
    np.testing.assert_array_equal(keyed.exact_fallback, keyed.oracle_method == "milp")
    assert allocate(curves, budget, "equal-weight").oracle_method is None


def test_oracle_guard_allows_a_policy_above_the_oracle_only_within_its_proven_gap():
    from wattflex.allocation.simulate import _check_oracle_dominates

    oracle_total, gap = np.array([1000.0, 2000.0]), np.array([0.5, 0.0])

    def frames(policy_total):
        return [
            pd.DataFrame(
                {
                    "cut": 0.3,
                    "policy": "oracle",
                    "feasible": True,
                    "total_tokens_per_s": oracle_total,
                }
            ),
            pd.DataFrame(
                {"cut": 0.3, "policy": "x", "feasible": True, "total_tokens_per_s": policy_total}
            ),
        ]

    _check_oracle_dominates(
        frames(np.array([1000.4, 2000.0])), 0.3, oracle_total, gap, skip=("oracle",)
    )
    with pytest.raises(AssertionError, match="beat the oracle"):
        _check_oracle_dominates(
            frames(np.array([1000.6, 2000.0])), 0.3, oracle_total, gap, skip=("oracle",)
        )
    with pytest.raises(
        AssertionError, match="beat the oracle"
    ):  # no gap: only float rounding allowed
        _check_oracle_dominates(
            frames(np.array([1000.0, 2000.01])), 0.3, oracle_total, gap, skip=("oracle",)
        )


# --------------------------------------------- too little data: no production mix, no predictor


def pretraining_only(n_groups=6, **cfg):
    """The synthetic campaign's pretraining groups only (no fine-tuning: no production mix)."""
    runs, pfi_table, preds = synthetic_campaign(n_groups=n_groups)
    runs = runs[runs["task"] == "pt"]
    keep = runs["group"].unique()
    return group_table(
        runs,
        pfi_table[pfi_table["group"].isin(keep)],
        preds[preds["group"].isin(keep)],
        small_config(**cfg),
    ), small_config(**cfg)


def test_a_mix_the_groups_cannot_form_is_skipped_with_its_reason_and_the_headline_says_so():
    table, cfg = pretraining_only()
    out = simulate(table, cfg)
    assert set(out["summary"]["mix"]) == set(out["sla"]["mix"]) == {"random"}
    assert out["skipped"].mixes == {
        "production": "the production mix needs both pretraining and fine-tuning "
        "groups; all 3 group(s) are pretraining (task pt)"
    }
    # the headline (production by default) has its columns, no rows, and says why
    assert list(out["headline"].columns) == HEADLINE_COLUMNS and out["headline"].empty
    assert "production mix (allocation.headline.mix) was not simulated" in out["skipped"].headline
    # per-cut parts merge the same way (each job leaves out the same mix)
    merged = combine([simulate_cuts(table, cfg, [c]) for c in cfg.cuts], table, cfg)
    pd.testing.assert_frame_equal(merged["summary"], out["summary"])


def test_out_of_sample_splits_whose_test_half_cannot_form_a_mix_skip_that_mix():
    runs, pfi_table, preds = synthetic_campaign(n_groups=12)
    cfg = small_config(out_of_sample={"splits": 3, "workloads": 8})
    out = simulate(group_table(runs, pfi_table, preds, cfg), cfg)
    assert out["skipped"].splits == {}  # 12 groups: every half carries both mixes
    table, cfg = pretraining_only(
        n_groups=3, out_of_sample={"splits": 2, "workloads": 8}
    )  # 2 pt groups
    out = simulate(table, cfg)
    assert set(out["skipped"].splits) == {"0", "1"}  # one group per half: no refit
    assert "the refit needs 2" in out["skipped"].splits["0"]
    assert list(out["out_of_sample"].columns)[:6] == [
        "mix",
        "cut",
        "policy",
        "variant",
        "n_splits",
        "gap_closed_mean",
    ]


def test_no_mix_left_gives_tables_without_rows_and_a_figure_that_says_why():
    table, cfg = pretraining_only(mixes=["production"])
    out = simulate(table, cfg)
    assert all(out[name].empty for name in (*PART_TABLES, "headline"))
    assert list(out["headline"].columns) == HEADLINE_COLUMNS
    fig = fig8_figure(
        out["summary"], out["headline"], ["emulated"], out["skipped"].mixes, out["skipped"].headline
    )
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any(
        t.startswith("nothing to show: production mix not simulated: the production mix needs")
        for t in texts
    )


def test_a_headline_mix_not_simulated_is_written_with_its_columns_and_read_back(tmp_path):
    """mixes: [random] (headline on production): the headline is a table with its columns and
    no rows, which the figure rule reads back (an empty DataFrame wrote a file pandas cannot read)."""
    runs, pfi_table, preds = synthetic_campaign()
    cfg = small_config(mixes=["random"])
    out = simulate(group_table(runs, pfi_table, preds, cfg), cfg)
    assert "is not among allocation.mixes ['random']" in out["skipped"].headline
    out["headline"].to_csv(tmp_path / "headline.csv", index=False)
    back = pd.read_csv(tmp_path / "headline.csv")
    assert list(back.columns) == HEADLINE_COLUMNS and back.empty
    fig = fig8_figure(out["summary"], back, ["emulated"], {}, out["skipped"].headline)
    assert any("no headline: the headline's mix 'production'" in t.get_text() for t in fig.texts)


def test_policies_without_a_predicted_pfi_are_left_out_not_simulated_as_nan():
    """A predictor not fitted (too few groups) leaves pfi_pred empty: the policies that read it
    are left out with the reason; the rest run and every number is finite."""
    runs, pfi_table, preds = synthetic_campaign()
    preds["pfi_pred"] = np.nan
    cfg = small_config()
    out = simulate(group_table(runs, pfi_table, preds, cfg), cfg)
    assert set(out["skipped"].policies) == {"pfi-aware", "curve-aware"}
    assert (
        "needs the predicted PFI (allocation.pfi_column 'pfi_pred'"
        in out["skipped"].policies["pfi-aware"]
    )
    assert set(out["summary"]["policy"]) == set(POLICIES) - {"pfi-aware", "curve-aware"}
    assert np.isfinite(out["results"]["total_tokens_per_s"]).all()
    assert set(out["out_of_sample"].query("variant == 'in-sample'")["policy"]) == set()
    assert set(out["out_of_sample"].query("variant == 'out-of-sample'")["policy"]) == {
        "pfi-aware",
        "curve-aware",
    }
