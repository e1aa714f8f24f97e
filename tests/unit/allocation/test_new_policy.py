"""A new policy is one class in one place: defined here, registered through the registry's
public API (wattflex.policies.register) and run, with no other file touched, by
the allocation study, ``wattflex allocate``'s library call, the live controller's step, the
SLURM coordinator's split and the figures' style lookup."""

import numpy as np
import pandas as pd
import pytest

from tests.unit.allocation.test_allocation import small_config, synthetic_campaign
from wattflex.allocation.allocator import allocate_table
from wattflex.allocation.curves import Curves
from wattflex.allocation.simulate import group_table, simulate_cuts
from wattflex.ops.adapters.slurm import ClusterSplit, split_budget
from wattflex.ops.controller import ControlConfig, Controller, JobTable, Readings
from wattflex.plots.allocation import fig8_figure, figure_policies
from wattflex.plots.style import policy_look
from wattflex.policies import Look, Policy, get, names, register, unregister

LOOK = Look("inverse PFI", "#8c564b", "-.")


class InversePfi(Policy):
    """``C_i ∝ P_max_i / PFI_i``: the least flexible jobs give up the most (the paper's
    weighting turned round, so that it must come out worse than equal weight)."""

    def weights(self, curves, features, options):
        """Each job's uncapped power over its PFI."""
        pfi = np.asarray(features[self.feature], float)
        p_max = curves.ceiling_w
        return np.divide(p_max, pfi, out=np.zeros_like(p_max), where=pfi > 0)


@pytest.fixture
def inverse_pfi():
    policy = register(
        InversePfi(
            name="inverse-pfi",
            look=LOOK,
            feature="pfi",
            allocation=True,
            control=True,
            split=True,
        )
    )
    yield policy
    unregister(policy.name)


# two jobs of the same uncapped power whose PFIs are 1 and 3: the cut splits 3:1 (1/PFI)
PFI = np.array([1.0, 3.0])
CEILING = np.array([4000.0, 4000.0])
FLOOR = np.array([1000.0, 1000.0])
CUT_W = 1200.0
EXPECTED_W = CEILING - CUT_W * np.array([0.75, 0.25])


def two_job_curves():
    """Power-law curves T = T_max (P/P_max)^(1/PFI) on [floor, ceiling], 7 points each."""
    P = np.linspace(FLOOR, CEILING, 7).T
    T = 1e4 * (P / CEILING[:, None]) ** (1 / PFI[:, None])
    return Curves(P, T)


def test_the_registry_refuses_a_taken_name_and_an_empty_policy(inverse_pfi):
    assert get("inverse-pfi") is inverse_pfi and inverse_pfi.weighted
    with pytest.raises(ValueError, match="already registered"):
        register(InversePfi(name="inverse-pfi", look=LOOK, feature="pfi", allocation=True))
    with pytest.raises(ValueError, match="override weights"):
        register(Policy(name="nothing", look=LOOK, allocation=True))
    with pytest.raises(ValueError, match="role optimum is oracle's"):
        register(InversePfi(name="x", look=LOOK, allocation=True, role="optimum"))


def test_the_allocation_study_runs_it_and_scores_it_against_the_oracle(inverse_pfi):
    runs, pfi_table, preds = synthetic_campaign()
    cfg = small_config(policies=["inverse-pfi", "pfi-aware"], cuts=[0.3])
    assert cfg.policies == ["equal-weight", "inverse-pfi", "pfi-aware", "oracle"]
    out = simulate_cuts(group_table(runs, pfi_table, preds, cfg), cfg, [0.3])
    res = out["results"]
    ours = res[res["policy"] == "inverse-pfi"].set_index(["mix", "workload"])
    best = res[res["policy"] == "oracle"].set_index(["mix", "workload"])
    assert len(ours) == len(best) > 0
    assert (ours["total_power_w"] <= ours["budget_w"] * (1 + 1e-9)).all()
    assert (ours["total_tokens_per_s"] <= best["total_tokens_per_s"] * (1 + 1e-9)).all()
    gap = out["summary"].set_index(["mix", "policy"])["gap_closed"]
    for mix in cfg.mixes:  # cutting the inflexible jobs most loses to the paper's weighting
        assert gap[mix, "inverse-pfi"] < gap[mix, "pfi-aware"]


