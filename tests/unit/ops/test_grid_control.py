"""``wattflex control`` following grid events on FAKE NVML (tests/fakes/fake_pynvml.py: two
fake H200s, 200-700 W, drawing 650 W each uncapped): a 30 % event with a 1 s deadline is met
with 0 W above target after the deadline in its M&V record, every cap is restored after,
the Prometheus endpoint is scraped live during the run, and bad schedules stop the command
with one line before any limit changes."""

import json
import re
import time
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.nvml_fixture import control_process, fake_nvml, limits_w  # noqa: F401 (fixture)
from wattflex import cli
from wattflex.ops.services.exporter import metric_names
from wattflex.provenance import read_csv, read_json

pytestmark = pytest.mark.fake_gpu


def schedule(tmp_path, *events):
    p = tmp_path / "events.json"
    p.write_text(json.dumps({"events": list(events)}))
    return p


def scrape(url):
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {s.name: s for fam in text_string_to_metric_families(text) for s in fam.samples}, text


def test_a_30pct_event_is_met_scraped_live_and_every_cap_restored_fake_nvml(fake_nvml, tmp_path):
    ev = schedule(
        tmp_path,
        {"event_id": "ev30", "start_s": 1.0, "end_s": 4.0, "fraction": 0.7, "deadline_s": 1.0},
    )
    mv = tmp_path / "mv"
    proc = control_process(
        tmp_path,
        "--signal",
        str(ev),
        "--basis",
        "measured",
        "--period-s",
        "0.2",
        "--state-dir",
        str(tmp_path / "st"),
        "--mv-out",
        str(mv),
        "--metrics-port",
        "0",
        "--restore-stagger-s",
        "0.4",
    )
    try:
        url = proc.stdout.readline().split("metrics at ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:")
        time.sleep(1.5)  # inside the event, past its deadline
        samples, text = scrape(url)
        families = {f.name for f in text_string_to_metric_families(text)}
        assert {n.removesuffix("_total") for n in metric_names()} <= families
        assert samples["wattflex_cluster_budget_watts"].value == pytest.approx(0.7 * 1300, abs=1)
        assert samples["wattflex_cluster_power_watts"].value <= 0.7 * 1300
        assert samples["wattflex_cluster_headroom_watts"].value >= 0
        limits = [s for s in text.splitlines() if s.startswith("wattflex_gpu_power_limit_watts{")]
        assert len(limits) == 2 and all(float(s.split()[-1]) <= 455 for s in limits)
        assert 'source="predicted"' in text and 'max_loss="0.10"' in text
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    out = proc.stdout.read()
    assert "M&V ev30:" in out and "0 s above target after the deadline (worst 0 W)" in out
    assert limits_w() == [700.0, 700.0]  # every cap restored after
    rec = read_json(mv / "mv.json")["events"][0]
    assert rec["target_w"] == pytest.approx(910.0) and rec["baseline_pre_event_w"] == pytest.approx(
        1300.0
    )
    assert (
        rec["seconds_above_target_after_deadline"] == 0
        and rec["worst_w_above_target_after_deadline"] == 0
    )
    assert rec["deadline_met"] and rec["response_time_s"] <= 1.0
    assert rec["delivered_w_vs_pre_event"] >= 390 and rec["restore_time_s"] is not None
    ts = read_csv(mv / "timeseries.csv")
    after = ts[ts["t_s"] >= 4.0]
    assert (after["cap_w:job0"].iloc[-1], after["cap_w:job1"].iloc[-1]) == (700.0, 700.0)
    # staggered: one job uncapped first, the other 0.4 s later
    first_up = after[(after["cap_w:job0"] == 700) | (after["cap_w:job1"] == 700)].iloc[0]
    assert sorted([first_up["cap_w:job0"], first_up["cap_w:job1"]])[0] < 700
    assert len(read_csv(mv / "mv_intervals.csv")) >= 1


