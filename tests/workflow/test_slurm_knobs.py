"""The knob menu's pause and requeue on the local SLURM (partition "knobs",
tests/slurm_cluster.py): two jobs that step like the harness (tests/fakes/stepping_sleeper.py),
a deep event the caps cannot meet, the menu's choice carried out with scontrol: one job
suspended (its steps stop) and resumed (they go on), the other checkpointed, requeued and
restarted from its checkpoint.

The second test does it through ``wattflex cluster-control --knob-choice`` on FAKE NVML GPUs
(tests/fakes/fake_pynvml.py via tests/fakes/pynvml_path, the node's state in one file): one
job's agent caps, the other job runs with its SM clock locked by the real ClockGuard
(tests/fakes/clock_locked_run.py); the caps and clock locks are checked during and after the
event, and nothing is left capped or locked at the end. The third puts a job on the menu's
``clock``: cluster-control's agent locks it for the event only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.fakes import fake_pynvml
from tests.slurm_cluster import partition
from tests.workflow.test_slurm_multinode import fake_gpus
from wattflex.allocation import knobs as kn
from wattflex.ops.adapters import slurm_knobs

from .conftest import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PARTITION = "knobs"


@pytest.fixture(scope="module")
def knobs_partition(tmp_path_factory):
    return partition(tmp_path_factory, PARTITION)


def steps_of(outdir: Path) -> list[int]:
    live = outdir / "steps.live.csv"
    if not live.exists():
        return []
    return [int(line.split(",")[0]) for line in live.read_text().splitlines()[1:] if line.strip()]


# The jobs step by sleeping (tests/fakes/stepping_sleeper.py): the harness's own steps, checkpoint
# and resume are tests/unit/runs/training/test_training.py's; here the SLURM side is checked
# (suspend stops the steps, a requeue restarts the job from its checkpoint), and a real tiny
# training for the minutes the test follows it took a core per job (~440 s summed under load).
STAND_IN = REPO / "tests" / "fakes" / "stepping_sleeper.py"


def wait(what, predicate, timeout_s: float = 120.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_pause_and_requeue_by_the_menu_on_slurm(knobs_partition, tmp_path):
    # the menu: caps cannot reach a 90 % cut; "paused" may pause, "requeued" may not for so long
    curve = (np.array([300.0, 1000.0]), np.array([60.0, 100.0]))
    jobs = [
        kn.Job(
            "paused", curve, idle_w=100, restart_s=600, checkpoint_write_s=1, since_checkpoint_s=0
        ),
        kn.Job(
            "requeued",
            curve,
            idle_w=100,
            restart_s=10,
            checkpoint_write_s=1,
            since_checkpoint_s=0,
            max_pause_s=60,
        ),
    ]
    event = kn.Event(depth_w=0.9 * 2000, duration_s=600, notice_s=30)
    assert not kn.choose(jobs, event, ("cap",)).feasible
    choice = kn.choose(jobs, event)
    assert dict(zip(choice.table["job"], choice.table["knob"])) == {
        "paused": "pause",
        "requeued": "requeue",
    }

    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow_scripts"), "OMP_NUM_THREADS": "1"}
    ids, outdirs = {}, {}
    for name in ("paused", "requeued"):
        out = tmp_path / name
        out.mkdir()
        ids[name] = subprocess.run(
            [
                "sbatch",
                "--parsable",
                "--requeue",
                "--open-mode=append",
                "--ntasks=1",
                "--mem=2000",
                "--time=10",
                f"--partition={PARTITION}",
                f"--output={out}/job.out",
                "--wrap",
                f"{sys.executable} {STAND_IN} {out}",
            ],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout.strip()
        outdirs[name] = out
    try:
        for name in ids:  # both training, the requeued one past its checkpoint
            wait(f"{name} steps", lambda: len(steps_of(outdirs[name])) >= 3, 180)
        ck = outdirs["requeued"] / "checkpoint"
        wait("the checkpoint", lambda: list(ck.glob("step*/.metadata")))
        done = slurm_knobs.apply(choice.table, ids)
        assert done == {"paused": "pause", "requeued": "requeue"}
        # paused: SUSPENDED, and no step ends while it is
        wait("suspended", lambda: slurm_knobs.job_state(ids["paused"]) == "SUSPENDED", 30)
        held = steps_of(outdirs["paused"])
        time.sleep(4)
        assert steps_of(outdirs["paused"]) == held
        # requeued: restarted, and on from its checkpoint's step
        ck_step = int(sorted(ck.glob("step*/.metadata"))[0].parent.name[4:])
        log = outdirs["requeued"] / "job.out"
        wait("the restart", lambda: f"resumed from step {ck_step}" in log.read_text(), 240)
        wait("steps after the restart", lambda: len(steps_of(outdirs["requeued"])) >= 2, 120)
        assert steps_of(outdirs["requeued"])[0] == ck_step + 1
        slurm_knobs.end_event(done, ids)
        assert wait("running again", lambda: slurm_knobs.job_state(ids["paused"]) == "RUNNING", 30)
        wait("steps after the resume", lambda: len(steps_of(outdirs["paused"])) > len(held) + 1, 60)
        assert (
            steps_of(outdirs["paused"])[: len(held)] == held
        )  # the same run went on: nothing lost
    finally:
        for job in ids.values():
            subprocess.run(["scancel", job], capture_output=True)


def fake_state(template: str, node: str) -> list[dict]:
    return json.loads(Path(template.replace("{node}", node)).read_text())["gpus"]


def fake_env(template: str, tmp_path: Path, **extra: str) -> dict:
    """The environment of the jobs and cluster-control: FAKE pynvml first on PYTHONPATH."""
    fakes = REPO / "tests" / "fakes"
    return {
        **os.environ,
        "FAKE_PYNVML_STATE": template,
        "WATTFLEX_STATE_DIR": str(tmp_path / "caps"),
        **extra,
        "PYTHONPATH": os.pathsep.join(
            [str(fakes / "pynvml_path"), str(REPO / "workflow_scripts"), str(REPO)]
        ),
    }


def cluster_control(tmp_path: Path, env: dict, duration_s: float) -> subprocess.Popen:
    """``wattflex cluster-control`` over the partition, the event in ``tmp_path/events.csv`` and the
    choice in ``tmp_path/choice.csv``; budgets, M&V and agent records under ``tmp_path``."""
    return subprocess.Popen(
        [
            "wattflex",
            "cluster-control",
            "--signal",
            str(tmp_path / "events.csv"),
            "--budget-dir",
            str(tmp_path / "budgets"),
            "--duration-s",
            f"{duration_s:g}",
            "--period-s",
            "2",
            "--partition",
            PARTITION,
            "--knob-choice",
            str(tmp_path / "choice.csv"),
            "--mv-out",
            str(tmp_path / "mv"),
            "--agent-state-dir",
            str(tmp_path / "agent-caps"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def agent_logs(tmp_path: Path) -> str:
    return "\n".join(
        p.read_text()[-2000:] for p in sorted((tmp_path / "budgets").glob("*.agent.log"))
    )


def records_left(tmp_path: Path) -> list[str]:
    """Cap and clock records left by the jobs and the agents (none once all is restored)."""
    return [
        p.name
        for d in (tmp_path / "caps", tmp_path / "agent-caps")
        if d.exists()
        for p in d.glob("*.json")
    ]


def test_cluster_control_carries_out_the_menus_choice_caps_and_clocks_right_fake_nvml(
    knobs_partition, tmp_path
):
    """An 80 % event (deeper than the caps' floor, 2 x 200 W of 2 x 650 W) over two stepping jobs of
    one FAKE GPU each: the menu pauses one, requeues the other (held to the event's end, then
    restarted from its checkpoint). Each job is its GPU's user (tests/fakes/gpu_user.py), so the
    FAKE GPUs read idle power while one job is stopped and the other gone: the site target is met
    after the deadline by what the coordinator charges and by what NVML reads. The clock-locked
    job's lock is released while it is off the node and back when it runs again; at the end no
    GPU is capped or locked and no cap or clock record is left."""
    node = knobs_partition.nodes[0]
    template = fake_gpus(tmp_path, n_gpus=2, nodes=[node])
    curve = (np.array([200.0, 650.0]), np.array([60.0, 100.0]))  # per job: 1 GPU, floor 200 W
    # a requeued job's GPU stays powered, at idle (75 W, as the FAKE GPU reads it), on the node
    jobs = [
        kn.Job(
            "paused",
            curve,
            idle_w=75,
            restart_s=600,
            checkpoint_write_s=1,
            since_checkpoint_s=0,
            requeue_residual_w=75,
        ),
        kn.Job(
            "requeued",
            curve,
            idle_w=75,
            restart_s=10,
            checkpoint_write_s=1,
            since_checkpoint_s=0,
            max_pause_s=20,
            requeue_residual_w=75,
        ),
    ]
    event = kn.Event(depth_w=0.85 * 1300, duration_s=40, notice_s=30)
    assert not kn.choose(jobs, event, ("cap",)).feasible  # caps alone cannot
    choice = kn.choose(jobs, event)
    assert dict(zip(choice.table["job"], choice.table["knob"])) == {
        "paused": "pause",
        "requeued": "requeue",
    }
    choice.table.to_csv(tmp_path / "choice.csv", index=False)

    fakes = REPO / "tests" / "fakes"
    env = fake_env(template, tmp_path, OMP_NUM_THREADS="1")
    ids, outdirs = {}, {}
    for name in ("paused", "requeued"):
        out = tmp_path / name
        out.mkdir()
        train = f"{sys.executable} {STAND_IN} {out}"
        # each job the user of its FAKE GPU: the GPU idles while the job is stopped or gone
        wrap = f"{sys.executable} {fakes / 'gpu_user.py'} " + (
            train
            if name == "paused"
            else f"{sys.executable} {fakes / 'clock_locked_run.py'} 1200 {train}"
        )
        ids[name] = subprocess.run(
            [
                "sbatch",
                "--parsable",
                "--requeue",
                "--open-mode=append",
                "--ntasks=1",
                "--gres=gpu:1",
                "--mem=2000",
                "--time=15",
                f"--job-name={name}",
                f"--partition={PARTITION}",
                f"--output={out}/job.out",
                "--wrap",
                wrap,
            ],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout.strip()
        outdirs[name] = out
    locks = lambda: [g["locked_mhz"] for g in fake_state(template, node)]  # noqa: E731
    limits = lambda: [g["limit_mw"] / 1000 for g in fake_state(template, node)]  # noqa: E731
    powers = lambda: [fake_pynvml.power_w(g) for g in fake_state(template, node)]  # noqa: E731
    try:
        for name in ids:
            wait(f"{name} steps", lambda: len(steps_of(outdirs[name])) >= 3, 240)
        ck = outdirs["requeued"] / "checkpoint"
        wait("the checkpoint", lambda: list(ck.glob("step*/.metadata")))
        assert sorted(locks(), key=str) == [
            1200,
            None,
        ]  # the clock job's GPU locked, the other free
        # both GPUs busy: 650 W, and 650 x (1200/1980)^2 W locked (tests/fakes/fake_pynvml.py)
        assert sorted(powers()) == [pytest.approx(650 * (1200 / 1980) ** 2, abs=1), 650.0]
        # 20 % of the load before the event (889 W): the two GPUs at idle, 150 W, fit under it
        (tmp_path / "events.csv").write_text(
            "event_id,start_s,end_s,fraction,ramp_kw_per_s,deadline_s\nev80,20,60,0.2,,10\n"
        )
        cc = cluster_control(tmp_path, env, 75)
        # during the event: paused SUSPENDED, requeued held off the node; its clock lock released
        wait("suspended", lambda: slurm_knobs.job_state(ids["paused"]) == "SUSPENDED", 60)
        wait("held", lambda: slurm_knobs.job_state(ids["requeued"]) == "PENDING", 60)
        wait("the lock released", lambda: locks() == [None, None], 45)
        held = steps_of(outdirs["paused"])
        measured = []  # the node's GPUs as NVML reads them, while one job is stopped, one gone
        for _ in range(8):
            measured.append(powers())
            time.sleep(0.5)
        assert (
            steps_of(outdirs["paused"]) == held
            and slurm_knobs.job_state(ids["requeued"]) == "PENDING"
        )
        assert all(m == [75.0, 75.0] for m in measured), measured  # each GPU at its idle power
        assert limits() == [
            700.0,
            700.0,
        ]  # the knobs took the cut: no cap set, the held job's agent restored
        out, err = cc.communicate(timeout=300)
        assert cc.returncode == 0, f"{out}\n{err}\n{agent_logs(tmp_path)}"
        assert (
            "knob: job" in out and "paused" in out and "requeued held" in out and "resumed" in out
        ), out
        rec = json.loads((tmp_path / "mv" / "mv.json").read_text())["events"][0]
        assert rec["worst_w_above_target_after_deadline"] == 0 and rec["deadline_met"], rec
        # the target met by measurement too, not only by what the coordinator charged
        assert max(sum(m) for m in measured) <= rec["target_w"], (measured, rec["target_w"])
        # after: the paused job goes on, the requeued one restarts from its checkpoint, locked again
        assert wait("running again", lambda: slurm_knobs.job_state(ids["paused"]) == "RUNNING", 30)
        wait("steps after the resume", lambda: len(steps_of(outdirs["paused"])) > len(held) + 1, 90)
        assert steps_of(outdirs["paused"])[: len(held)] == held
        ck_step = int(sorted(ck.glob("step*/.metadata"))[0].parent.name[4:])
        wait(
            "the restart",
            lambda: f"resumed from step {ck_step}" in (outdirs["requeued"] / "job.out").read_text(),
            300,
        )
        wait("locked again", lambda: sorted(locks(), key=str) == [1200, None], 60)
        assert limits() == [700.0, 700.0]  # every agent's cap restored
    finally:
        for job in ids.values():
            subprocess.run(["scancel", job], capture_output=True)
    wait(
        "both jobs gone",
        lambda: all(
            slurm_knobs.job_state(j) in ("", "COMPLETED", "CANCELLED") for j in ids.values()
        ),
        90,
    )
    wait("nothing locked", lambda: locks() == [None, None], 60)
    assert limits() == [700.0, 700.0]
    assert records_left(tmp_path) == []


def test_cluster_control_locks_the_clock_the_menu_chose_and_releases_it_fake_nvml(
    knobs_partition, tmp_path
):
    """A 40 % event over one job of one FAKE GPU whose measured clock curve sheds cheaper than its
    caps: the menu puts it on ``clock``; cluster-control's agent locks the GPU at the choice's clock
    (the real ClockGuard through FAKE NVML) for the event only, the site target met by the measured
    load; after it, the lock is reset, the cap restored and no cap or clock record is left."""
    node = knobs_partition.nodes[0]
    template = fake_gpus(tmp_path, n_gpus=2, nodes=[node])
    job = kn.Job(
        "clocked",
        (np.array([200.0, 650.0]), np.array([60.0, 100.0])),
        idle_w=75,
        restart_s=600,
        checkpoint_write_s=1,
        since_checkpoint_s=0,
        clock=(np.array([200.0, 650.0]), np.array([70.0, 100.0])),
        clock_mhz=np.array([1000.0, 1980.0]),
    )
    event = kn.Event(depth_w=0.4 * 650, duration_s=20, notice_s=10)
    choice = kn.choose([job], event)
    (row,) = choice.table.to_dict("records")
    assert row["knob"] == "clock" and row["power_w"] == pytest.approx(390.0)
    mhz = row["clock_mhz"]  # 1000 + 980 x 190/450 MHz, rounded down
    assert mhz == 1413.0
    choice.table.to_csv(tmp_path / "choice.csv", index=False)
    env = fake_env(template, tmp_path)
    job_id = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--ntasks=1",
            "--gres=gpu:1",
            "--mem=500",
            "--time=5",
            "--job-name=clocked",
            f"--partition={PARTITION}",
            f"--output={tmp_path}/job.out",
            "--wrap",
            "sleep 240",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.strip()
    locks = lambda: [g["locked_mhz"] for g in fake_state(template, node)]  # noqa: E731
    limits = lambda: [g["limit_mw"] / 1000 for g in fake_state(template, node)]  # noqa: E731
    try:
        wait("running", lambda: slurm_knobs.job_state(job_id) == "RUNNING", 60)
        (tmp_path / "events.csv").write_text(
            "event_id,start_s,end_s,fraction,ramp_kw_per_s,deadline_s\nev40,14,34,0.6,,6\n"
        )
        cc = cluster_control(tmp_path, env, 42)
        time.sleep(8)  # before the event: the agent runs, nothing locked
        assert locks() == [None, None]
        wait("locked in the event", lambda: sorted(locks(), key=str) == [mhz, None], 30)
        assert list((tmp_path / "agent-caps").glob("clocks-*.json"))  # its record, for the epilog
        out, err = cc.communicate(timeout=180)
        assert cc.returncode == 0, f"{out}\n{err}\n{agent_logs(tmp_path)}"
        assert f"SM clock locked at {mhz:g} MHz" in out and "clock locks of job" in out, out
        rec = json.loads((tmp_path / "mv" / "mv.json").read_text())["events"][0]
        assert rec["worst_w_above_target_after_deadline"] == 0 and rec["deadline_met"], rec
        assert locks() == [None, None] and limits() == [700.0, 700.0]
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
    assert records_left(tmp_path) == []
