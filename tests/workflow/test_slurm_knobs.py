"""The knob menu's pause and requeue on the local SLURM (issue 39 item 2; partition "knobs",
tests/slurm_cluster.py): two real harness jobs (tiny Llama, CPU), a deep event the caps cannot
meet, the menu's choice carried out with scontrol: one job suspended (its steps stop) and
resumed (they go on), the other checkpointed, requeued and restarted from its checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from wattflex.allocation import knobs as kn
from wattflex.grid import slurm_knobs
from wattflex.runs.training.config import TrainConfig

from tests.slurm_cluster import partition

from .conftest import REPO
from tests.unit.runs.training.test_training import tiny_cfg

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
    jobs = [kn.Job("paused", curve, idle_w=100, restart_s=600, checkpoint_write_s=1, since_checkpoint_s=0),
            kn.Job("requeued", curve, idle_w=100, restart_s=10, checkpoint_write_s=1, since_checkpoint_s=0,
                   max_pause_s=60)]
    event = kn.Event(depth_w=0.9 * 2000, duration_s=600, notice_s=30)
    assert not kn.choose(jobs, event, ("cap",)).feasible
    choice = kn.choose(jobs, event)
    assert dict(zip(choice.table["job"], choice.table["knob"])) == {"paused": "pause", "requeued": "requeue"}

    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow_scripts"), "OMP_NUM_THREADS": "1"}
    ids, outdirs = {}, {}
    for name in ("paused", "requeued"):
        out = tmp_path / name
        out.mkdir()
        cfg = tiny_cfg("Llama-3.1-70B", "pt", out, max_steps=None, duration_s=240, checkpoint_at_s=1.0,
                       keep_checkpoint=True, checkpoint_async=False, resume=True, cpu_binding=False)
        cfg.to_json(out / "cfg.json")
        ids[name] = subprocess.run(
            ["sbatch", "--parsable", "--requeue", "--open-mode=append", "--ntasks=1", "--mem=2000", "--time=10",
             f"--partition={PARTITION}", f"--output={out}/job.out",
             "--wrap", f"{sys.executable} -m wattflex.runs.training --config {out / 'cfg.json'}"],
            capture_output=True, text=True, env=env, check=True).stdout.strip()
        outdirs[name] = out
    try:
        for name in ids:   # both training, the requeued one past its checkpoint
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
        assert steps_of(outdirs["paused"])[:len(held)] == held    # the same run went on: nothing lost
    finally:
        for job in ids.values():
            subprocess.run(["scancel", job], capture_output=True)