@pytest.mark.parametrize(
    "events, message",
    [
        (
            [
                {"event_id": "a", "start_s": 1, "end_s": 5, "fraction": 0.7},
                {"event_id": "b", "start_s": 3, "end_s": 6, "fraction": 0.8},
            ],
            "event 'b' (start 3 s) overlaps event 'a' (ends 5 s)",
        ),
        (
            [
                {
                    "event_id": "old",
                    "start": "2020-01-01T00:00:00Z",
                    "end": "2020-01-01T01:00:00Z",
                    "fraction": 0.7,
                }
            ],
            "event 'old' ended",
        ),
        (
            [{"event_id": "x", "start_s": 1, "end_s": 5, "fraction": 0.7, "ramp_kw_per_s": -1}],
            "ramp_kw_per_s must be > 0",
        ),
    ],
)
def test_bad_schedules_stop_before_any_cap_changes_fake_nvml(
    fake_nvml, tmp_path, capsys, events, message
):
    ev = schedule(tmp_path, *events)
    assert (
        cli.main(
            [
                "control",
                "--signal",
                str(ev),
                "--period-s",
                "0.1",
                "--state-dir",
                str(tmp_path / "st"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert limits_w() == [700.0, 700.0] and not fake_nvml.state()["set_calls"]


def test_a_target_below_the_floors_and_a_deadline_the_ramp_misses_warn_and_hold_safe_fake_nvml(
    fake_nvml, tmp_path, capsys
):
    ev = schedule(
        tmp_path,
        {"event_id": "low", "start_s": 0.2, "end_s": 0.8, "target_kw": 0.3, "deadline_s": 0.2},
        {
            "event_id": "slow",
            "start_s": 1.0,
            "end_s": 1.6,
            "fraction": 0.5,
            "ramp_kw_per_s": 0.35,
            "deadline_s": 0.2,
        },
    )
    assert (
        cli.main(
            [
                "control",
                "--signal",
                str(ev),
                "--period-s",
                "0.1",
                "--state-dir",
                str(tmp_path / "st"),
                "--mv-out",
                str(tmp_path / "mv"),
            ]
        )
        == 0
    )
    got = capsys.readouterr()
    err = got.err
    assert "event 'low': target 300 W is below the GPUs' floor of 400 W" in err
    assert (
        "event 'slow': the ramp of 0.35 kW/s from 1400 W to 700 W" in err
        and "the deadline is likely missed; the M&V says whether it was" in err
    )
    # the record's words for it, its numbers rounded as measured
    assert re.search(r"M&V slow: deadline 0\.2 s missed \(response (never|\d+\.\d s)\)", got.out)
    assert re.search(
        r"M&V low: deadline 0\.2 s (met|missed) \(response (never|\d+\.\d s)\)", got.out
    )
    calls = fake_nvml.state()["set_calls"]
    assert min(mw for _, mw in calls) >= 200_000  # never below a floor
    recs = {r["event_id"]: r for r in read_json(tmp_path / "mv" / "mv.json")["events"]}
    assert recs["low"]["seconds_above_target_after_deadline"] > 0  # honest: the floor is above it
    assert recs["low"]["worst_w_above_target_after_deadline"] == pytest.approx(
        100.0
    )  # 400 W floor vs 300 W
    assert recs["slow"]["target_w"] == 700.0 and not recs["slow"]["deadline_met"]
    assert limits_w() == [700.0, 700.0]


def test_the_ramp_limit_bounds_every_steps_cap_changes_down_and_back_up_fake_nvml(
    fake_nvml, tmp_path
):
    """A 30 % event ramped at 0.5 kW/s on the two fake GPUs (650 W each): every period the load
    the cap changes can move (a cut below what a GPU draws, a raise of its cap), summed over
    both GPUs, stays within 0.5 kW/s x the period, down and back up after the end, where the
    budget jumps to no limit; the event's target is still met by its deadline, caps restored."""
    ramp_w_per_s = 500.0
    ev = schedule(
        tmp_path,
        {
            "event_id": "ramped",
            "start_s": 0.5,
            "end_s": 4.0,
            "fraction": 0.7,
            "ramp_kw_per_s": ramp_w_per_s / 1e3,
            "deadline_s": 3.0,
        },
    )
    assert (
        cli.main(
            [
                "control",
                "--signal",
                str(ev),
                "--basis",
                "measured",
                "--period-s",
                "0.1",
                "--state-dir",
                str(tmp_path / "st"),
                "--mv-out",
                str(tmp_path / "mv"),
                "--duration-s",
                "7",
            ]
        )
        == 0
    )
    ts = read_csv(tmp_path / "mv" / "timeseries.csv")
    t = ts["t_s"].to_numpy()
    caps = ts[["cap_w:job0", "cap_w:job1"]].to_numpy()
    drawn = np.minimum(caps[:-1], 650.0)  # the fake GPUs draw 650 W uncapped
    shed = np.clip(drawn - caps[1:], 0, None).sum(1)
    rise = np.clip(caps[1:] - caps[:-1], 0, None).sum(1)  # a cap raised by x: at most x more
    allow = ramp_w_per_s * np.diff(t) + 2 * 5.0  # + one 5 W cap step per GPU (rounding)
    assert (shed <= allow).all() and (rise <= allow).all(), (shed.max(), rise.max(), allow.min())
    assert shed.sum() >= 390 - 10 and rise.max() > 0  # it did cut ~390 W and come back
    after = ts[ts["t_s"] > 4.0]
    assert len(after) > 1 and (after["cap_w:job0"].iloc[-1], after["cap_w:job1"].iloc[-1]) == (
        700.0,
        700.0,
    )
    rec = read_json(tmp_path / "mv" / "mv.json")["events"][0]
    assert rec["target_w"] == pytest.approx(910.0) and rec["deadline_met"]
    assert rec["seconds_above_target_after_deadline"] == 0
    assert limits_w() == [700.0, 700.0]
