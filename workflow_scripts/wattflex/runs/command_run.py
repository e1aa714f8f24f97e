"""One real run at one cap of the user's own, unmodified training command.

Where it sits: a group with a ``command:`` key (``group.command``, or ``group_defaults.command``
for every group) on the ``backend: cuda`` campaign. Not a third backend, because the backend
says where the measurements come from (an emulator or real GPUs) and everything ``backend:
cuda`` means applies unchanged to a user's job: the ``cuda.*`` keys for caps
(``cap_control``, ``cap_command``, ``state_dir``), the NVML/GPM sampler, RAPL, NCCL's
environment; run.json's ``backend: cuda`` is what the real-run guard
(``runs.protection``), the code fingerprints (``fingerprint.REAL_BACKEND``: never
fingerprinted) and the analysis key on, so a measured command run is as protected as a
harness run without a branch anywhere. Per group, not in ``cuda.``, because a campaign's
groups are different jobs (models, parallelism), each with its own launch line. Only what is
launched and where throughput comes from change: ``launch`` replaces ``-m
wattflex.runs.training``, a throughput source (``wattflex.runs.throughput``) replaces the
harness's step log.

``group.command`` keys:

* ``launch``: the command as a list of words, run without a shell; placeholders ``{gpus}``
  (the group's GPUs), ``{nodes}``, ``{nproc_per_node}``, ``{run_dir}`` (the run's directory,
  for the job's outputs), ``{cap_w}``, ``{duration_s}`` (run.duration_s), ``{seed}``, ``{group}``;
* ``throughput``: ``preset`` | ``regex`` | ``steps_file`` and their factors (throughput module);
* ``env``: extra environment variables (values with the same placeholders);
* ``grace_s`` (default 120): the command must end by itself within ``run.duration_s +
  grace_s`` (make its step count fit ``{duration_s}``); past that it is stopped, and the
  run fails "ran past its time limit".

What happens: before any cap, the program is looked up (``shutil.which`` or the path) and
the template filled; then, as a harness run (``real_run.run_node``), the GPUs are capped
inside ``caps.CapGuard`` (restored on every path), a ``knob: clock`` run's SM clock is locked
inside ``real_run.clock_guard`` (reset on every path), the sampler runs, and the command starts
in its own session with its output in ``train.log`` (``real_run.start_training``, with
``PYTHONUNBUFFERED=1`` so Python jobs' lines arrive as they are printed); a reader follows
train.log and timestamps each matched line (``LineFollower``). The command is stopped with
``real_run.terminate`` (its whole process tree) on every exit path. The run fails, caps
restored, with an error that says which: the command exited with status N, ran past its time
limit, or printed no throughput line. Output files as a harness run's, through
``real_run.assemble``. One node (the job may launch more itself; only this node's GPUs are
capped and measured): ``cuda.nnodes`` > 1 is refused.
"""

from __future__ import annotations

import math
import os
import shutil
import string
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wattflex.provenance import provenance, write_json, write_parquet
from wattflex.runs.devices import caps
from wattflex.runs.real_run import NodeSetup, first_on_interrupt, start_training, terminate, utc_now
from wattflex.runs.spec import RunSpec
from wattflex.runs.throughput import ThroughputSource, read_steps_file, steps_from_lines
from wattflex.runs.training.train_config import LIVE_STEPS_FILE, RESULT_FILE, STEPS_FILE

PLACEHOLDERS = (
    "gpus",
    "nodes",
    "nproc_per_node",
    "run_dir",
    "cap_w",
    "duration_s",
    "seed",
    "group",
)
DEFAULT_GRACE_S = 120.0
FOLLOW_POLL_S = 0.05  # how often train.log is read: a line's time is late by at most this


class CommandError(RuntimeError):
    """The user's command failed; the message says how (status, time limit, no throughput)."""


def placeholders(
    spec: dict[str, Any] | RunSpec, run_dir: Path, cap_w: float | None = None
) -> dict[str, str]:
    """The values a command's launch and env templates may name (``{gpus}``, ``{nodes}``,
    ``{nproc_per_node}``, ``{run_dir}``, ``{cap_w}`` in W or "" when uncapped, ``{duration_s}``,
    ``{seed}``, ``{group}``), as text.
    """
    spec = RunSpec.of(spec)
    group, opts = spec.group, spec.options
    cap = spec.cap_w if cap_w is None else cap_w
    return {
        "gpus": str(group.get("gpus", 1)),
        "nodes": str(opts.nnodes),
        "nproc_per_node": str(opts.nproc_per_node),
        "run_dir": str(run_dir),
        "cap_w": f"{float(cap):g}" if cap is not None else "",
        "duration_s": f"{spec.duration_s:g}",
        "seed": str(spec.seed),
        "group": str(group.get("id", "")),
    }


