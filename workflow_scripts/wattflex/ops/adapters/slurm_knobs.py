"""The knob menu's SLURM actions: pause and checkpoint-and-requeue a job.

- **pause**: ``scontrol suspend JOB`` stops every process of the job (SIGSTOP: GPUs idle,
  memory kept); ``scontrol resume JOB`` continues them where they stopped.
- **requeue**: ``scontrol requeue JOB`` ends the running job and puts it back in the queue
  (the job must be requeueable: ``sbatch --requeue``); when it starts again, the harness
  with ``resume`` on (:class:`wattflex.runs.training.train_config.TrainConfig`) goes on from its
  newest complete checkpoint (:func:`wattflex.runs.training.checkpoint.latest`).

:func:`apply` carries out a knob choice (:func:`wattflex.allocation.knobs.choose`'s table,
``job`` -> SLURM job id through ``job_ids``); :func:`end_event` resumes the paused jobs.
Caps and clock locks are the agents' (``wattflex control``), which restore them as ever.

:class:`KnobPlan` is the same for ``wattflex cluster-control`` (``--knob-choice``): at the event's
start it pauses / requeues the chosen jobs (requeue *held*, ``scontrol requeuehold``: the node stays
free to the event's end, then ``scontrol release`` lets the job start again from its checkpoint),
says what each such job is charged in the cluster load (paused: its GPUs' idle power; requeued:
nothing), and at the end (or however the coordinator stops) resumes and releases them. A job
on ``clock`` (the row's ``clock_mhz``) keeps running: for the event its units' budget files
name that clock, and each unit's agent locks its GPUs there (``ClockGuard``) and resets the
lock when the file names none (the event's end, a restore) or however the agent stops.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from wattflex.ingest.reader import read_csv_named

ACTIONS = {
    "pause": "suspend",
    "resume": "resume",
    "requeue": "requeue",
    "requeuehold": "requeuehold",
    "release": "release",
}


class KnobActionError(RuntimeError):
    """scontrol refused an action."""


def scontrol(action: str, job_id: str, timeout_s: float = 30.0) -> None:
    """``scontrol <suspend|resume|requeue> JOB``; raises :class:`KnobActionError` naming the job."""
    verb = ACTIONS[action]
    run = subprocess.run(
        ["scontrol", verb, str(job_id)], capture_output=True, text=True, timeout=timeout_s
    )
    if run.returncode != 0:
        raise KnobActionError(
            f"scontrol {verb} {job_id}: {(run.stderr or run.stdout).strip() or 'failed'}"
        )


def job_state(job_id: str) -> str:
    """The job's state as squeue shows it (RUNNING, SUSPENDED, PENDING...; '' once gone)."""
    out = subprocess.run(
        ["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True
    )
    return out.stdout.strip()


def apply(choice: pd.DataFrame, job_ids: Mapping[str, str], hold: bool = False) -> dict[str, str]:
    """Pause or requeue each job of ``choice`` whose knob is one of them (``hold``: requeued
    held to :func:`end_event`); returns job -> action. A job not in ``job_ids`` is skipped."""
    done = {}
    for job, knob in zip(choice["job"], choice["knob"]):
        if knob in ("pause", "requeue") and job in job_ids:
            scontrol("requeuehold" if knob == "requeue" and hold else knob, job_ids[job])
            done[job] = knob
    return done


def end_event(done: Mapping[str, str], job_ids: Mapping[str, str], hold: bool = False) -> list[str]:
    """At the event's end: resume every paused job and (``hold``) release the held requeued ones
    (unheld ones start again by themselves). Tries every job; the errors, one per job."""
    errors = []
    for job, action in done.items():
        if action == "pause" or hold:
            try:
                scontrol("resume" if action == "pause" else "release", job_ids[job])
            except (KnobActionError, OSError, subprocess.TimeoutExpired) as exc:
                errors.append(str(exc))
    return errors


def read_choice(path: str | Path) -> pd.DataFrame:
    """A knob choice (``wattflex.allocation.knobs.choose(...).table``, CSV or JSON records) with
    at least ``job`` (SLURM job id or name) and ``knob``."""
    p = Path(path)
    table = (
        pd.read_json(p)
        if p.suffix == ".json"
        else read_csv_named(p, "knob choice", dtype={"job": str})
    )
    missing = {"job", "knob"} - set(table.columns)
    if missing:
        raise ValueError(f"knob choice {p}: needs column(s) {', '.join(sorted(missing))}")
    return with_clocks(table, f"knob choice {p}")


def with_clocks(choice: pd.DataFrame, what: str = "knob choice") -> pd.DataFrame:
    """``choice`` with its ``clock_mhz`` column as numbers (NaN: none); a ``clock`` row without
    a clock > 0 is refused."""
    table = choice.assign(job=choice["job"].astype(str))
    mhz = pd.to_numeric(
        table.get("clock_mhz", pd.Series(float("nan"), table.index)), errors="coerce"
    )
    bad = table["knob"].eq("clock") & ~(mhz > 0)
    if bad.any():
        raise ValueError(
            f"{what}: job(s) {', '.join(table.loc[bad, 'job'])} take the clock knob "
            f"but name no clock_mhz > 0 (the SM clock to lock, MHz)"
        )
    return table.assign(clock_mhz=mhz)


class KnobPlan:
    """The knob choice ``cluster-control`` carries out over one event (module docstring).
    ``idle_w``: one GPU's idle power (what a paused job's GPUs are charged)."""

    def __init__(self, choice: pd.DataFrame, idle_w: float, log: Callable[[str], None] = print):
        self.choice, self.idle_w, self.log = with_clocks(choice), float(idle_w), log
        self.done: dict[str, str] = {}  # job id -> action, while the event lasts
        self.ids: dict[str, str] = {}
        self.requeued: set[str] = set()  # every job id requeued (its agents end with it)
        self.paused: list[Any] = []  # the paused jobs, as discovered at the start
        self.clocks: dict[
            str, float
        ] = {}  # job id -> SM clock its agents lock, while the event lasts

    def start(self, jobs: Sequence[Any]) -> None:
        """At the event's start: pause / requeue (held) the chosen jobs among ``jobs``."""
        self.ids = {}
        for j in jobs:  # by SLURM job id, or by job name
            self.ids.setdefault(j.job_id, j.job_id)
            self.ids.setdefault(j.name, j.job_id)
        done = apply(self.choice, self.ids, hold=True)
        self.done = {self.ids[name]: action for name, action in done.items()}
        self.paused = [j for j in jobs if self.done.get(j.job_id) == "pause"]
        self.requeued |= {job for job, a in self.done.items() if a == "requeue"}
        clock = self.choice[self.choice["knob"].eq("clock") & self.choice["job"].isin(self.ids)]
        self.clocks = {
            self.ids[name]: float(mhz) for name, mhz in zip(clock["job"], clock["clock_mhz"])
        }
        for job, mhz in self.clocks.items():
            self.log(f"knob: job {job} SM clock locked at {mhz:g} MHz by its agents")
        for job, action in self.done.items():
            self.log(
                f"knob: job {job} {'paused (scontrol suspend)' if action == 'pause' else 'requeued held'}"
            )

    def kept(self, listed: Sequence[Any]) -> list[Any]:
        """The paused jobs ``squeue --states=RUNNING`` no longer lists (SUSPENDED): still the
        cluster's, at idle power, their agents stopped with them (not started again)."""
        have = {j.job_id for j in listed}
        return [
            j for j in self.paused if self.done.get(j.job_id) == "pause" and j.job_id not in have
        ]

    def charged_w(self, job: Any, node: str) -> float | None:
        """What a unit of a paused / requeued job is counted at during the event (None: as measured)."""
        action = self.done.get(job.job_id)
        if action is None:
            return None
        return self.idle_w * len(job.gpus[node]) if action == "pause" else 0.0

    def clock_mhz(self, job: Any) -> float | None:
        """The SM clock the job's agents lock during the event (None: no lock)."""
        return self.clocks.get(job.job_id)

    def end(self) -> None:
        """At the event's end (idempotent): resume the paused jobs, release the requeued ones,
        and the clock-locked jobs' agents are told no clock (they reset the locks)."""
        if self.clocks:
            self.log(f"knob: event over, clock locks of job(s) {', '.join(self.clocks)} released")
            self.clocks = {}
        if not self.done:
            return
        done, self.done = self.done, {}
        for err in end_event(done, {j: j for j in done}, hold=True):
            self.log(f"warning: knob: {err}")
        self.log(
            f"knob: event over, {', '.join(f'job {j} ' + ('resumed' if a == 'pause' else 'released') for j, a in done.items())}"
        )
