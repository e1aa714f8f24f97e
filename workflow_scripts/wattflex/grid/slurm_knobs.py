"""The knob menu's SLURM actions (issue 39 item 2): pause and checkpoint-and-requeue a job.

- **pause**: ``scontrol suspend JOB`` stops every process of the job (SIGSTOP: GPUs idle,
  memory kept); ``scontrol resume JOB`` continues them where they stopped.
- **requeue**: ``scontrol requeue JOB`` ends the running job and puts it back in the queue
  (the job must be requeueable: ``sbatch --requeue``); when it starts again, the harness
  with ``resume`` on (:class:`wattflex.runs.training.config.TrainConfig`) goes on from its
  newest complete checkpoint (:func:`wattflex.runs.training.checkpoint.latest`).

:func:`apply` carries out a knob choice (:func:`wattflex.allocation.knobs.choose`'s table,
``job`` -> SLURM job id through ``job_ids``); :func:`end_event` resumes the paused jobs.
Caps and clock locks are the agents' (``wattflex control``), which restore them as ever.
"""

from __future__ import annotations

import subprocess
from typing import Mapping

import pandas as pd

ACTIONS = {"pause": "suspend", "resume": "resume", "requeue": "requeue"}


class KnobActionError(RuntimeError):
    """scontrol refused an action."""


def scontrol(action: str, job_id: str, timeout_s: float = 30.0) -> None:
    """``scontrol <suspend|resume|requeue> JOB``; raises :class:`KnobActionError` naming the job."""
    verb = ACTIONS[action]
    run = subprocess.run(["scontrol", verb, str(job_id)], capture_output=True, text=True, timeout=timeout_s)
    if run.returncode != 0:
        raise KnobActionError(f"scontrol {verb} {job_id}: {(run.stderr or run.stdout).strip() or 'failed'}")


def job_state(job_id: str) -> str:
    """The job's state as squeue shows it (RUNNING, SUSPENDED, PENDING...; '' once gone)."""
    out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip()


def apply(choice: pd.DataFrame, job_ids: Mapping[str, str]) -> dict[str, str]:
    """Pause or requeue each job of ``choice`` whose knob is one of them; returns job -> action."""
    done = {}
    for job, knob in zip(choice["job"], choice["knob"]):
        if knob in ("pause", "requeue"):
            scontrol(knob, job_ids[job])
            done[job] = knob
    return done


def end_event(done: Mapping[str, str], job_ids: Mapping[str, str]) -> None:
    """At the event's end: resume every paused job (requeued ones start again by themselves)."""
    for job, action in done.items():
        if action == "pause":
            scontrol("resume", job_ids[job])
