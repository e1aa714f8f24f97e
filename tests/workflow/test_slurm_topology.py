"""A grid event on a site of 2 racks x 2 nodes, on the local SLURM (its partition "topo",
tests/slurm_cluster.py: four nodes, one FAKE GPU each, FAKE NVML through
tests/fakes/pynvml_path, 650 W per GPU uncapped, 700 W maximum limit).

The site file puts nodes 5-6 in rack r1 (0.9 kW) and nodes 7-8 in rack r2 (1.4 kW). A 30 %
event on the nominal basis (4 x 700 W) asks the site for 1960 W: an equal split would give
each rack 980 W, above r1's limit, and r1's two GPUs draw 1300 W uncapped, so r1 binds
before, during and after the event. ``wattflex cluster-control --site`` with one four-node
job: in every period in which all four agents answer, no rack is above its limit (the load
each agent measured on its fake GPU), ramps included (the event ramps at 50 W/s both ways),
and the site target is met after the deadline; every cap is restored after."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.slurm_cluster import nodes_of, partition
from wattflex.provenance import read_json

from .test_slurm_grid import fake_gpu_env, limits, running_job

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PARTITION = "topo"
NODES = nodes_of(PARTITION)
RACK_KW = {"r1": 0.9, "r2": 1.4}


@pytest.fixture(scope="module")
def four_nodes(tmp_path_factory):
    return partition(tmp_path_factory, PARTITION)


def site_file(tmp: Path) -> Path:
    doc = {
        "site": "topo",
        "limit_kw": 2.8,
        "feeds": [
            {
                "name": "a",
                "limit_kw": 2.8,
                "pdus": [
                    {
                        "name": "p1",
                        "limit_kw": 2.8,
                        "racks": [
                            {"name": "r1", "limit_kw": RACK_KW["r1"], "nodes": NODES[:2]},
                            {"name": "r2", "limit_kw": RACK_KW["r2"], "nodes": NODES[2:]},
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp / "site.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_no_rack_above_its_limit_in_any_period_and_the_site_target_met_fake_nvml(
    four_nodes, tmp_path
):
    target_w = 0.7 * 4 * 700.0
    assert (
        RACK_KW["r1"] * 1000 < target_w / 2 < 2 * 650.0
    )  # r1's limit is tighter than its site share
    env = fake_gpu_env(tmp_path, NODES, 1)
    job = running_job(tmp_path, env, PARTITION, 4, 1, 500)
    try:
        events = tmp_path / "events.csv"
        # 25 s for the four agents to start, the event ramps down at 50 W/s (17 s from 2800 W
        # nominal) within its 30 s deadline, 15 s past it, then the ramp back and the restore
        events.write_text(
            "event_id,start_s,end_s,fraction,ramp_kw_per_s,deadline_s\nev30,25,70,0.7,0.05,30\n"
        )
        run = subprocess.run(
            [
                "wattflex",
                "cluster-control",
                "--signal",
                str(events),
                "--budget-dir",
                str(tmp_path / "budgets"),
                "--duration-s",
                "90",
                "--period-s",
                "2",
                "--partition",
                PARTITION,
                "--basis",
                "nominal",
                "--site",
                str(site_file(tmp_path)),
                "--mv-out",
                str(tmp_path / "mv"),
                "--agent-state-dir",
                str(tmp_path / "caps-{node}"),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=400,
        )
        logs = "\n".join(
            p.read_text()[-2000:] for p in sorted((tmp_path / "budgets").glob("*.agent.log"))
        )
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{logs}"
        assert run.stdout.count("agent for job") == 4 and "warning" not in run.stderr, run.stderr
        mv = read_json(tmp_path / "mv" / "mv.json")
        ts = pd.read_csv(tmp_path / "mv" / "timeseries.csv", comment="#")
        answering = ts[ts["units_answering"] == 4]
        assert len(answering) >= 30, ts[["t_s", "units_answering"]]
        for rack, kw in RACK_KW.items():  # every period with all four agents answering
            load = answering[f"load_w:rack:{rack}"]
            assert (load <= kw * 1000 + 1e-6).all(), answering[
                ["t_s", "budget_w", f"load_w:rack:{rack}"]
            ]
        r1 = answering["load_w:rack:r1"]
        assert (
            r1.max() >= 0.8 * RACK_KW["r1"] * 1000
        )  # the limit binds: r1 is held near it, not idle
        before = answering[answering["t_s"] < 25]
        assert (
            len(before)
            and (before["load_w:rack:r1"] <= 900.0).all()
            and (before["load_w:rack:r2"] > 1200).all()
        )
        # the site target met after the deadline, r2 taking what r1 could not
        rec = mv["events"][0]
        assert rec["target_w"] == pytest.approx(target_w), rec
        assert (
            rec["worst_w_above_target_after_deadline"] == 0
            and rec["seconds_above_target_after_deadline"] == 0
        )
        assert rec["deadline_met"], rec
        due = answering[(answering["t_s"] >= 55) & (answering["t_s"] < 70)]
        assert len(due) and (due["load_w:rack:r2"] > 0.5 * target_w).all(), due
        # M&V reports every level, none above its limit while all answered
        levels = {lv["level"]: lv for lv in mv["levels"]}
        assert set(levels) >= {"site:topo", "feed:a", "pdu:p1", "rack:r1", "rack:r2"}
        assert (
            levels["rack:r1"]["limit_w"] == 900.0
            and levels["rack:r1"]["events"][0]["periods_above_limit"] == 0
        )
        for node in NODES:  # every cap restored after
            assert limits(tmp_path, node) == [700.0], logs
    finally:
        subprocess.run(["scancel", job], capture_output=True)
