"""The workflow on a real SLURM: a one-node partition of the session's SLURM on localhost
(tests/slurm/cluster.sh, tests/slurm_cluster.py) and the real executor plugin with the shipped profile (profiles/slurm), overridden only
where the test node differs (2 CPUs, no accounting). Its GPUs are fake character devices
that SLURM schedules like GPUs; nothing runs on them (the runs use the emulated backend).

One sweep of the tiny campaign, during which a running run is scancel'ed, answers: is every
run one SLURM job with its group's GPUs, do runs wait for GPUs another run holds, do runs of
a group go one at a time, is the cancelled run retried, and is the PFI table the one a local
run of the same config gives. A second scenario holds 7 of the node's 8 GPUs with a plain
job and checks that a 2-GPU run waits for them although CPUs are free.
"""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.slurm_cluster import Partition, partition
from wattflex.config import expand_runs, load_config
from wattflex.provenance import read_parquet

from .conftest import REPO, snakemake

NODE_GPUS = 8
PARTITION = "single"  # this module's partition of the session's cluster (tests/slurm_cluster.py)
pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def slurm_args(partition: str) -> list[str]:
    """The shipped profile, with what the test nodes lack overridden (CLI options replace the
    profile's), jobs sent to ``partition``."""
    return [
        "--profile",
        "profiles/slurm",
        "--default-resources",
        f"slurm_partition='{partition}'",
        "mem_mb=100",
        "runtime=10",
        "--set-resources",
        "run_at_cap:cpus_per_task=1",
        "run_at_cap:mem_mb=200",
        "--slurm-no-account",
        # No accounting on the test cluster: poll with squeue (its MinJobAge is 600 s).
        "--slurm-status-command",
        "squeue",
        "--slurm-init-seconds-before-status-checks",
        "2",
        "--latency-wait",
        "5",
        "--jobs",
        "4",
    ]


SLURM_ARGS = slurm_args(PARTITION)


