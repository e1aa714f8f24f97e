"""A real controlled run's M&V comes as tables and the figure the cluster simulation draws
(wattflex.ops.services.mv.write_run_mv_report, wattflex.plots.grid.mv_figure): on one node
(``wattflex control`` on FAKE NVML, tests/fakes/fake_pynvml.py: two fake H200s drawing 650 W
each uncapped) and for the cluster coordinator, whose baseline from the curves is the jobs'
campaign curves' uncapped power (a job without a curve: its load before the event)."""

import json
import math

import numpy as np
import pytest

from tests.fakes.nvml_fixture import control_process, fake_nvml, limits_w  # noqa: F401 (fixture)
from tests.unit.ops.test_slurm import _campaign_runs
from wattflex.ops.adapters.slurm import ClusterSplit, SlurmJob, group_curves, write_load
from wattflex.ops.events import Event, Schedule
from wattflex.ops.services.coordinator import CoordinatorHooks, CoordinatorSettings, run_coordinator
from wattflex.ops.services.mv import write_run_mv_report
from wattflex.plots.grid import mv_figure
from wattflex.provenance import read_csv, read_json, read_png_meta

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.fake_gpu
def test_wattflex_control_writes_the_mv_figure_beside_its_tables_fake_nvml(fake_nvml, tmp_path):
    ev = tmp_path / "events.json"
    ev.write_text(
        json.dumps(
            {
                "events": [
                    {
                        "event_id": "ev30",
                        "start_s": 1.0,
                        "end_s": 2.5,
                        "fraction": 0.7,
                        "deadline_s": 1.0,
                    }
                ]
            }
        )
    )
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
        str(tmp_path / "mv"),
    )
    assert proc.wait(timeout=90) == 0, proc.stderr.read()
    out = proc.stdout.read()
    assert f"wrote {tmp_path / 'mv'}/mv.json and {tmp_path / 'mv' / 'mv.png'}" in out
    png = tmp_path / "mv" / "mv.png"
    assert png.read_bytes()[:8] == PNG and png.stat().st_size > 20_000
    assert read_png_meta(png)["event_id"] == "ev30"
    ts = read_csv(tmp_path / "mv" / "timeseries.csv")
    # the curve baseline of one node: its jobs' uncapped power, measured before the first cap
    assert ts["baseline_curves_w"].to_numpy() == pytest.approx(np.full(len(ts), 1300.0), abs=1.0)
    rec = read_json(tmp_path / "mv" / "mv.json")["events"][0]
    assert rec["baseline_curves_w"] == pytest.approx(1300.0, abs=1.0)
    assert limits_w() == [700.0, 700.0]


def coordinate(tmp_path, split):
    """Two jobs' units answering with 1300 W each from their load files (no agents: the
    loads stay), a 30 % event from 0.3 s to 0.8 s, the coordinator every 0.1 s."""
    jobs = [SlurmJob("41", "flex", {"node0": (0, 1)}), SlurmJob("45", "other", {"node1": (0, 1)})]
    tmp_path.mkdir()
    for u in ("41.node0", "45.node1"):
        write_load(tmp_path / f"{u}.load.json", u, 1300.0, [650.0, 650.0])
    sched = Schedule((Event("ev30", 0.3, 0.8, fraction=0.7, deadline_s=0.2),))
    rec = run_coordinator(
        CoordinatorSettings(
            sched,
            "measured",
            tmp_path,
            1.0,
            0.1,
            min_w=200.0,
            max_w=700.0,
            stale_s=30.0,
            split=split,
        ),
        CoordinatorHooks(lambda: jobs, lambda j, n: None),
    )
    return rec, sched


@pytest.mark.parametrize("policy", ["equal-weight", "oracle"])
def test_the_cluster_baseline_from_the_curves_is_the_jobs_uncapped_power(tmp_path, policy):
    """Job 41 is campaign group 'flex' (2 GPUs drawing 95 % of a 700 W cap uncapped: 1330 W);
    job 45 has no curve and is counted at its load before the event (1300 W). Whatever the
    split policy, --curves gives the baseline; both baselines are in the M&V and its figure."""
    split = ClusterSplit(policy, group_curves(_campaign_runs()))
    rec, sched = coordinate(tmp_path / "b", split)
    assert rec.baseline_curves_w == pytest.approx([2 * 0.95 * 700 + 1300.0] * len(rec.t_s))
    assert rec.baseline_by_unit == {
        "41.node0": "curve of group flex",
        "45.node1": "no curve: its load before the event",
    }
    recs = write_run_mv_report(
        tmp_path / "mv",
        rec,
        sched,
        30.0,
        rec.baseline_curves_w,
        {"policy": policy},
        2600.0,
        "cluster-control",
        mv_figure,
    )
    on_disk = read_json(tmp_path / "mv" / "mv.json")["events"][0]
    for r in (recs[0], on_disk):
        assert r["baseline_curves_w"] == pytest.approx(2630.0)
        assert r["baseline_pre_event_w"] == pytest.approx(2600.0)
        assert r["target_w"] == pytest.approx(0.7 * 2600.0)
    png = tmp_path / "mv" / "mv.png"
    assert png.read_bytes()[:8] == PNG and read_png_meta(png)["event_id"] == "ev30"


def test_without_curves_the_cluster_baseline_from_the_curves_is_null(tmp_path):
    rec, sched = coordinate(tmp_path / "b", ClusterSplit())
    assert all(math.isnan(b) for b in rec.baseline_curves_w)
    write_run_mv_report(
        tmp_path / "mv",
        rec,
        sched,
        30.0,
        rec.baseline_curves_w,
        {},
        2600.0,
        "cluster-control",
        mv_figure,
    )
    doc = json.loads((tmp_path / "mv" / "mv.json").read_text())
    assert doc["events"][0]["baseline_curves_w"] is None
    assert doc["events"][0]["baseline_pre_event_w"] == pytest.approx(2600.0)
    assert (tmp_path / "mv" / "mv.png").is_file()


def test_cluster_control_records_what_each_units_curve_baseline_was(tmp_path):

    from wattflex.ops.services.coordinator import mv_params

    rec, _ = coordinate(
        tmp_path / "b", ClusterSplit("equal-weight", group_curves(_campaign_runs()))
    )
    params = mv_params({"policy": "equal-weight", "curves": "runs.parquet"}, rec)
    assert params["baseline_curves_by_unit"]["41.node0"] == "curve of group flex"
    assert "split_curve_by_unit" not in params
