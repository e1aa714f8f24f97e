"""The grid event model (wattflex.ops.events): schedule files in CSV and JSON (the legacy
time_s,fraction CSV still read as a Signal), ramps down and back, and the checks that refuse
or warn about bad events before anything is capped."""

import json
import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from wattflex.ops.events import (
    Event,
    Schedule,
    ScheduleError,
    Signal,
    check_schedule,
    read_schedule,
    windows,
)

NOW = datetime(2027, 1, 15, 17, 0, tzinfo=UTC)


def test_csv_and_json_schedules_read_the_same_events(tmp_path):
    csv = tmp_path / "s.csv"
    csv.write_text(
        "# one 30 % event\nevent_id,start_s,end_s,fraction,ramp_kw_per_s,deadline_s\n"
        "e1,60,660,0.7,0.5,30\n"
    )
    js = tmp_path / "s.json"
    js.write_text(
        json.dumps(
            {
                "events": [
                    {
                        "event_id": "e1",
                        "start": (NOW + timedelta(seconds=60)).isoformat(),
                        "end": (NOW + timedelta(seconds=660)).isoformat(),
                        "fraction": 0.7,
                        "ramp_kw_per_s": 0.5,
                        "deadline_s": 30,
                    }
                ]
            }
        )
    )
    a, b = read_schedule(csv, NOW), read_schedule(js, NOW)
    assert (
        a.events
        == b.events
        == (Event("e1", 60.0, 660.0, fraction=0.7, ramp_w_per_s=500.0, deadline_s=30.0),)
    )


def test_the_legacy_time_fraction_csv_is_still_a_signal(tmp_path):
    p = tmp_path / "sig.csv"
    p.write_text("time_s,fraction\n0,1\n10,1\n10,0.5\n20,0.5\n")
    sig = read_schedule(p)
    assert isinstance(sig, Signal)
    assert sig.budget(15.0, 1000.0) == 500.0 and np.isinf(sig.budget(5.0, 1000.0))
    assert windows(sig, np.arange(0, 21.0), 30.0) == [
        {"event_id": "event1", "start_s": 10.0, "end_s": 21.0, "deadline_s": 30.0}
    ]


def test_the_budget_ramps_down_at_the_limit_holds_the_target_and_ramps_back():
    e = Event("e", start_s=100, end_s=200, target_w=700.0, ramp_w_per_s=30.0, deadline_s=30)
    t = np.array([99, 100, 105, 110, 150, 200, 205, 210, 211])
    b = e.budget(t, basis_w=1000.0)
    assert np.isinf(b[0]) and b[1] == 1000.0
    np.testing.assert_allclose(b[2:7], [850, 700, 700, 700, 850])
    assert np.isinf(b[7:]).all()  # back at the baseline: no budget any more
    step = Event("s", 100, 200, fraction=0.7)  # no ramp limit: a step at both ends
    np.testing.assert_allclose(
        step.budget(np.array([99.0, 100, 199, 200]), 1000.0), [np.inf, 700, 700, np.inf]
    )


@pytest.mark.parametrize(
    "row, message",
    [
        ("e,10,5,0.7,,", "end (5 s) must be after start (10 s)"),
        ("e,0,10,1.2,,", "fraction must be in (0, 1)"),
        ("e,0,10,,,", "give exactly one of target_kw and fraction"),
        ("e,0,10,0.7,-1,", "ramp_kw_per_s must be > 0"),
        ("e,0,10,abc,,", "fraction 'abc' is not a number"),
    ],
)
def test_bad_rows_are_refused_naming_the_row(tmp_path, row, message):
    p = tmp_path / "s.csv"
    p.write_text(f"event_id,start_s,end_s,fraction,ramp_kw_per_s,deadline_s\n{row}\n")
    with pytest.raises(
        ScheduleError, match=f"row 2: .*{message.replace('(', '[(]').replace(')', '[)]')}"
    ):
        read_schedule(p)


def test_times_need_a_zone_and_unknown_keys_are_named(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(
        json.dumps({"events": [{"start": "2027-01-15T17:00:00", "end_s": 60, "fraction": 0.5}]})
    )
    with pytest.raises(ScheduleError, match="has no time zone"):
        read_schedule(p, NOW)
    p.write_text(
        json.dumps({"events": [{"start_s": 0, "end_s": 60, "fraction": 0.5, "target": 3}]})
    )
    with pytest.raises(ScheduleError, match="event 1: unknown key.s. 'target'"):
        read_schedule(p, NOW)


def test_overlapping_and_past_events_are_refused():
    over = Schedule((Event("a", 0, 100, fraction=0.7), Event("b", 50, 150, fraction=0.8)))
    with pytest.raises(
        ScheduleError, match="event 'b' .start 50 s. overlaps event 'a' .ends 100 s."
    ):
        check_schedule(over, floor_w=400, basis_w=1400, period_s=5)
    past = Schedule((Event("old", -500, -100, fraction=0.7),))
    with pytest.raises(ScheduleError, match="event 'old' ended 100 s ago"):
        check_schedule(past, floor_w=400, basis_w=1400, period_s=5)


def test_an_event_under_way_starts_now_a_low_target_and_a_short_deadline_warn():
    s = Schedule(
        (
            Event("run", -20, 100, fraction=0.7),
            Event("low", 200, 300, target_w=300.0),
            Event("fast", 400, 500, fraction=0.5, ramp_w_per_s=10.0, deadline_s=30),
        )
    )
    chk = check_schedule(s, floor_w=400, basis_w=1400, period_s=5)
    assert chk.schedule.events[0].start_s == 0.0
    w = "\n".join(chk.warnings)
    assert "event 'run' started 20 s ago: it is followed from now" in w
    assert (
        "event 'low': target 300 W is below the GPUs' floor of 400 W" in w
        and "held at their floors" in w
    )
    assert (
        "event 'fast': the ramp of 0.01 kW/s from 1400 W to 700 W with a 5 s control period needs 77.0 s, "
        "over the 30 s deadline" in w
    )
    assert math.isinf(chk.schedule.budget(150.0, 1400.0))


@pytest.mark.parametrize("key", ["target_kw", "fraction", "start_s", "ramp_kw_per_s"])
def test_json_booleans_are_not_numbers(tmp_path, key):
    event = {"start_s": 0, "end_s": 60, "fraction": 0.5, key: True}
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"events": [event]}))
    with pytest.raises(ScheduleError, match=f"event 1: {key} true is not a number"):
        read_schedule(p, NOW)