def test_wattflex_allocate_library_call_splits_the_cut_by_its_weights(inverse_pfi):
    curves = two_job_curves()
    points = pd.DataFrame(
        {
            "job": np.repeat(["a", "b"], curves.power_w.shape[1]),
            "power_w": curves.power_w.ravel(),
            "throughput": curves.throughput.ravel(),
            "pfi": np.repeat(PFI, curves.power_w.shape[1]),
        }
    )
    out, totals = allocate_table(points, "inverse-pfi", budget_w=CEILING.sum() - CUT_W)
    assert out["power_w"].to_numpy() == pytest.approx(EXPECTED_W)
    assert totals["policy"] == "inverse-pfi"
    assert totals["total_throughput"] <= totals["oracle_throughput"]
    with pytest.raises(ValueError, match="needs a per-job 'pfi' column"):
        allocate_table(points.drop(columns="pfi"), "inverse-pfi", budget_w=7000.0)


def test_the_controller_steps_it_beside_a_builtin_policy(inverse_pfi):
    n = 2
    jobs = JobTable(
        uid=np.arange(n),
        gpus=np.full(n, 8),
        min_cap_w=np.full(n, 125.0),
        max_cap_w=np.full(n, 500.0),
        moe_ft=np.zeros(n, bool),
        p_max_w=CEILING.copy(),
        t_max=np.full(n, 1e4),
        dram_copy_product=np.full(n, 10.0),
        pfi=PFI.copy(),
    )
    cfg = ControlConfig()
    power = np.tile(CEILING, (2, 1))
    total = power.sum(-1)
    read = Readings(
        power,
        np.full_like(power, 1e4),
        np.full_like(power, 99.0),
        np.zeros_like(power),
        total,
        np.zeros_like(total),
        0,
    )
    budget = 0.75 * CEILING.sum()
    caps = Controller(["inverse-pfi", "pfi-aware"], cfg, n).step(0.0, budget, jobs, read)
    inverse, paper = caps
    assert inverse[0] < inverse[1]  # the job of PFI 1 gives up the most
    assert paper[0] > paper[1]  # the paper's policy does the opposite
    assert (jobs.gpus * inverse).sum() <= budget * (1 - cfg.target_margin) + 1e-6


def test_the_slurm_coordinator_splits_by_it(inverse_pfi):
    curves = two_job_curves()
    alive = np.ones(2, bool)
    share = split_budget(
        CEILING.sum() - CUT_W,
        FLOOR.copy(),
        CEILING.copy(),
        alive,
        policy="inverse-pfi",
        curves=curves,
        has_curve=alive,
        pfi=PFI,
    )
    assert share == pytest.approx(EXPECTED_W)
    assert "inverse-pfi" in names(split=True)
    with pytest.raises(ValueError, match="needs the campaign's curves"):
        ClusterSplit(policy="inverse-pfi")


def test_the_figures_draw_it_in_its_own_look(inverse_pfi):
    assert policy_look("inverse-pfi") == LOOK
    assert figure_policies()["inverse-pfi"] == ("inverse PFI", "#8c564b", "-.")
    summary = pd.DataFrame(
        {
            "mix": "uniform",
            "cut": [0.0, 0.3] * 3,
            "policy": np.repeat(["equal-weight", "inverse-pfi", "oracle"], 2),
            "per_job_tokens_per_s_mean": [1e4, 9e3, 1e4, 8e3, 1e4, 9.5e3],
            "per_job_tokens_per_s_p5": 8e3,
            "per_job_tokens_per_s_p95": 1e4,
            "gap_closed": [np.nan, 0.0, np.nan, -2.0, np.nan, 1.0],
        }
    )
    fig = fig8_figure(summary, pd.DataFrame(columns=["mix", "policy"]), "emulated")
    lines = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "inverse PFI"]
    assert len(lines) == 1
    assert lines[0].get_color() == "#8c564b" and lines[0].get_linestyle() == "-."
