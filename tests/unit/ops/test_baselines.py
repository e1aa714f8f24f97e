"""Meter baselines (wattflex.ops.baselines) on load histories whose baseline is known by hand."""

import numpy as np
import pytest

from wattflex.ops.baselines import (
    DAY_S,
    BaselineRule,
    average_days,
    eligible_days,
    pre_event,
    same_day_adjusted,
)

RULE = BaselineRule(days=3, adjust_hours=2.0, adjust_gap_hours=1.0, cap=0.2, pre_s=1800.0)


def history(days: int, level_by_day, period_s: float = 600.0):
    """A load that is ``level_by_day[d]`` kW all day ``d``."""
    t = np.arange(0.0, days * DAY_S, period_s)
    return t, np.asarray([level_by_day[int(x // DAY_S)] for x in t], float) * 1e3


def test_x_of_y_days_averages_the_same_window_of_the_days_before():
    t, load = history(5, [100, 200, 300, 400, 999])
    start = 4 * DAY_S + 17 * 3600.0
    # days 3, 2, 1: (400 + 300 + 200) / 3 kW
    assert average_days(t, load, start, start + 7200, set(), RULE) == pytest.approx(300e3)


def test_event_days_are_not_eligible_and_short_histories_give_nan():
    assert eligible_days(5, {3}, 3) == [4, 2, 1]
    t, load = history(5, [100, 200, 300, 400, 999])
    start = 4 * DAY_S + 17 * 3600.0
    assert average_days(t, load, start, start + 7200, {3}, RULE) == pytest.approx(
        200e3
    )  # days 2, 1, 0
    assert np.isnan(average_days(t, load, 2 * DAY_S + 3600.0, 2 * DAY_S + 7200.0, set(), RULE))


def test_the_same_day_adjustment_is_capped():
    t, load = history(5, [300, 300, 300, 300, 330])  # event day 10 % above usual all day
    start = 4 * DAY_S + 17 * 3600.0
    assert same_day_adjusted(t, load, start, start + 3600, set(), RULE) == pytest.approx(330e3)
    t, load = history(5, [300, 300, 300, 300, 600])  # 100 % above: the shift stops at 20 %
    assert same_day_adjusted(t, load, start, start + 3600, set(), RULE) == pytest.approx(360e3)


def test_pre_event_is_the_mean_just_before():
    t = np.arange(0.0, 7200.0, 60.0)
    load = np.where(t < 3600, 1e3, 2e3)
    assert pre_event(t, load, 3600.0, RULE) == pytest.approx(1e3)


def test_a_rule_out_of_range_is_refused():
    with pytest.raises(ValueError):
        BaselineRule(days=0)
    with pytest.raises(ValueError):
        BaselineRule(cap=1.5)
