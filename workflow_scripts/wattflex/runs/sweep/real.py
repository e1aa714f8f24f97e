"""The one-run sweep on real GPUs (``backend: cuda``): one torchrun training run whose NVML
GPUs the sweep controller (``wattflex.runs.sweep.algorithm``) steps through the cap grid.

``PollingRun`` is the live run of real training: it sleeps and polls the NVML telemetry
sampler and the trainer's live step log (``steps.live.csv``); ``GpuSet`` makes a job's NVML
GPUs one device. The controller's ``restored_on_exit`` runs inside ``caps.CapGuard``, which
adds the state file for restores after a SIGKILL. Never fingerprinted
(``wattflex.fingerprint.REAL_BACKEND``), and never imported by the emulated sweep.

Across nodes (``nnodes > 1``) the controller runs where the rule runs (the batch script, on
the allocation's first node) and one node agent per node (``run_sweep_node``, one ``srun``
task each, as ``real_run`` starts them) owns that node's GPUs. The channel is the run
directory, which every node sees (it is on the shared filesystem the workflow needs anyway):
the controller writes each command, numbered, to ``CAP_FILE``; each agent polls it, sets the
cap (or restores) and acknowledges in its node directory (``ACK_FILE``), and publishes its
telemetry so far every sampler period (``LIVE_TELEMETRY_FILE``), which the controller merges
on one time grid (``real_run.align_nodes``). ``NodeAgents`` is the controller's side: one
``CapDevice`` whose ``set_cap`` returns once every node has set the cap. Every agent restores
its GPUs on each of its exit paths (``caps.CapGuard``: normal end, error, SIGTERM from srun
when the controller or another node fails, ``--kill-on-bad-exit``); SIGKILL leaves the state
file for the epilog. Files rather than sockets: nothing to bind or reach between nodes, a
command is never lost when an agent is slow to poll, and a cap change is a few per run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from wattflex.provenance import read_json, strict_json
from wattflex.runs.devices.base import check_cap
from wattflex.runs.devices.caps import CapError, CapGuard, restore_each
from wattflex.runs.real_run import (
    NODE_DIR,
    NodeSetup,
    RunOptions,
    _node_hosts,
    align_nodes,
    assemble,
    first_on_interrupt,
    gpus_per_node,
    node_agent_command,
    node_main,
    rendezvous_endpoint,
    start_training,
    terminate,
    training_error,
    utc_now,
)
from wattflex.runs.runner import atomic_run_dir
from wattflex.runs.spec import RunSpec
from wattflex.runs.sweep.algorithm import (
    CapDevice,
    run_controller,
    separate_sweep_seconds,
    sweep_record,
)
from wattflex.runs.training.train_config import LIVE_STEPS_FILE, STOP_FILE
from wattflex.telemetry import job_series

STOP_GRACE_S = 300.0  # a stop waits for the current step, or an eval/checkpoint in progress
CAP_FILE = ".sweep_cap.json"  # the controller's latest command to the node agents
ACK_FILE = "cap_ack.json"  # in each node directory: the last command carried out
LIVE_TELEMETRY_FILE = "telemetry.live.parquet"  # in each node directory: the node's samples so far
AGENT_POLL_S = 0.1  # how often an agent looks for a command: a cap change waits at most this
ACK_TIMEOUT_S = 120.0  # NVML sets a cap in ms; a cap_command (sudo, a site tool) may take seconds


class GpuSet:
    """A job's GPUs as one ``CapDevice``: the same cap on each (the enforced limit reported
    is the lowest read back); restore tries every GPU and then reports any that failed."""

    def __init__(self, gpus: Sequence[CapDevice]) -> None:
        self.gpus = list(gpus)

    def set_cap(self, cap_w: float) -> float:
        """Cap every GPU at ``cap_w`` W. Returns the lowest enforced limit read back, in W."""
        return min(g.set_cap(cap_w) for g in self.gpus)

    def restore(self) -> None:
        """Put back every GPU's original limit, trying all of them first.

        Raises CapError listing the GPUs that could not be restored.
        """
        errors = restore_each(self.gpus)
        if errors:
            raise CapError("could not restore every power limit: " + "; ".join(errors))


class PollingRun:
    """The live-run hook for real training: wall-clock time, a telemetry source and the
    trainer's step log, read while the job runs.

    ``read_series()`` returns the job-level series so far (``telemetry.job_series`` of the
    sampler's rows), ``read_steps()`` the step log so far (``step, t_end_s, tokens, loss`` on
    the sampler's clock), ``stop_training()`` ends the job. ``device`` is the NVML device
    (or any ``CapDevice``) of the job's GPUs. ``ended()`` (optional) says the job has
    finished by itself (it raises if the job failed): the run then ends now, so the
    controller stops waiting for data that will not come. ``clock``/``sleep`` are
    injectable for tests.
    """

    def __init__(
        self,
        device: CapDevice,
        read_series: Callable[[], pd.DataFrame],
        read_steps: Callable[[], pd.DataFrame],
        stop_training: Callable[[], None],
        max_duration_s: float,
        poll_s: float = 5.0,
        t0: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        ended: Callable[[], bool] | None = None,
    ) -> None:
        self.device, self.poll_s, self.max_duration_s = device, float(poll_s), float(max_duration_s)
        self._read_series, self._read_steps, self._stop = read_series, read_steps, stop_training
        self._clock, self._sleep, self._ended = clock, sleep, ended
        self._t0 = clock() if t0 is None else t0

    @property
    def now_s(self) -> float:
        """Seconds since the run's start, on the injected clock."""
        return self._clock() - self._t0

    def advance(self, dt_s: float) -> None:
        """Sleep ``dt_s`` s (never past the maximum duration); a job that ended by itself ends the run
        now.
        """
        self._sleep(max(0.0, min(dt_s, self.max_duration_s - self.now_s)))
        if self._ended is not None and self._ended():
            self.max_duration_s = min(self.max_duration_s, self.now_s)

    def series(self) -> pd.DataFrame:
        """The job-level telemetry series so far."""
        return self._read_series()

    def steps(self) -> pd.DataFrame:
        """The step log so far."""
        return self._read_steps()

    def stop(self) -> None:
        """End the training job."""
        self._stop()


def read_live_steps(path: str | Path) -> pd.DataFrame:
    """The trainer's live step log so far (``step, t_end_s, tokens, loss``): complete lines
    only, as the last one may be half-written while it is read."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        text = ""
    text = text[: text.rfind("\n") + 1]
    if text.count("\n") < 2:  # header only, or nothing yet
        return pd.DataFrame(
            {c: pd.Series(dtype=float) for c in ("step", "t_end_s", "tokens", "loss")}
        )
    return pd.read_csv(io.StringIO(text))


class _Training:
    """The torchrun training process of a real sweep, seen from the controller."""

    def __init__(self, proc: Any, log_path: Path, outdir: Path) -> None:
        self.proc, self.log_path = proc, log_path
        self.live_path, self.stop_path = outdir / LIVE_STEPS_FILE, outdir / STOP_FILE

    def ended(self) -> bool:
        """True once training has exited by itself; raises with the root cause if it failed."""
        rc = self.proc.poll()
        if rc is not None and rc != 0:
            raise training_error(rc, self.log_path)
        return rc is not None

    def steps(self) -> pd.DataFrame:
        return read_live_steps(self.live_path)

    def request_stop(self) -> None:
        self.stop_path.touch()  # rank 0 ends the loop after the current step and writes its files

    def wait_first_step(self, timeout_s: float, poll_s: float) -> None:
        """Start-up (model load, first step) is paid before the controller's clock starts."""
        deadline = time.monotonic() + timeout_s
        while self.steps().empty and not self.ended():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no training step within {timeout_s:g} s (see {self.log_path})")
            time.sleep(poll_s)

    def finish(self, grace_s: float = STOP_GRACE_S) -> None:
        """Wait for the stopped training to write its outputs; raise if it failed."""
        try:
            rc = self.proc.wait(grace_s)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(
                f"training did not stop within {grace_s:g} s of the stop request "
                f"(see {self.log_path})"
            ) from exc
        if rc != 0:
            raise training_error(rc, self.log_path)


class _CommandTraining(_Training):
    """A group's own command (``wattflex.runs.command_run.CommandJob``) seen from the controller:
    its steps from the live step log its log lines become; a stop ends it (``terminate``: it
    knows no stop file); the errors say how the command failed."""

    def __init__(self, proc: Any, job: Any) -> None:
        super().__init__(proc, job.node.log_path, job.outdir)
        self.job, self.stopped = job, False

    def ended(self) -> bool:
        from wattflex.runs.command_run import exit_error

        if self.stopped:
            return True
        rc = self.proc.poll()
        if rc is not None and rc != 0:
            raise exit_error(rc, self.log_path)
        return rc is not None

    def wait_first_step(self, timeout_s: float, poll_s: float) -> None:
        from wattflex.runs.command_run import CommandError, no_throughput_error

        job = self.job
        try:
            super().wait_first_step(timeout_s, poll_s)
        except CommandError:  # it exited with an error status
            raise
        except RuntimeError as exc:  # no step within the time
            raise no_throughput_error(job.source, job.follower, self.log_path, job.outdir) from exc
        if self.steps().empty:  # ended by itself before any throughput line
            raise no_throughput_error(job.source, job.follower, self.log_path, job.outdir)

    def request_stop(self) -> None:
        self.stopped = True
        terminate(self.proc)

    def finish(self, grace_s: float = 0.0) -> None:
        self.ended()  # a command that failed by itself says so


def _write_atomic(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(strict_json(doc))
    tmp.replace(path)


def _read_doc(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class NodeAgents:
    """The controller's view of a multi-node sweep's node agents: their GPUs as one
    ``CapDevice`` (``set_cap`` returns once every node acknowledged, with the lowest enforced
    limit; ``restore`` asks each to restore now) and their merged live telemetry. ``alive()``
    says the agents still run (srun has not ended): a command to agents that have ended is not
    waited for (a restore: they restored on their way out; a cap: an error)."""

    def __init__(
        self,
        outdir: Path,
        nnodes: int,
        period_s: float,
        alive: Callable[[], bool],
        timeout_s: float = ACK_TIMEOUT_S,
        poll_s: float = 0.05,
    ) -> None:
        self.outdir, self.nnodes, self.period_s, self.alive = Path(outdir), nnodes, period_s, alive
        self.timeout_s, self.poll_s, self.seq = timeout_s, poll_s, 0

    def node_file(self, rank: int, name: str) -> Path:
        """The file ``name`` of node ``rank``'s folder under the run's output."""
        return self.outdir / NODE_DIR.format(rank=rank) / name

    def command(self, **cmd: Any) -> list[dict[str, Any]] | None:
        """Send ``cmd`` to every agent and wait for all acknowledgements (None: the agents ended)."""
        self.seq += 1
        _write_atomic(self.outdir / CAP_FILE, {"seq": self.seq, **cmd})
        deadline = time.monotonic() + self.timeout_s
        while True:
            acks = [_read_doc(self.node_file(r, ACK_FILE)) for r in range(self.nnodes)]
            if all(a is not None and a["seq"] >= self.seq for a in acks):
                break
            if not self.alive():
                return None
            if time.monotonic() > deadline:
                late = [r for r, a in enumerate(acks) if a is None or a["seq"] < self.seq]
                raise CapError(
                    f"node(s) {late} did not carry out {cmd} within {self.timeout_s:g} s"
                )
            time.sleep(self.poll_s)
        errors = [f"node {r}: {a['error']}" for r, a in enumerate(acks) if a.get("error")]
        if errors:
            raise CapError("; ".join(errors))
        return acks

    def set_cap(self, cap_w: float) -> float:
        """Ask every node agent to cap at ``cap_w`` W. Returns the lowest enforced limit the nodes
        acknowledged, in W.

        Raises CapError when the agents ended before acknowledging.
        """
        acks = self.command(cap_w=float(cap_w))
        if acks is None:
            raise CapError(f"the node agents ended before the cap {cap_w:g} W was set")
        return min(float(a["enforced_w"]) for a in acks)

    def restore(self) -> None:
        """Ask every node agent to put its GPUs' limits back now."""
        self.command(restore=True)

    def series(self) -> pd.DataFrame:
        """The job-level series so far: every node's samples on one grid, complete samples only."""
        parts = []
        for r in range(self.nnodes):
            with contextlib.suppress(FileNotFoundError, OSError, ValueError):
                parts.append(pd.read_parquet(self.node_file(r, LIVE_TELEMETRY_FILE)))
        if len(parts) < self.nnodes or any(p.empty for p in parts):
            return job_series(pd.DataFrame(columns=["t_s", "node", "gpu", "power_w"]))
        tel = pd.concat(parts, ignore_index=True)
        n_gpus = len(tel[["node", "gpu"]].drop_duplicates())
        s = job_series(align_nodes(tel, self.period_s))
        return s[s["n_gpus"] == n_gpus].reset_index(drop=True)


def run_sweep_node(
    spec: dict[str, Any] | RunSpec, outdir: Path, t0: float, node_rank: int, rdzv: str
) -> None:
    """One node of a multi-node sweep (an srun task): its GPUs capped at the lowest cap, sampled,
    its torchrun share started; then each command of the controller carried out and
    acknowledged, and the node's telemetry published every sampler period, until training
    ends; its GPUs restored on every exit path; its facts and telemetry in its node directory."""
    spec = RunSpec.of(spec)
    opts = spec.options
    caps, train_spec = _grid(spec)
    node = NodeSetup.open(spec, outdir, t0, node_rank, rdzv, train=train_spec.train_config(outdir))
    _check_grid(node.gpus, caps)
    with _capped_training(node, caps[0]) as (sampler, proc):
        _follow_commands(
            outdir / CAP_FILE,
            node.node_dir,
            GpuSet(node.gpus),
            sampler,
            proc,
            opts.sampler_period_s,
        )
        if proc.wait() != 0:
            raise training_error(proc.returncode, node.log_path)


@contextlib.contextmanager
def _capped_training(
    node: NodeSetup, cap_w: float, start: Callable[[], Any] | None = None
) -> Iterator[tuple[Any, Any]]:
    """A sweep's training on this node: its GPUs at ``cap_w`` (the lowest cap, where the
    staircase starts, so warm-up lands there too) inside ``caps.CapGuard``, the sampler and
    torchrun started; yields (sampler, torchrun process); training stopped, sampler stopped
    and caps restored however the block ends; then the node's facts and telemetry written.
    ``start`` (default: torchrun of ``node``) starts the training and returns its process."""
    opts = node.opts
    guard = CapGuard(node.gpus, cap_w, opts.cap_control, opts.state_dir, opts.cap_command)
    with guard:
        node.facts["gpus_after_set"] = [g.describe() for g in node.gpus]
        sampler = node.sampler().start()
        proc = None
        try:
            with first_on_interrupt(
                lambda: guard.restore(keep_handlers=True)
            ):  # caps back within KillWait
                proc = (
                    start()
                    if start is not None
                    else start_training(node.cmd, node.log_path, node.env)
                )
                yield sampler, proc
        finally:
            if proc is not None:
                terminate(proc)
            sampler.stop()
        node.facts["gpus_before_restore"] = [g.describe() for g in node.gpus]
    node.finish(guard, sampler)


def _follow_commands(
    cap_file: Path, node_dir: Path, gpus: GpuSet, sampler: Any, proc: Any, period_s: float
) -> None:
    """The agent's loop while its training runs: commands in, acknowledgements and telemetry out."""
    seq, next_publish = 0, 0.0
    while proc.poll() is None:
        cmd = _read_doc(cap_file)
        if cmd is not None and cmd["seq"] > seq:
            seq = cmd["seq"]
            try:
                if cmd.get("restore"):
                    enforced = None
                    gpus.restore()
                else:
                    enforced = gpus.set_cap(float(cmd["cap_w"]))
            except Exception as exc:
                _write_atomic(
                    node_dir / ACK_FILE,
                    {"seq": seq, "enforced_w": None, "error": f"{type(exc).__name__}: {exc}"},
                )
                raise
            _write_atomic(node_dir / ACK_FILE, {"seq": seq, "enforced_w": enforced, "error": None})
        if time.monotonic() >= next_publish:
            tmp = node_dir / f"{LIVE_TELEMETRY_FILE}.tmp"
            sampler.frame().to_parquet(tmp)
            tmp.replace(node_dir / LIVE_TELEMETRY_FILE)
            next_publish = time.monotonic() + period_s
        time.sleep(AGENT_POLL_S)


def _grid(spec: RunSpec) -> tuple[list[float], RunSpec]:
    """The cap grid, lowest first, and the training spec: training may run as long as the
    separate sweep would; the controller stops it sooner."""
    return sorted(float(c) for c in spec.caps), spec.with_duration(separate_sweep_seconds(spec))


def _check_grid(gpus: Sequence[Any], caps: list[float]) -> None:
    if not gpus:
        raise RuntimeError("no NVML GPU to sweep")
    for gpu in gpus:  # refuse a bad grid before any cap
        for cap in caps:
            check_cap(gpu, cap)


def _run_multi_node_sweep(
    spec: RunSpec,
    outdir: Path,
    opts: RunOptions,
    caps: list[float],
    separate_s: float,
    start_utc: str,
    t0: float,
) -> None:
    """The controller of a sweep across ``opts.nnodes`` nodes (inside their SLURM allocation)."""
    hosts = _node_hosts()
    if len(hosts) < opts.nnodes:
        raise RuntimeError(
            f"cuda.nnodes is {opts.nnodes} but the SLURM allocation has {len(hosts)} node(s)"
        )
    spec_path = outdir / "spec.json"
    spec_path.write_text(strict_json(spec.raw, indent=2))  # each node agent parses it (node_main)
    cmd = node_agent_command(
        spec_path,
        outdir,
        t0,
        opts.nnodes,
        rendezvous_endpoint(hosts[0]),
        gpus_per_node(spec, opts.nnodes),
        module="wattflex.runs.sweep.real",
    )
    log_path = outdir / "nodes.log"
    proc = start_training(cmd, log_path)
    try:
        training = _Training(proc, log_path, outdir)
        agents = NodeAgents(
            outdir, opts.nnodes, opts.sampler_period_s, alive=lambda: proc.poll() is None
        )
        training.wait_first_step(separate_s, opts.sampler_period_s)
        result = _follow(training, agents, agents.series, spec, caps, separate_s, t0)
    finally:
        terminate(proc)
    nodes = [
        read_json(outdir / NODE_DIR.format(rank=r) / "node.json")["node"]
        for r in range(opts.nnodes)
    ]
    assemble(spec, outdir, opts, nodes, t0, start_utc, utc_now(), extra=sweep_record(spec, result))
    (outdir / CAP_FILE).unlink(missing_ok=True)


def run_real_sweep(spec: dict[str, Any] | RunSpec, outdir: str | Path) -> None:
    """``backend: cuda``: one real training run (torchrun, as ``real_run``) whose NVML GPUs the
    controller steps through the cap grid, reading the sampler's telemetry and the trainer's
    live step log while it runs; training is stopped when the sweep ends. Everything runs
    inside ``caps.CapGuard`` (state file, signals, atexit) around ``restored_on_exit``, so
    the original limits come back on every exit path. Writes telemetry.parquet,
    steps.parquet, run.json (real_run's record + the controller's) and train.log.

    Needs caps that can change (``cuda.cap_control: nvml | command``) and the NVML sampler
    (``cuda.sampler: true``). ``nnodes > 1``: one node agent per node (``run_sweep_node``)
    steered through the run directory (module docstring)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    spec = RunSpec.of(spec)
    opts = spec.options
    if opts.cap_control == "observe" or not opts.sampler:
        raise ValueError(
            f"sweep: {spec.sweep} on the cuda backend steps the GPUs' power caps and reads "
            f"their power: it needs cuda.cap_control nvml or command (got {opts.cap_control}) "
            f"and cuda.sampler: true (got {opts.sampler}); use sweep: separate otherwise"
        )
    caps, train_spec = _grid(spec)
    separate_s = separate_sweep_seconds(spec)
    command = spec.command  # the group's own job (wattflex.runs.command_run)
    if not command:
        train_spec.train_config(outdir).validate()  # missing model/data: fail before any cap
    start_utc, t0 = utc_now(), time.time()
    if opts.nnodes > 1 and not command:
        return _run_multi_node_sweep(spec, outdir, opts, caps, separate_s, start_utc, t0)
    job = None
    if command:
        from wattflex.runs.command_run import CommandJob

        job = CommandJob(train_spec, outdir, t0)  # refuses nnodes > 1; nothing capped yet
        node = job.node
    else:
        node = NodeSetup.open(spec, outdir, t0, train=train_spec.train_config(outdir))
    _check_grid(node.gpus, caps)
    n_gpus = len(node.gpus)
    with _capped_training(node, caps[0], job.start_live if job else None) as (sampler, proc):
        training = _CommandTraining(proc, job) if job else _Training(proc, node.log_path, outdir)
        training.wait_first_step(separate_s, opts.sampler_period_s)

        def series() -> pd.DataFrame:
            s = job_series(sampler.frame())
            return s[s["n_gpus"] == n_gpus].reset_index(drop=True)  # not a sample read half-way

        result = _follow(training, GpuSet(node.gpus), series, spec, caps, separate_s, t0)
    extra = sweep_record(spec, result)
    if job is not None:
        job.write_sweep_outputs(training)
        extra["launch"] = "command"
    assemble(spec, outdir, opts, [node.facts], t0, start_utc, utc_now(), extra=extra)


def _follow(training, gpus, series, spec: RunSpec, caps: list[float], separate_s: float, t0: float):
    """The sweep's controller over the running job: it steps ``gpus``' caps, reading ``series``
    (power) and the job's steps, until the grid is done; then the job is stopped."""
    run = PollingRun(
        gpus,
        series,
        training.steps,
        training.request_stop,
        max_duration_s=separate_s,
        poll_s=spec.options.sampler_period_s,
        t0=t0,
        clock=time.time,
        ended=training.ended,
    )
    result = run_controller(run, spec, caps, separate_s)
    training.finish()
    return result


def write_real_sweep_run(spec: dict[str, Any] | RunSpec, outdir: str | Path) -> Path:
    """``run_real_sweep`` written atomically into ``outdir`` (``runner.atomic_run_dir``):
    telemetry.parquet, steps.parquet, run.json and train.log, or nothing if it fails."""
    with atomic_run_dir(outdir) as tmp:
        run_real_sweep(spec, tmp)
    return Path(outdir)


if __name__ == "__main__":  # the node agents of a multi-node sweep (node_agent_command)
    sys.exit(node_main(run=run_sweep_node, prog="wattflex.runs.sweep.real"))
