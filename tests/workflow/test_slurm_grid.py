"""A grid event across the local SLURM cluster (its two-node partition "grid", tests/slurm_cluster.py,
two fake GPUs per node: FAKE NVML, tests/fakes/fake_pynvml.py through tests/fakes/pynvml_path, one
state file per node, 650 W per GPU uncapped): one real two-node job, ``wattflex
cluster-control`` learns it from ``squeue --json``, starts an ``srun --overlap`` agent on each
node, follows a 30 % event with a 30 s deadline; its M&V (tables and figure, the baseline from
the job's campaign curve and from the load before the event) has 0 W above target after the
deadline and every cap is restored after."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.prometheus_server import prometheus
from tests.slurm_cluster import nodes_of, partition
from wattflex.ops.services.dashboard import api, check_dashboard, markdown_table
from wattflex.provenance import read_json, read_png_meta

from .conftest import REPO
from .test_slurm_multinode import fake_gpus

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PARTITION = "grid"
NODES = nodes_of(PARTITION)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    return partition(tmp_path_factory, PARTITION)


def limits(tmp: Path, node: str) -> list[float]:
    return [
        g["limit_mw"] / 1000 for g in json.loads((tmp / f"gpus-{node}.json").read_text())["gpus"]
    ]


def fake_gpu_env(tmp: Path, nodes: list[str], n_gpus: int) -> dict[str, str]:
    """The environment of a cluster-control run whose agents see ``n_gpus`` FAKE GPUs per node."""
    template = fake_gpus(tmp, n_gpus=n_gpus, nodes=nodes)
    return {
        **os.environ,
        "FAKE_PYNVML_STATE": template,
        "WATTFLEX_STATE_DIR": str(tmp / "caps"),
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "tests" / "fakes" / "pynvml_path"), str(REPO / "workflow_scripts")]
        ),
    }


def running_job(
    tmp: Path, env: dict[str, str], partition_name: str, nodes: int, gpus: int, mem_mb: int
) -> str:
    """A ``sleep 600`` job on ``nodes`` nodes of the partition holding ``gpus`` GPUs each, once RUNNING."""
    job = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--nodes={nodes}",
            "--ntasks-per-node=1",
            f"--gres=gpu:{gpus}",
            f"--mem={mem_mb}",
            "--time=10",
            f"--partition={partition_name}",
            f"--output={tmp}/job.out",
            "--wrap",
            "sleep 600",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.strip()
    deadline = time.time() + 60
    while time.time() < deadline:
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
        ).stdout
        if state.strip() == "RUNNING":
            return job
        time.sleep(0.5)
    subprocess.run(["scancel", job], capture_output=True)
    raise AssertionError(f"job {job} not RUNNING after 60 s ({state.strip()})")


def test_a_30pct_event_with_a_30s_deadline_across_two_nodes_fake_nvml(two_nodes, tmp_path):
    env = fake_gpu_env(tmp_path, NODES, 2)
    job = running_job(tmp_path, env, PARTITION, 2, 2, 1000)
    try:
        # the job's campaign curve: 4 GPUs drawing 640 W each uncapped (95 % of a cap below 675 W)
        caps = [300.0, 400.0, 500.0, 600.0, 700.0]
        (tmp_path / "runs.csv").write_text(
            "group,gpus,cap_w,power_w,tokens_per_s\n"
            + "".join(
                f"llama-ft,4,{c},{4 * min(0.95 * c, 640.0)},{1000 * min(0.95 * c, 640.0) / 640.0}\n"
                for c in caps
            )
        )
        events = tmp_path / "events.csv"
        # 25 s for both agents to start and report (the basis), 15 s of the event past its deadline,
        # 15 s after it for the restore
        events.write_text(
            "event_id,start_s,end_s,fraction,ramp_kw_per_s,deadline_s\nev30,25,70,0.7,,30\n"
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
                "85",
                "--period-s",
                "2",
                "--partition",
                PARTITION,  # the other partitions' tests run GPU jobs too
                "--mv-out",
                str(tmp_path / "mv"),
                "--curves",
                str(tmp_path / "runs.csv"),
                "--job-map",
                f"{job}=llama-ft",
                # both nodes are this machine: a cap state folder each (a real node has its own)
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
        assert run.stdout.count("agent for job") == 2 and "warning" not in run.stderr
        rec = read_json(tmp_path / "mv" / "mv.json")["events"][0]
        # the basis is the load of the last period before the event (both agents answering);
        # the minute before it may hold periods where an agent had not started, counted uncapped
        assert rec["target_w"] == pytest.approx(0.7 * 4 * 650.0), rec
        assert 4 * 650.0 <= rec["baseline_pre_event_w"] <= 2 * 1300.0 + 200, rec
        assert (
            rec["worst_w_above_target_after_deadline"] == 0
            and rec["seconds_above_target_after_deadline"] == 0
        )
        assert rec["deadline_met"] and rec["restore_time_s"] is not None, rec
        # the baseline from the curves: the job's curve uncapped, 4 x 640 W, beside the pre-event one
        assert rec["baseline_curves_w"] == pytest.approx(4 * 640.0), rec
        png = tmp_path / "mv" / "mv.png"  # and the M&V figure the simulation gets
        assert (
            png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            and read_png_meta(png)["event_id"] == "ev30"
        )
        for node in NODES:  # every cap restored after
            assert limits(tmp_path, node) == [700.0, 700.0], logs
    finally:
        subprocess.run(["scancel", job], capture_output=True)


def test_a_site_wide_event_is_watched_through_a_real_prometheus_fake_nvml(two_nodes, tmp_path):
    """cluster-control's site metrics and every agent's (one per node, each on a free port,
    found through the file_sd file it writes) scraped by Debian's Prometheus with the shipped
    prometheus.yml; every query of the dashboard answered, its legends as drawn."""
    env = fake_gpu_env(tmp_path, NODES, 2)
    job = running_job(tmp_path, env, PARTITION, 2, 2, 1000)
    events = tmp_path / "events.csv"
    events.write_text("event_id,start_s,end_s,fraction\nev,15,60,0.7\n")
    budgets = tmp_path / "budgets"
    proc = subprocess.Popen(
        ["wattflex", "cluster-control", "--signal", str(events), "--budget-dir", str(budgets)]
        + ["--duration-s", "70", "--period-s", "1", "--partition", PARTITION]
        + ["--agent-state-dir", str(tmp_path / "caps-{node}"), "--metrics-port", "0"]
        + ["--agent-metrics-addr", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        site = proc.stdout.readline().split("metrics at http://", 1)[1].split("/")[0]
        targets = budgets / "prometheus-targets.json"
        with prometheus(tmp_path / "prom", {"wattflex-site": [site]}, file_sd=targets) as url:
            deadline = time.time() + 120
            while True:  # both agents scraped, and the event on for 10 s
                up = api(url, "/api/v1/query", {"query": 'sum(up{job="wattflex"})'})["result"]
                on = api(
                    url, "/api/v1/query", {"query": "sum_over_time(wattflex_site_event_active[1m])"}
                )
                if (
                    up
                    and float(up[0]["value"][1]) == 2
                    and on["result"]
                    and float(on["result"][0]["value"][1]) >= 10
                ):
                    break
                assert time.time() < deadline and proc.poll() is None, proc.stderr.read()
                time.sleep(1)
            doc = json.loads((REPO / "resources" / "grafana" / "wattflex.json").read_text())
            checked = check_dashboard(url, doc)
        assert proc.wait(timeout=200) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=120)
        subprocess.run(["scancel", job], capture_output=True)
    table = markdown_table(checked)
    # the agents read no throughput (cluster-control offers no policy that needs it): NaN
    bad = [c for c in checked if c.problems and c.query.where != "panel Job throughput"]
    assert not bad, table
    legends = {c.query.where: sorted(c.legends) for c in checked}
    assert legends["variable hpc_job"] == [job] and legends["variable node"] == sorted(NODES)
    units = next(c for c in checked if c.query.where == "panel Units answering (cluster-control)")
    assert dict(zip(units.legends, units.values)) == {"answering": 2, "silent": 0}, table
    for node in NODES:  # every cap restored after
        assert limits(tmp_path, node) == [700.0, 700.0]
