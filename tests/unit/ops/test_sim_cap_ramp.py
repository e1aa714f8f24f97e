"""The cluster simulation holds every cap step to the event's ramp limit, as a real node does:
both call :func:`wattflex.ops.controller.ramp_caps` (the controllers through
``Controller.step``, the oracle directly). A quiet cluster (no arrivals, departures,
checkpoints or power noise) so every change of its load is a cap change."""

import math

import numpy as np
import pytest

from tests.unit.ops.test_clustersim import MODEL, STEP_W, campaign, small_cluster, tables  # noqa: F401 (fixtures)
from wattflex.ops.clustersim import Scenario, simulate
from wattflex.ops.controller import ControlConfig, ramp_caps
from wattflex.ops.events import Event, Schedule

RAMP_W_PER_S = 100.0
PERIOD_S = 5.0


def quiet_run(tables, ramp_w_per_s):  # noqa: F811
    cc = small_cluster(
        mean_interarrival_s=1e9,
        duration_min_s=1e6,
        duration_max_s=1e6,
        duration_median_s=1e6,
        checkpoint_every_s=1e9,
        power_noise=0.0,
    )
    sched = Schedule(
        (Event("ev30", 300, 900, fraction=0.7, ramp_w_per_s=ramp_w_per_s, deadline_s=150),)
    )
    return simulate(
        tables,
        Scenario("ev30", sched, response_s=150, tail_s=300),
        ["equal-weight", "curve-aware"],
        ControlConfig(cap_step_w=STEP_W, period_s=PERIOD_S),
        cc,
        3,
        MODEL,
    )


def worst_move_w(p: np.ndarray, window_s: int) -> tuple[float, float]:
    """Largest fall and rise of the load over any ``window_s`` seconds."""
    d = p[window_s:] - p[:-window_s]
    return float(max(-d.min(), 0.0)), float(max(d.max(), 0.0))


@pytest.fixture(scope="module")
def ramped(tables):  # noqa: F811
    return quiet_run(tables, RAMP_W_PER_S)


def test_every_controller_and_the_oracle_move_their_load_at_most_at_the_ramp(ramped, tables):  # noqa: F811
    res = ramped
    assert np.ptp(res.power_w[res.rows.index("uncapped")]) == 0  # quiet: only caps move the load
    window = 30
    # a window of 30 s holds at most 7 cap steps (one period on either side, the firmware settling
    # in between), each within ramp x period. The limit holds the load the caps are *estimated*
    # to move (a GPU sheds from what it draws down to its new cap); under a binding cap an
    # emulated 8-GPU job draws 7-19 W per GPU below it, the gap changing with the cap (the GPUs
    # wait for the leakiest), so a step moves up to a few % more than estimated: 5 % allowed.
    allow = RAMP_W_PER_S * (window + 2 * PERIOD_S) * 1.05
    for name in ("equal-weight", "curve-aware", "oracle"):
        p = res.power_w[res.rows.index(name)]
        fall, rise = worst_move_w(p, window)
        assert 0.5 * RAMP_W_PER_S * window < fall <= allow, (name, fall)  # it moves, and no faster
        assert 0.5 * RAMP_W_PER_S * window < rise <= allow, (name, rise)
        assert p[-1] == pytest.approx(p[0], rel=1e-3), name  # restored by the end


def test_without_the_ramp_the_same_event_moves_far_faster(tables):  # noqa: F811
    res = quiet_run(tables, math.inf)
    for name in ("equal-weight", "oracle"):
        fall, rise = worst_move_w(res.power_w[res.rows.index(name)], 30)
        assert min(fall, rise) > 2 * RAMP_W_PER_S * (30 + 2 * PERIOD_S), (name, fall, rise)


def test_ramp_caps_spends_the_allowance_in_whole_cap_steps():
    """Many GPUs under a slow ramp: each job's equal share of the allowance is under one cap
    step, so the rounding alone would move nothing; whole steps go to jobs in slot order."""
    gpus = np.full(8, 4.0)
    old = np.full((1, 8), 400.0)
    up = ramp_caps(
        old,
        np.full((1, 8), 700.0),
        np.full(8, 400.0),
        gpus,
        np.full(8, 200.0),
        np.full(8, 700.0),
        25.0,
        500.0,
    )
    assert ((up - old) * gpus).sum() == 500.0 and set(np.unique(up - old)) == {0.0, 25.0}
    down = ramp_caps(
        old,
        np.full((1, 8), 200.0),
        np.full(8, 390.0),
        gpus,
        np.full(8, 200.0),
        np.full(8, 700.0),
        25.0,
        500.0,
    )
    shed = ((np.minimum(old, 390.0) - down) * gpus).sum()
    assert 500.0 - 25.0 * 4 < shed <= 500.0
    free = ramp_caps(
        old, np.full((1, 8), 700.0), np.full(8, 400.0), gpus, 200.0, 700.0, 25.0, math.inf
    )
    assert (free == 700.0).all()