def fill(words: list[str], values: dict[str, str], where: str = "command.launch") -> list[str]:
    """The template's words with their placeholders filled; an unknown one is an error."""
    out = []
    for k, word in enumerate(words):
        names = [f for _, f, _, _ in string.Formatter().parse(word) if f is not None]
        unknown = [n for n in names if n not in values]
        if unknown:
            raise ValueError(
                f"{where}[{k}] {word!r}: unknown placeholder {{{unknown[0]}}}; "
                f"known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
            )
        out.append(word.format(**values))
    return out


def program_path(program: str, cwd: Path | None = None) -> str | None:
    """Where ``program`` is: on PATH (a bare name) or the file a path names; None if neither."""
    if os.sep in program:
        p = Path(program) if Path(program).is_absolute() or cwd is None else cwd / program
        return str(p) if p.is_file() and os.access(p, os.X_OK) else None
    return shutil.which(program)


def check_command(
    cmd: dict[str, Any],
    where: str,
    group: dict[str, Any],
    cwd: Path | None = None,
    look_up: bool = True,
) -> ThroughputSource:
    """What can be checked of ``group.command`` before any run: the template's placeholders,
    the throughput source and (``look_up``) that the program exists here."""
    launch = cmd.get("launch") or []
    fill(list(launch), {p: "x" for p in PLACEHOLDERS}, f"{where}.launch")
    fill(list((cmd.get("env") or {}).values()), {p: "x" for p in PLACEHOLDERS}, f"{where}.env")
    src = ThroughputSource.from_spec(
        cmd.get("throughput") or {},
        f"{where}.throughput",
        group.get("seq_len"),
        int(group.get("gpus", 1)),
    )
    if look_up and program_path(str(launch[0]), cwd) is None:
        raise FileNotFoundError(
            f"{where}.launch[0]: program {launch[0]!r} not found (not on PATH, or not an "
            f"executable file); give its full path or install it on this node"
        )
    return src


