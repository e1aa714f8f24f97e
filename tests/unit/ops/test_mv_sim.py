"""M&V of grid events in the cluster simulation (wattflex.ops.services.mv on wattflex.ops.clustersim):
a scheduled 30 % event with a ramp limit and a 30 s deadline, staggered restore after it."""

import numpy as np
import pytest

from tests.unit.ops.test_clustersim import MODEL, STEP_W, campaign, small_cluster, tables  # noqa: F401 (fixtures)
from wattflex.ops.clustersim import Scenario, simulate
from wattflex.ops.controller import ControlConfig
from wattflex.ops.events import Event, Schedule
from wattflex.ops.services.mv import simulation_mv

RAMP_W_PER_S = 300.0


@pytest.fixture(scope="module")
def event_run(tables):  # noqa: F811
    sched = Schedule(
        (Event("ev30", 300, 1200, fraction=0.7, ramp_w_per_s=RAMP_W_PER_S, deadline_s=30),)
    )
    sc = Scenario("ev30", sched, response_s=30, tail_s=300)
    cfg = ControlConfig(cap_step_w=STEP_W, restore_stagger_s=10)
    res = simulate(tables, sc, ["equal-weight", "curve-aware"], cfg, small_cluster(), 3, MODEL)
    return res, sched


def test_the_budget_follows_the_ramp_and_every_controller_meets_the_event(event_run):
    res, sched = event_run
    b = res.budget_w
    start = 300
    ramp = -np.diff(b[start : start + 30])
    assert (
        np.isfinite(b[start:1200]).all() and (ramp[np.isfinite(ramp)] <= RAMP_W_PER_S + 1e-6).all()
    )
    mv, intervals = simulation_mv(res, sched, 30, pre_s=60, interval_s=60)
    mv = mv.set_index("policy")
    tol = ControlConfig().tolerance
    for name in ("equal-weight", "curve-aware", "oracle"):
        r = mv.loc[name]
        assert r["deadline_met"] and r["response_time_s"] <= 30
        # within the controller's tolerance once the deadline has passed
        assert r["worst_w_above_target_after_deadline"] <= tol * r["target_w"]
        assert r["delivered_w_vs_pre_event"] >= 0.95 * r["requested_w_vs_pre_event"]
        assert r["restore_time_s"] is not None and r["restore_time_s"] < 300
    assert mv.loc["oracle", "throughput_lost_vs_oracle"] == 0.0
    assert mv.loc["equal-weight", "throughput_lost_vs_oracle"] > 0
    assert set(intervals["policy"]) == {"equal-weight", "curve-aware", "oracle"}
    one = intervals[intervals["policy"] == "equal-weight"]
    assert len(one) == (1200 + 300 - 240) // 60 and one["interval_start_s"].iloc[0] == 240


def test_staggered_restore_brings_the_load_back_more_slowly_than_all_at_once(tables, event_run):  # noqa: F811
    res, sched = event_run
    sc = Scenario("ev30", sched, response_s=30, tail_s=300)
    at_once = simulate(
        tables, sc, ["equal-weight"], ControlConfig(cap_step_w=STEP_W), small_cluster(), 3, MODEL
    )
    staggered = np.diff(res.power_w[0, 1200:1400]).max()
    burst = np.diff(at_once.power_w[0, 1200:1400]).max()
    assert staggered < burst