def squeue(fmt: str = "%i|%T|%r|%S|%e|%k", partition: str = PARTITION) -> list[list[str]]:
    """All jobs of ``partition`` the controller still knows (running, pending and ended within MinJobAge)."""
    out = subprocess.run(
        ["squeue", "--states=all", f"--partition={partition}", "--noheader", f"--format={fmt}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.split("|") for line in out.splitlines() if line.strip()]


def job_field(jobid: str, name: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", jobid], capture_output=True, text=True, check=True
    ).stdout
    return next((kv.split("=", 1)[1] for kv in out.split() if kv.startswith(f"{name}=")), "")


def node_field(node: str, name: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", "node", "-o", node], capture_output=True, text=True, check=True
    ).stdout
    return next((kv.split("=", 1)[1] for kv in out.split() if kv.startswith(f"{name}=")), "")


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory) -> Partition:
    """This module's partition: one node with 8 fake GPUs."""
    return partition(tmp_path_factory, PARTITION)


@dataclass
class Sweep:
    work: Path
    local: Path
    jobs: pd.DataFrame  # one row per SLURM job of this sweep
    snapshots: list[list[list[str]]]  # squeue polls taken while it ran
    cancelled: dict[str, str] = field(default_factory=dict)  # SLURM job id -> comment
    wall_s: float = 0.0


class Watcher(threading.Thread):
    """Polls squeue while the sweep runs; scancels the first run it sees running."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.snapshots: list[list[list[str]]] = []
        self.cancelled: dict[str, str] = {}

    def run(self):
        while not self.stop.is_set():
            snap = squeue("%i|%T|%r|%k")
            self.snapshots.append(snap)
            running = [j for j in snap if j[1] == "RUNNING" and j[3].startswith("rule_run_at_cap")]
            if running and not self.cancelled:
                jobid, comment = running[0][0], running[0][3]
                time.sleep(0.5)  # let the job get into its run
                if subprocess.run(["scancel", jobid], capture_output=True).returncode == 0:
                    self.cancelled[jobid] = comment
            time.sleep(0.3)


@pytest.fixture(scope="module")
def sweep(slurm_cluster, tmp_path_factory, tiny_config) -> Sweep:
    """The tiny campaign once through SLURM (one run scancel'ed) and once locally."""
    work = tmp_path_factory.mktemp("slurm-sweep")
    local = tmp_path_factory.mktemp("local-sweep")
    targets = ["results/tiny/pfi.parquet", "results/tiny/missing_runs.csv"]
    before = {j[0] for j in squeue()}
    # The local reference runs alongside (one core): the SLURM sweep mostly waits on jobs.
    local_error: list[BaseException] = []

    def run_local():
        try:
            snakemake(*targets, "--cores", "1", "--configfile", str(tiny_config), cwd=local)
        except BaseException as exc:  # reported by the test, not lost in the thread
            local_error.append(exc)

    local_thread = threading.Thread(target=run_local)
    local_thread.start()
    watcher = Watcher()
    watcher.start()
    t0 = time.monotonic()
    try:
        snakemake(*targets, *SLURM_ARGS, "--configfile", str(tiny_config), cwd=work, timeout=420)
    finally:
        wall = time.monotonic() - t0
        watcher.stop.set()
        watcher.join()
        local_thread.join()
    if local_error:
        raise local_error[0]
    jobs = pd.DataFrame(
        [j for j in squeue() if j[0] not in before],
        columns=["jobid", "state", "reason", "start", "end", "comment"],
    )
    print(f"SLURM sweep of the tiny campaign: {wall:.0f} s, {len(jobs)} SLURM jobs")
    return Sweep(work, local, jobs, watcher.snapshots, watcher.cancelled, wall)


def expected_run_comments(tiny_config) -> set[str]:
    runs = expand_runs(load_config(tiny_config, base=REPO))
    return {f"rule_run_at_cap_wildcards_{r['group']}_{r['run_id']}" for r in runs}


def test_every_run_is_one_slurm_job_with_its_groups_gpus(sweep, tiny_config, slurm_cluster):
    completed = sweep.jobs[sweep.jobs["state"] == "COMPLETED"]
    assert set(completed["comment"]) == expected_run_comments(tiny_config)
    assert not completed["comment"].duplicated().any()
    # Only runs go to SLURM; summaries, PFI and figures are local rules.
    assert sweep.jobs["comment"].str.startswith("rule_run_at_cap_").all()
    run = yaml.safe_load(tiny_config.read_text())["run"]
    run_min = -(-(run["duration_s"] + run["gap_s"]) // 60)
    for jobid, comment in zip(completed["jobid"], completed["comment"]):
        assert job_field(jobid, "TresPerJob") == f"gres:gpu:h200:{NODE_GPUS}"  # gpu + gpu_model
        assert job_field(jobid, "NumNodes") == "1"
        attempt = 2 if comment in sweep.cancelled.values() else 1
        # Time limit: the run's length plus the profile's 20-min margin per attempt.
        assert job_field(jobid, "TimeLimit") == f"00:{run_min + 20 * attempt:02d}:00"
    # The shipped epilog ran after every job and never drained the node.
    ran = set(slurm_cluster.epilog_ran.read_text().split())
    assert set(sweep.jobs["jobid"]) <= ran
    assert node_field(slurm_cluster.nodes[0], "State") in ("IDLE", "MIXED")


def test_runs_wait_for_gpus_another_run_holds(sweep):
    ran = sweep.jobs[sweep.jobs["start"] != "N/A"].sort_values("start")
    spans = [(ts(s), ts(e)) for s, e in zip(ran["start"], ran["end"])]
    # 8-GPU runs on an 8-GPU node never overlap although its 2 CPUs would fit two...
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end
    # ...because a queued run waited for resources while another one ran.
    waited = [
        snap
        for snap in sweep.snapshots
        if any(j[1] == "RUNNING" for j in snap if j[0] in set(ran["jobid"]))
        and any(
            j[1] == "PENDING" and j[2] == "Resources"
            for j in snap
            if j[3].startswith("rule_run_at_cap")
        )
    ]
    assert waited


def test_runs_of_a_group_go_one_at_a_time(sweep):
    def group(comment):
        return comment.removeprefix("rule_run_at_cap_wildcards_").rsplit("_cap", 1)[0]

    queued_together = 0
    for snap in sweep.snapshots:
        active = [
            group(j[3])
            for j in snap
            if j[1] in ("PENDING", "RUNNING") and j[3].startswith("rule_run_at_cap")
        ]
        assert len(active) == len(set(active)), f"two runs of one group queued at once: {active}"
        queued_together = max(queued_together, len(active))
    assert queued_together >= 2  # different groups were queued side by side


def test_scancelled_run_is_retried_and_leaves_nothing_behind(sweep):
    assert len(sweep.cancelled) == 1
    ((jobid, comment),) = sweep.cancelled.items()
    row = sweep.jobs.set_index("jobid").loc[jobid]
    assert row["state"] == "CANCELLED"
    later = sweep.jobs[
        (sweep.jobs["comment"] == comment) & (sweep.jobs["jobid"].astype(int) > int(jobid))
    ]
    assert list(later["state"]) == ["COMPLETED"]
    run_dir = (
        sweep.work
        / "results/tiny/runs"
        / comment.removeprefix("rule_run_at_cap_wildcards_").replace("_cap", "/cap")
    )
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "run.json",
        "steps.parquet",
        "summary.json",
        "telemetry.parquet",
    ]
    leftovers = [p for p in (sweep.work / "results/tiny/runs").rglob(".cap*")]
    assert not leftovers, f"temporary run directories left behind: {leftovers}"
    assert pd.read_csv(sweep.work / "results/tiny/missing_runs.csv").empty


def test_pfi_table_equals_local_run(sweep):
    for name in ("runs.parquet", "pfi.parquet"):
        on_slurm = read_parquet(sweep.work / "results/tiny" / name)
        local = read_parquet(sweep.local / "results/tiny" / name)
        pd.testing.assert_frame_equal(on_slurm, local)
    pfi = read_parquet(sweep.work / "results/tiny/pfi.parquet")
    assert pfi["pfi_ratio"].notna().all() and len(pfi) == 3


def test_two_gpu_run_waits_while_another_job_holds_the_gpus(slurm_cluster, tmp_path, tiny_config):
    """7 of 8 GPUs held by a plain job: a 2-GPU run (GPU model asked as a node feature this
    time) stays pending although a CPU is free, and starts once the holder ends."""
    cfg = yaml.safe_load(tiny_config.read_text())
    group = {**cfg["groups"][0], "id": "dense-pt-mistral24b-x2", "gpus": 2}
    cfg.update(groups=[group], repeats=[])
    config = tmp_path / "x2.yaml"
    config.write_text(yaml.safe_dump(cfg))
    release = tmp_path / "release"
    holder = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--partition={PARTITION}",
            f"--gpus={NODE_GPUS - 1}",
            "-o",
            "/dev/null",
            "--wrap",
            f"while [ ! -e {release} ]; do sleep 0.2; done",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    work = tmp_path / "work"
    work.mkdir()
    result: list = []
    sweep_thread = threading.Thread(
        target=lambda: result.append(
            snakemake(
                f"results/tiny/runs/{group['id']}/cap700/run.json",
                *SLURM_ARGS,
                "--config",
                "slurm_gpu_model=constraint",
                "--configfile",
                str(config),
                cwd=work,
                check=False,
                timeout=240,
            )
        )
    )
    sweep_thread.start()
    try:
        deadline = time.monotonic() + 120
        waiting = None
        while time.monotonic() < deadline and waiting is None:
            jobs = {j[0]: j for j in squeue("%i|%T|%r|%k")}
            runs = [
                j
                for j in jobs.values()
                if j[3].startswith(f"rule_run_at_cap_wildcards_{group['id']}")
            ]
            if (
                runs
                and runs[0][1] == "PENDING"
                and runs[0][2] == "Resources"
                and jobs[holder][1] == "RUNNING"
            ):
                waiting = runs[0][0]
            time.sleep(0.3)
        assert waiting, "the 2-GPU run never waited behind the job holding 7 GPUs"
        time.sleep(2)  # still waiting a while later, with a CPU free all along
        assert {j[0]: j[1] for j in squeue("%i|%T")}[waiting] == "PENDING"
        node = slurm_cluster.nodes[0]
        assert int(node_field(node, "CPUAlloc")) < int(node_field(node, "CPUTot"))
        assert job_field(waiting, "TresPerJob") == "gres:gpu:2"
        assert job_field(waiting, "Features") == "h200"
    finally:
        release.touch()
        sweep_thread.join()
    assert result and result[0].returncode == 0, result[0].stderr[-3000:] if result else "no result"
    ended = {j[0]: j for j in squeue("%i|%T|%S|%e")}
    assert ended[waiting][1] == "COMPLETED"
    assert ts(ended[waiting][2]) >= ts(ended[holder][3])