class LineFollower:
    """Follows a growing log file in a thread: each complete line (ended by \\n or \\r, as
    tqdm's bars are) that the throughput source matches (a ``LineReader``: a bar's redraw is
    no new step) is kept with the time it was read
    (seconds since ``t0``); ``rows`` so far, ``lines`` read. With ``live_path``, matched
    lines of each read are also appended there as one step row, the row ``steps()`` makes of
    them (the one-run sweep's live step log)."""

    def __init__(
        self, path: Path, source: ThroughputSource, t0: float, live_path: Path | None = None
    ) -> None:
        self.path, self.source, self.t0, self.live_path = path, source, t0, live_path
        self._reader = source.reader()
        self.rows: list[tuple[float, float, float, float]] = []
        self.lines = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="wattflex-line-follower", daemon=True
        )
        self._pos, self._rest = 0, b""
        self._live_rows = 0
        if live_path is not None:
            live_path.write_text("step,t_end_s,tokens,loss\n")

    def start(self) -> LineFollower:
        """Read what the log holds already, then follow it in the thread. Returns itself."""
        self._read()  # what the log holds already: a reader that starts late sees it at once
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following and read what the job wrote last (waits for the thread)."""
        self._stop.set()
        self._thread.join()
        self._read()  # what the job wrote last

    def _run(self) -> None:
        while not self._stop.wait(FOLLOW_POLL_S):
            self._read()

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                chunk = f.read()
        except FileNotFoundError:
            return
        if not chunk:
            return
        t_s = time.time() - self.t0
        self._pos += len(chunk)
        parts = (self._rest + chunk).replace(b"\r", b"\n").split(b"\n")
        self._rest = parts.pop()
        hits = 0
        for raw in parts:
            self.lines += 1
            hit = self._reader.parse(raw.decode("utf-8", "replace"))
            if hit is not None:
                self.rows.append((t_s, *hit))
                hits += 1
        if hits and self.live_path is not None:
            self._write_live(hits)

    def _write_live(self, hits: int) -> None:
        """One live row for the ``hits`` lines of this read, as ``steps()`` merges them: a row
        per line would give lines read together the same time, steps of no duration, a median
        step of 0 s, and every real step counted as a stall (the staircase then saw no step)."""
        last = steps_from_lines(self.rows[-(hits + 1) :]).iloc[
            -1
        ]  # the previous read's line, then this read's
        self._live_rows += 1
        step = (
            last["step"] if math.isfinite(self.rows[-1][1]) else self._live_rows
        )  # as steps() numbers them
        with open(self.live_path, "a") as f:
            f.write(
                f"{float(step):g},{float(last['t_end_s'])!r},{float(last['tokens'])!r},{float(last['loss'])!r}\n"
            )

    def steps(self) -> pd.DataFrame:
        """The matched lines as a step table (``step, t_end_s, tokens, loss``; tokens from the
        throughput each line reports).
        """
        return steps_from_lines(list(self.rows))


def steps_table(
    cmd: dict[str, Any],
    source: ThroughputSource,
    follower: LineFollower | None,
    run_dir: Path,
    t0: float,
) -> pd.DataFrame:
    """The run's steps (``STEP_COLUMNS`` + ``step_time_s``) from the log lines or the job's steps file."""
    if source.steps_file:
        path = run_dir / source.steps_file
        steps = read_steps_file(path, t0) if path.is_file() else steps_from_lines([])
    else:
        steps = follower.steps()
    gaps = steps["t_end_s"].diff()
    return steps.assign(step_time_s=gaps.fillna(gaps.median() if gaps.notna().any() else np.nan))


def no_throughput_error(
    source: ThroughputSource, follower: LineFollower | None, log_path: Path, run_dir: Path
) -> CommandError:
    """The error for a run that yielded no throughput: its steps file stayed empty, or none of its
    output lines matched the throughput source (the log's last ten lines quoted).
    """
    if source.steps_file:
        return CommandError(
            f"the command wrote no step to its steps file {run_dir / source.steps_file} "
            f"(command.throughput.steps_file; see {log_path})"
        )
    return CommandError(
        f"the command printed no throughput line: none of its {follower.lines} output lines "
        f"matched {source.name} (command.throughput; see {log_path}, its end:)\n"
        + "\n".join(log_path.read_text(errors="replace").splitlines()[-10:])
    )


def exit_error(rc: int, log_path: Path) -> CommandError:
    """The error for a command that exited with status ``rc``, quoting the log's last 15 lines."""
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
    return CommandError(f"the command exited with status {rc} (see {log_path}; its end:)\n{tail}")


class CommandJob:
    """The user's command on this node, prepared before any cap (``open``): the filled launch,
    its environment, the throughput source and a ``NodeSetup`` (GPUs, RAPL, facts)."""

    def __init__(self, spec: RunSpec, outdir: Path, t0: float, cap_w: float | None = None) -> None:
        self.spec, self.outdir, self.t0 = spec, Path(outdir), t0
        self.cmd = spec.command
        self.opts = spec.options
        if self.opts.nnodes > 1:
            raise ValueError(
                f"group {spec.group_id}: a command run caps and measures one node; "
                f"set cuda.nnodes: 1 (got {self.opts.nnodes})"
            )
        where = f"group {spec.group_id}: command"
        self.source = check_command(self.cmd, where, spec.group, look_up=False)
        if self.source.steps_file and spec.sweep != "separate":
            raise ValueError(
                f"{where}.throughput.steps_file: sweep: {spec.sweep} reads the throughput while "
                f"the job runs, from its log lines: give a preset or regex, or use sweep: separate"
            )
        values = placeholders(spec, self.outdir, cap_w)
        launch = fill(list(self.cmd["launch"]), values, f"{where}.launch")
        program = program_path(launch[0])
        if program is None:
            raise FileNotFoundError(
                f"{where}.launch[0]: program {launch[0]!r} not found on this node "
                f"(PATH={os.environ.get('PATH', '')}); nothing was capped"
            )
        self.launch = [program, *launch[1:]]
        self.env = {
            "PYTHONUNBUFFERED": "1",
            **dict(
                zip(
                    self.cmd.get("env", {}),
                    fill(list(self.cmd.get("env", {}).values()), values, f"{where}.env"),
                )
            ),
        }
        self.time_limit_s = spec.duration_s + float(self.cmd.get("grace_s", DEFAULT_GRACE_S))
        self.node = NodeSetup.open(spec, self.outdir, t0, launch=self.launch)
        self.node.env = {**self.node.env, **self.env}
        self.follower: LineFollower | None = None

    def start(self, live: bool = False) -> tuple[subprocess.Popen, LineFollower | None]:
        """Start the command with its log, and (unless it writes a steps file) a follower of its output
        lines, also writing the live step log when ``live``. Returns (the process, the follower or
        None).
        """
        follower = None
        if not self.source.steps_file:
            live_path = None
            if live:
                live_path = self.outdir / LIVE_STEPS_FILE
            follower = LineFollower(self.node.log_path, self.source, self.t0, live_path).start()
        return start_training(self.node.cmd, self.node.log_path, self.node.env), follower

    def start_live(self) -> subprocess.Popen:
        """Start for a one-run sweep: matched lines also go to the live step log the
        controller reads (``steps.live.csv``); ``self.follower`` follows them."""
        proc, self.follower = self.start(live=True)
        return proc

    def write_sweep_outputs(self, training: Any) -> None:
        """After a one-run sweep: the command's steps and record for ``real_run.assemble``."""
        self.follower.stop()
        steps = steps_table(self.cmd, self.source, self.follower, self.outdir, self.t0)
        self.write_outputs(
            steps,
            self.training_record(training.proc.returncode, self.follower, stopped=training.stopped),
        )

    def training_record(
        self, rc: int | None, follower: LineFollower | None, stopped: bool
    ) -> dict[str, Any]:
        """The ``training`` record of run.json for this command: the launch and its template, the env,
        exit status ``rc``, whether wattflex stopped it, the throughput source, lines read and matched.
        """
        return {
            "launch": "command",
            "command": self.launch,
            "command_template": list(self.cmd["launch"]),
            "command_env": self.env,
            "exit_status": rc,
            "stopped_by_wattflex": stopped,
            "throughput": self.source.describe(),
            "lines_read": follower.lines if follower else None,
            "lines_matched": len(follower.rows) if follower else None,
            "time_limit_s": self.time_limit_s,
            "events": [],
        }

    def write_outputs(self, steps: pd.DataFrame, training: dict[str, Any]) -> None:
        """The files ``real_run.assemble`` merges, as the harness leaves them."""
        prov = provenance(params=self.spec.raw, backend="cuda")
        write_parquet(
            steps,
            self.outdir / STEPS_FILE,
            prov,
            tokens=f"job tokens per step, from the command's throughput ({self.source.name})",
        )
        write_json({"training": training}, self.outdir / RESULT_FILE, prov)


def run_command(spec: dict[str, Any] | RunSpec, outdir: str | Path) -> None:
    """``spec``'s run of the group's own command (module docstring); writes what ``real_run.run_real`` writes."""
    from wattflex.runs.real_run import assemble, clock_guard

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    spec = RunSpec.of(spec)
    start_utc, t0 = utc_now(), time.time()
    job = CommandJob(spec, outdir, t0)
    node, opts = job.node, job.opts
    guard = caps.CapGuard(
        node.gpus,
        spec.cap_w,
        opts.cap_control if node.gpus else "observe",
        opts.state_dir,
        opts.cap_command,
    )
    rc, sampler, follower, timed_out = None, None, None, False
    with guard, clock_guard(spec.clock_mhz, node.gpus, opts) as clock:
        if clock is not None:  # knob: clock: the SM clock locked (reset on every path)
            node.facts["clock_lock"] = clock.record()
        node.facts["gpus_after_set"] = [g.describe() for g in node.gpus]
        if opts.sampler and node.gpus:
            sampler = node.sampler().start()
        proc = None
        try:
            with first_on_interrupt(
                lambda: guard.restore(keep_handlers=True)
            ):  # caps back within KillWait
                proc, follower = job.start()
                try:
                    rc = proc.wait(job.time_limit_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
        finally:
            if proc is not None:
                terminate(proc)
            if follower is not None:
                follower.stop()
            if sampler is not None:
                sampler.stop()
        node.facts["gpus_before_restore"] = [g.describe() for g in node.gpus]
    node.finish(guard, sampler)
    if timed_out:
        raise CommandError(
            f"the command ran past its time limit of {job.time_limit_s:g} s (run.duration_s + "
            f"command.grace_s) and was stopped; make it end sooner (fewer steps) "
            f"(see {node.log_path})"
        )
    if rc != 0:
        raise exit_error(rc, node.log_path)
    steps = steps_table(job.cmd, job.source, follower, outdir, t0)
    if steps.empty:
        raise no_throughput_error(job.source, follower, node.log_path, outdir)
    if len(steps) < 2:
        raise CommandError(
            f"the command printed only one throughput line: a rate needs two (see {node.log_path})"
        )
    job.write_outputs(steps, job.training_record(rc, follower, stopped=False))
    assemble(
        spec, outdir, opts, [node.facts], t0, start_utc, utc_now(), extra={"launch": "command"}
    )
