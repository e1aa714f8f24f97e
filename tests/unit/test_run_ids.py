"""Run ids: one helper writes them and reads them back (wattflex.run_ids)."""

import re

import pytest

from wattflex.config import expand_runs
from wattflex.run_ids import RUN_ID_PATTERN, parse_run_id, run_id


@pytest.mark.parametrize(
    "cap_w, repeat, expected",
    [
        (437.5, 0, "cap437.5"),
        (1000.0, 0, "cap1000"),
        (1000, 2, "cap1000_r2"),
        (100.25, 1, "cap100.25_r1"),
        (700.0, 0, "cap700"),
        (300.00000000000006, 0, "cap300"),  # an ingested 0.3 kW
    ],
)
def test_run_id_round_trips_odd_caps(cap_w, repeat, expected):
    rid = run_id(cap_w, repeat)
    assert rid == expected
    assert re.fullmatch(RUN_ID_PATTERN, rid)  # the Snakefile's {run} constraint takes it
    cap, rep = parse_run_id(rid)
    assert (cap, rep) == (pytest.approx(cap_w), repeat)
    assert run_id(cap, rep) == rid


@pytest.mark.parametrize("bad", ["cap", "437.5", "cap437.5_r", "capx", "cap300_r1_r2", "power300"])
def test_parse_run_id_refuses_what_is_not_a_run_id(bad):
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        parse_run_id(bad)


def test_every_default_run_parses_back_to_its_cap_and_repeat(default_config):
    for row in expand_runs(default_config):
        assert parse_run_id(row["run_id"]) == (row["cap_w"], row["repeat"])
