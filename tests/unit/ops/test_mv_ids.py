"""M&V event ids (wattflex.ops.services.mv): two events that share a name are two occurrences, each
with its own id in ``mv.json`` and ``mv_intervals.csv`` (written by the real writer,
``write_run_mv``, from a controlled run's record)."""

from types import SimpleNamespace

import numpy as np
import pytest

from wattflex.ops.events import Event, Schedule
from wattflex.ops.services.mv import occurrence_ids, write_run_mv
from wattflex.provenance import read_csv, read_json


def test_two_events_with_one_name_get_one_id_each_in_the_mv_files(tmp_path):
    t = np.arange(0.0, 200.0, 1.0)
    sched = Schedule((Event("peak", 60, 90, fraction=0.7), Event("peak", 140, 170, fraction=0.5)))
    budget = sched.budget(t, 1300.0)
    power = np.minimum(1300.0, budget)
    rec = SimpleNamespace(t_s=t, power_w=power, budget_w=budget, caps_w=np.full((len(t), 1), 650.0))
    write_run_mv(tmp_path, rec, sched, 5.0, 1300.0, {}, basis_w=1300.0, interval_s=10.0)
    events = read_json(tmp_path / "mv.json")["events"]
    ids = [r["event_id"] for r in events]
    assert ids == ["peak@60s", "peak@140s"] and [r["target_w"] for r in events] == pytest.approx(
        [910, 650]
    )
    rows = read_csv(tmp_path / "mv_intervals.csv")
    assert set(rows["event_id"]) == set(ids)
    first, second = (rows[rows["event_id"] == i] for i in ids)
    assert (
        first["interval_start_s"].min() == 0 and second["interval_start_s"].min() == 80
    )  # own pre-periods


def test_ids_stay_as_named_when_unique_and_a_counter_parts_exact_repeats():
    assert occurrence_ids([{"event_id": "a", "start_s": 0}, {"event_id": "b", "start_s": 5}]) == [
        "a",
        "b",
    ]
    assert occurrence_ids([{"event_id": "a", "start_s": 0}, {"event_id": "a", "start_s": 0}]) == [
        "a@0s#1",
        "a@0s#2",
    ]
