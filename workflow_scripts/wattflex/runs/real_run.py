"""One real run at one power cap: caps -> telemetry sampler -> torchrun training -> outputs.

``run_real(spec, outdir)`` is the ``backend: cuda`` side of the ``run_at_cap`` rule. It
writes the files the emulated backend writes:

* ``telemetry.parquet``: one row per GPU per sample, ``TELEMETRY_COLUMNS`` then
  ``devices.base.EXTRA_COLUMNS`` (``clock_event_reasons``; ``host_cpu_w``/``host_dram_w``
  from RAPL, node level, on the row of each node's first GPU and NaN elsewhere).
  Without a sampler (``device: cpu`` smoke runs, ``sampler: false``) the trace is derived
  from the step log: ``gpu_util`` = 100 while training steps run, 0 otherwise (eval,
  checkpoint, start-up), every other field NaN; run.json says ``telemetry.source: steps``.
* ``steps.parquet``: ``step, t_end_s, tokens, loss, step_time_s, tflops, mfu`` from rank 0
  (``tokens`` = job tokens per step; ``t_end_s`` on the telemetry clock: seconds since t0).
* ``run.json``: backend ``cuda``, device model, requested cap, cap_control, original /
  set / enforced limits per GPU (read back after setting and again before restoring),
  start/end wall-clock, the training facts (parameters, FLOPs/token, events), the spec.
* ``train.log``: the torchrun output.

The spec arrives parsed (``wattflex.runs.spec.RunSpec``; a dict is parsed on entry), its
``cuda`` section as ``RunOptions`` and ``TrainConfig``. Spec keys used (``spec["cuda"]``):
device (cuda|cpu), cap_control (nvml|command|observe), cap_command, model_path, data_path,
tiny, sampler, sampler_period_s, gpm (default true), host_power (default true), state_dir,
nproc_per_node, nnodes (default: group.gpus / nproc_per_node on cuda), nccl (``nccl_env``),
max_steps, and training extras (``training.train_config.TrainConfig``). ``run.gap_s`` (the paper's idle pause between runs) is the
rule script's job, not this one.

Multi-node jobs (``nnodes > 1``, inside a SLURM allocation) start one node agent per node with
one ``srun --nodes=N --ntasks-per-node=1 [--gpus-per-node=G]`` step (``node_agent_command``);
each agent caps its node's GPUs, samples them, runs its torchrun share and restores the caps
on its own exit paths; this process merges their traces. That step must be the job's only
one: the rule runs through snakemake-executor-plugin-slurm-jobstep, which wraps a rule in
``srun -n1 --cpu-bind=q --gpus=<all> --nodes=<N>`` unless the rule has an ``mpi`` resource;
on N > 1 nodes that step cannot even start (``-n1`` puts it on one node, which lacks the
group's GPUs: "Invalid generic resource specification", tried on tests/slurm/cluster.sh
``--nodes 2``), and a step nested in it would have to share its resources (``--overlap``).
So ``run_resources()`` (rules/common/resources.smk) gives multi-node runs the plugin's MPI route
(``mpi``, ``tasks`` = nodes): the plugin then runs the rule in the batch script on the
allocation's first node, and this process's srun is the one step, which by SLURM's default
gets all the job's CPUs and memory on each node, and here explicitly its GPUs per node. The
plugin strips ``SLURM_*`` but ``SLURM_JOB_ID`` from the rule's environment, so the node list
is asked of SLURM (``_node_hosts``). Rendezvous: torchrun's c10d on the first node at its
SLURM ``NodeAddr``, on a port free there (this process runs on that node); node rank 0 hosts
the store (``is_host``), so nodes that share an address (the test cluster) cannot both try.
c10d, not SLURM, orders the training ranks (by node address), so global rank 0, which writes
steps and the training record into the shared run directory, may run on any node;
``train.log`` is the first SLURM node's torchrun output, ``train.node<r>.log`` node r's.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psutil

from wattflex.provenance import (
    provenance,
    read_json,
    read_parquet,
    strict_json,
    write_json,
    write_parquet,
)
from wattflex.runs.devices import caps, nvml
from wattflex.runs.devices import dcgm_sampler as dcgm_source
from wattflex.runs.devices.base import TelemetrySampler, telemetry_frame
from wattflex.runs.devices.hostpower import RaplReader
from wattflex.runs.options import RunOptions, gloo_ifname, nccl_env  # noqa: F401 (re-exported: callers import them here)
from wattflex.runs.spec import RunSpec
from wattflex.runs.training.train_config import (
    LIVE_STEPS_FILE,
    RESULT_FILE,
    STEPS_FILE,
    STOP_FILE,
    TrainConfig,
)

log = logging.getLogger("wattflex.runs.real_run")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
NODE_DIR = ".node{rank}"
TERMINATE_GRACE_S = 30.0
RDZV_BASE_PORT = 29400  # torchrun's default c10d port; the fallback port is derived from it


def utc_now() -> str:
    """The time now in UTC, ISO 8601 to the second (``2026-12-07T20:15:48+00:00``)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


# ---- training subprocess -----------------------------------------------------------------------
def training_command(
    config_path: Path,
    t0: float,
    nproc: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv: str | None = None,
    run_id: str = "wattflex",
    local_addr: str | None = None,
) -> list[str]:
    """The torchrun command line that starts ``python -m wattflex.runs.training`` with the config
    at ``config_path`` and the run's start time ``t0`` (epoch s), on ``nproc`` ranks per node.
    """
    return torchrun_command(nproc, nnodes, node_rank, rdzv, run_id, local_addr) + [
        "-m",
        "wattflex.runs.training",
        "--config",
        str(config_path),
        "--t0",
        repr(t0),
    ]


def torchrun_command(
    nproc: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv: str | None = None,
    run_id: str = "wattflex",
    local_addr: str | None = None,
) -> list[str]:
    """torchrun as every node runs it, up to the program: standalone on one node, else c10d at
    ``rdzv`` (also benchmarks/gpu_check.py's all-reduce across nodes)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if nnodes == 1:
        cmd.append("--standalone")
    else:
        # is_host: node rank 0 hosts the c10d store, the others connect (torchrun would
        # otherwise guess from the endpoint's address, and guess "host" on every node that
        # shares it). No --node-rank: c10d ignores it and orders the nodes' training ranks by
        # their addresses itself.
        cmd += [
            f"--nnodes={nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv}",
            f"--rdzv-id={run_id}",
            f"--rdzv-conf=is_host={int(node_rank == 0)}",
        ]
        if local_addr:
            # without it the rendezvous names this node by socket.getfqdn() (torch's
            # dynamic_rendezvous), and rank 0's becomes every worker's MASTER_ADDR: a name
            # that does not resolve to a routable address hangs init
            cmd.append(f"--local-addr={local_addr}")
    return cmd


# Stopping training. torchrun's elastic agent starts every worker in a session of its own
# (SubprocessHandler: Popen(start_new_session=True)), so signalling torchrun's process group
# misses the workers, and once torchrun is gone they are reparented away from it. A worker
# left alive holds its GPU memory and keeps running at a cap that is then restored under it.
# So the run's processes are found three ways: their ancestry (read before any signal),
# torchrun's session, and a tag that every process of the run inherits in its environment
# (torchrun copies its environment into the workers). Not found: a process that leaves the
# session and drops the tag and whose parent died before terminate started (only a cgroup,
# as SLURM's task/cgroup plugin sets up, contains that).
TRAINING_TAG_ENV = "WATTFLEX_TRAINING_TAG"
KILL_WAIT_S = 30.0  # after SIGKILL: a dying process releases its GPU context before it is gone
POLL_S = 0.05


class TrainingProcess(subprocess.Popen):
    """torchrun, started by ``start_training``: leader of its own session, and ``tag`` in the
    environment of every process of the run (``TRAINING_TAG_ENV``)."""

    def __init__(self, cmd: list[str], env: dict[str, str], **kwargs: Any) -> None:
        self.tag = uuid.uuid4().hex
        super().__init__(
            cmd, env={**env, TRAINING_TAG_ENV: self.tag}, start_new_session=True, **kwargs
        )


def run_processes(proc: subprocess.Popen) -> set[psutil.Process]:
    """The live processes of the training run, torchrun itself aside (``proc`` reaps it):
    its descendants while it lives, the processes of its session (``start_new_session``),
    and those carrying its tag (workers in sessions of their own, also once reparented)."""
    found: set[psutil.Process] = set()
    if proc.poll() is None:  # not reaped: its pid still names it, not a reused pid
        with contextlib.suppress(psutil.NoSuchProcess):
            found.update(psutil.Process(proc.pid).children(recursive=True))
    # A pid is not reused while a process is in the session it names, so the session test
    # holds after proc was reaped too (an unrelated session with that pid would need the
    # pid space to wrap between proc's end and this scan).
    tag, uid = getattr(proc, "tag", None), os.getuid()
    for p in psutil.process_iter(["uids"]):
        if p.pid == proc.pid or p.info["uids"] is None or p.info["uids"].real != uid:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(p.pid) == proc.pid or (tag and p.environ().get(TRAINING_TAG_ENV) == tag):
                found.add(p)
    return _alive(found)


def _alive(procs: set[psutil.Process]) -> set[psutil.Process]:
    """Those of ``procs`` still running. A zombie is dead (no memory, no GPU context) and
    only its parent can reap it: an orphan's reaper (PID 1 in a container) may never do so."""
    alive = set()
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.add(p)
    return alive


def _wait_gone(
    proc: subprocess.Popen, procs: set[psutil.Process], timeout_s: float
) -> set[psutil.Process]:
    """Wait up to ``timeout_s`` for ``proc`` (reaped by ``Popen``, which keeps its exit status)
    and ``procs`` to exit; the survivors among ``procs``. Hand-polled, not psutil.wait_procs:
    that waits on an unreaped zombie until the timeout."""
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(max(0.0, deadline - time.monotonic()))
    while (alive := _alive(procs)) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return alive


def _signal_run(proc: subprocess.Popen, procs: set[psutil.Process], sig: int) -> None:
    if proc.poll() is None:  # its process group too: members started since the scan
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            p.send_signal(sig)  # psutil refuses a pid reused since the scan


@contextlib.contextmanager
def _termination_signals_held():
    """Hold CapGuard's signals (delivered on leaving): its handler raises, which would end
    the SIGKILL sweep early and restore the caps under live workers."""
    sigs = {getattr(signal, name) for name in caps.SIGNALS}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def terminate(proc: subprocess.Popen) -> None:
    """Stop the training run, torchrun and every process it started, also those that left
    its session or outlived it; nothing of the run runs when this returns (else: an error
    is logged). A caller stopped by a signal has put the caps back before this (``run_training``).

    1. Find the run's processes before any signal (torchrun's children are found through
       it only while it lives).
    2. SIGTERM all of them (torchrun would pass it on, but only to the workers it still
       tracks) and wait ``TERMINATE_GRACE_S``. A signal to this process (CapGuard raises)
       ends the wait early.
    3. SIGKILL whatever of the run is left, found anew each round (a process may have
       forked since), until nothing is or ``KILL_WAIT_S`` has passed; reap torchrun."""
    procs = run_processes(proc)
    try:
        _signal_run(proc, procs, signal.SIGTERM)
        _wait_gone(proc, procs, TERMINATE_GRACE_S)
    finally:
        with _termination_signals_held():
            deadline = time.monotonic() + KILL_WAIT_S
            while (procs := _alive(procs) | run_processes(proc)) or proc.poll() is None:
                if time.monotonic() > deadline:
                    left = sorted(p.pid for p in procs) + (
                        [proc.pid] if proc.poll() is None else []
                    )
                    log.error(
                        "training processes alive %g s after SIGKILL (stuck in the kernel?): %s",
                        KILL_WAIT_S,
                        left,
                    )
                    break
                _signal_run(proc, procs, signal.SIGKILL)
                _wait_gone(proc, procs, min(1.0, max(0.0, deadline - time.monotonic())))


def start_training(
    cmd: list[str], log_path: Path, env: dict[str, str] | None = None
) -> TrainingProcess:
    """Start ``cmd`` (torchrun) in its own session, output appended to ``log_path``;
    the caller stops it on every exit path (``terminate``)."""
    full_env = {**os.environ, **OFFLINE_ENV, **(env or {})}
    log.info("training: %s", shlex.join(cmd))
    with open(log_path, "ab") as logf:
        return TrainingProcess(cmd, full_env, stdout=logf, stderr=subprocess.STDOUT)


def training_error(rc: int, log_path: Path) -> RuntimeError:
    """The error for a training process that exited with status ``rc``: root cause + log end."""
    text = log_path.read_text(errors="replace")
    return RuntimeError(
        f"training exited with status {rc}: {root_cause(text)}\n(see {log_path}; its end:)\n"
        + "\n".join(text.splitlines()[-15:])
    )


@contextlib.contextmanager
def first_on_interrupt(action: Callable[[], None] | None):
    """Run ``action`` (putting the caps back) as soon as the body is interrupted by a signal
    or an error, before the caller's cleanup stops the training (``terminate``)."""
    try:
        yield
    except BaseException:
        if action is not None:
            action()
        raise


def run_training(
    cmd: list[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    before_stop: Callable[[], None] | None = None,
) -> None:
    """Run ``cmd`` (torchrun) in its own session; on any exit path the run is stopped, and
    whatever it left behind (workers of a torchrun that died) with it.

    ``before_stop`` runs first when the wait is interrupted (a signal, an error): the caps go
    back before the up to ``TERMINATE_GRACE_S + KILL_WAIT_S`` that stopping takes, since
    SLURM's KillWait (30 s by default) SIGKILLs this agent after its SIGTERM."""
    proc = start_training(cmd, log_path, env)
    try:
        with first_on_interrupt(before_stop):
            rc = proc.wait()
    finally:
        terminate(proc)
    if rc != 0:
        raise training_error(rc, log_path)


def root_cause(log_text: str) -> str:
    """The first worker exception line in a torchrun log (not torchrun's own summary)."""
    for line in log_text.splitlines():
        m = re.match(
            r"^(?:\[rank\d+\]:\s*)?((?:[\w.]+\.)?\w*(?:Error|Exception)\b:.*)$", line.strip()
        )
        if m and "ChildFailedError" not in m.group(1):
            return m.group(1)
    return "no exception in the log (killed? out of memory?)"


# ---- one node -----------------------------------------------------------------------------------
def run_node(
    spec: dict[str, Any] | RunSpec,
    outdir: Path,
    t0: float,
    node_rank: int = 0,
    rdzv: str | None = None,
) -> dict[str, Any]:
    """Cap this node's GPUs, sample them, run this node's torchrun share; write the node's
    telemetry under ``outdir/.node<rank>/`` and return its facts."""
    spec = RunSpec.of(spec)
    node = NodeSetup.open(spec, outdir, t0, node_rank, rdzv)
    gpus, facts, sampler, opts = node.gpus, node.facts, None, node.opts
    guard = caps.CapGuard(
        gpus, spec.cap_w, opts.cap_control if gpus else "observe", opts.state_dir, opts.cap_command
    )
    with guard, clock_guard(spec.clock_mhz, gpus, opts) as clock:
        if clock is not None:  # knob: clock: the SM clock locked (reset on every path)
            facts["clock_lock"] = clock.record()
        facts["gpus_after_set"] = [g.describe() for g in gpus]
        if opts.sampler and gpus:
            sampler = node.sampler().start()
        try:
            run_training(
                node.cmd,
                node.log_path,
                node.env,
                before_stop=lambda: guard.restore(keep_handlers=True),
            )
        finally:
            if sampler is not None:
                sampler.stop()
        facts["gpus_before_restore"] = [g.describe() for g in gpus]
    node.finish(guard, sampler)
    return facts


def clock_guard(
    clock_mhz: float | None, gpus: list[Any], opts: RunOptions
) -> contextlib.AbstractContextManager:
    """A clock group's (``knob: clock``) ``ClockGuard`` at ``clock_mhz`` (``RunSpec.clock_mhz``),
    NVML locking unless the run only observes; a cap group's (None): nothing."""
    if clock_mhz is None:
        return contextlib.nullcontext()
    from wattflex.runs.devices.clocks import ClockGuard

    mode = "nvml" if gpus and opts.cap_control != "observe" else "observe"
    return ClockGuard(gpus, float(clock_mhz), mode, opts.state_dir)


@dataclass
class NodeSetup:
    """One node's part of a real run before anything is capped: its NVML GPUs (stale caps
    left by killed runs restored first), the RAPL reader, the training config and command.
    Shared by ``run_node`` and the one-run sweep on real GPUs (``wattflex.runs.sweep.real``)."""

    spec: RunSpec
    opts: RunOptions
    node_dir: Path
    gpus: list[Any]
    host_reader: Any
    facts: dict[str, Any]
    cmd: list[str]
    log_path: Path
    t0: float
    env: dict[str, str]

    @classmethod
    def open(
        cls,
        spec: RunSpec,
        outdir: Path,
        t0: float,
        node_rank: int = 0,
        rdzv: str | None = None,
        train: TrainConfig | None = None,
        launch: list[str] | None = None,
    ) -> NodeSetup:
        """``train`` (default ``spec``'s, into ``outdir``) is the training job it launches;
        ``launch``: the user's own command instead (``wattflex.runs.command_run``), no config."""
        opts = spec.options
        node_dir = outdir / NODE_DIR.format(rank=node_rank)
        node_dir.mkdir(parents=True, exist_ok=True)
        gpus: list[Any] = []
        host = node_name()
        facts: dict[str, Any] = {
            "node_rank": node_rank,
            "host": host,
            "launch": launch_facts(),
            "nccl_env": opts.nccl or {},
        }
        if opts.uses_nvml:
            state_dir = opts.state_dir or caps.default_state_dir()
            stale = caps.restore_from_state_dir(  # this run's own cap command, never the record's
                state_dir, cap_command=opts.cap_command if opts.cap_control == "command" else None
            )
            facts["stale_cap_files"] = stale
            from wattflex.runs.devices.clocks import restore_clocks_from_state_dir

            stale_clocks = restore_clocks_from_state_dir(state_dir)
            if stale_clocks:  # clock locks a killed clock run left (knob: clock)
                facts["stale_clock_files"] = stale_clocks
            gpus = nvml.open_gpus(
                opts.nproc_per_node if opts.device == "cuda" else None,
                set_limit=caps.limit_setter(opts.cap_control, opts.cap_command),
                gpm=opts.gpm and opts.telemetry != "dcgm",
            )  # dcgm: GPM left to DCGM
            for g in gpus:
                g.node = host  # the SLURM node's name: telemetry rows of two nodes never merge
            if opts.sampler:  # before any cap: cuda.telemetry dcgm that does not answer fails here
                facts["telemetry"] = dcgm_source.choose_source(opts.telemetry, gpus, opts.dcgm)
                if facts["telemetry"]["source"] == "dcgm":
                    for g in gpus:
                        g.gpm = None  # auto chose DCGM: its profiling fields, not GPM's
        host_reader = None
        if opts.host_power and opts.sampler:
            host_reader = RaplReader()
            facts["host_power"] = host_reader.describe()
        cmd = launch
        if cmd is None:
            cfg_path = node_dir / "train_config.json"
            (train or spec.train_config(outdir)).to_json(cfg_path)
            cmd = training_command(
                cfg_path,
                t0,
                opts.nproc_per_node,
                opts.nnodes,
                node_rank,
                rdzv,
                run_id=str(spec.run_id or "wattflex"),
                local_addr=node_address() if opts.nnodes > 1 else None,
            )
        log_path = outdir / ("train.log" if node_rank == 0 else f"train.node{node_rank}.log")
        return cls(
            spec, opts, node_dir, gpus, host_reader, facts, cmd, log_path, t0, opts.nccl or {}
        )

    def sampler(self) -> TelemetrySampler:
        """The telemetry sampler of this node's GPUs (with RAPL host power when readable), joined with
        DCGM when the facts say the telemetry comes from DCGM.
        """
        host = self.host_reader.read if self.host_reader and self.host_reader.available else None
        sampler = TelemetrySampler(self.gpus, self.opts.sampler_period_s, self.t0, host=host)
        if self.facts.get("telemetry", {}).get("source") == "dcgm":
            return dcgm_source.DcgmSampler.open(
                sampler, self.opts.dcgm, [g.index for g in self.gpus], self.facts["host"]
            )
        return sampler

    def finish(self, guard: caps.CapGuard, sampler: TelemetrySampler | None) -> None:
        """After the restore: the node's facts and telemetry into its node directory."""
        gpus, facts = self.gpus, self.facts
        facts["caps"] = guard.record()
        facts["gpus_after_restore"] = [
            {"index": g.index, "power_limit_w": g.power_limit_w()} for g in gpus
        ]
        facts["gpm"] = sorted({g.gpm.status for g in gpus if g.gpm is not None}) or ["off"]
        facts["device_model"] = gpus[0].model if gpus else None
        if sampler is not None:
            facts["telemetry_source"] = facts.get("telemetry", {}).get("source", "nvml")
            if isinstance(sampler, dcgm_source.DcgmSampler):
                facts["telemetry"]["dcgm_reader"] = sampler.describe()
            write_parquet(
                sampler.frame(),
                self.node_dir / "telemetry.parquet",
                provenance(params=self.spec.raw, backend="cuda"),
            )
        write_json({"node": facts}, self.node_dir / "node.json")


def node_name() -> str:
    """This node's name: SLURM's (SLURMD_NODENAME, set in every job step and batch script;
    the name the job's node list uses) or the host name outside SLURM."""
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename


def launch_facts() -> dict[str, Any]:
    """What this node's process was given: CPUs it may run on, SLURM's CPU and GPU counts for
    the step, the GPUs CUDA sees (run.json: a step confined to fewer CPUs or GPUs shows here)."""
    env = os.environ
    return {
        "cpus_usable": len(os.sched_getaffinity(0)),
        "slurm_cpus_on_node": env.get("SLURM_CPUS_ON_NODE"),
        "slurm_step_gpus": env.get("SLURM_STEP_GPUS"),
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "slurm_step_id": env.get("SLURM_STEP_ID"),
        "slurm_job_id": env.get("SLURM_JOB_ID"),
    }


# ---- telemetry without a sampler ---------------------------------------------------------------
def telemetry_from_steps(
    steps: pd.DataFrame,
    events: list[dict[str, Any]],
    period_s: float,
    n_gpus: int,
    node: str,
    end_s: float,
) -> pd.DataFrame:
    """CPU smoke runs: a trace whose only signal is gpu_util = 100 while steps run."""
    t = np.arange(period_s, end_s + 1e-9, period_s)
    busy = np.zeros(t.size, dtype=bool)
    if len(steps):
        start = float((steps["t_end_s"] - steps["step_time_s"]).iloc[0])
        busy = (t >= start) & (t <= float(steps["t_end_s"].iloc[-1]))
        for ev in events:
            busy &= ~((t >= ev["t_start_s"]) & (t <= ev["t_end_s"]))
    rows = []
    for k, ts in enumerate(t):
        for g in range(n_gpus):
            rows.append(
                {"t_s": float(ts), "node": node, "gpu": g, "gpu_util": 100.0 if busy[k] else 0.0}
            )
    return telemetry_frame(rows)


def align_nodes(tel: pd.DataFrame, period_s: float) -> pd.DataFrame:
    """Telemetry of several nodes on one time grid. Each node's sampler has its own phase
    (``t_s`` = its read time since the shared t0), so a job-level sum per ``t_s``
    (``telemetry.job_series``) would add up one node at a time. Each sample goes to the
    multiple of the period at or before its read time (earlier by less than a period: never
    later, so a sample read before a cap change never lands after it, where a one-run sweep
    measures the new cap), one per node, GPU and slot (the last), and only slots that every
    node's GPUs sampled are kept (a node starts and stops sampling a little before or after
    the others). One node: unchanged."""
    tel = tel.sort_values(["t_s", "node", "gpu"])
    if tel["node"].nunique() < 2:
        return tel
    out = tel.assign(t_s=np.floor(tel["t_s"] / period_s + 1e-9) * period_s)
    out = out.drop_duplicates(["t_s", "node", "gpu"], keep="last")
    n_gpus = len(out[["node", "gpu"]].drop_duplicates())
    return out[out.groupby("t_s")["gpu"].transform("size") == n_gpus].reset_index(drop=True)


# ---- the run ------------------------------------------------------------------------------------
def _scontrol_field(kind: str, name: str, key: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", kind, "-o", name], capture_output=True, text=True, check=True
    ).stdout
    return next((kv.split("=", 1)[1] for kv in out.split() if kv.startswith(f"{key}=")), "")


def node_address() -> str | None:
    """This node's address as SLURM reaches it (its NodeAddr; None outside SLURM or without one)."""
    try:
        return _scontrol_field("node", node_name(), "NodeAddr") or None
    except (OSError, subprocess.CalledProcessError):
        return None


def _node_hosts() -> list[str]:
    """The allocation's nodes. The jobstep plugin keeps only SLURM_JOB_ID of SLURM's variables
    in the rule's environment, so the node list is asked of SLURM when it is not there."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    job_id = os.environ.get("SLURM_JOB_ID")
    if not nodelist and job_id:
        nodelist = _scontrol_field("job", job_id, "NodeList")
    if not nodelist:
        raise RuntimeError(
            "nnodes > 1 needs a SLURM allocation (SLURM_JOB_ID / SLURM_JOB_NODELIST); "
            "set cuda.nnodes: 1 to run on this node only"
        )
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def rendezvous_endpoint(first_node: str) -> str:
    """c10d's ``host:port`` on ``first_node``: SLURM's NodeAddr for it (the address SLURM
    itself reaches it at; the name where none is set), and a port free on it when this
    process runs there (the batch script does: it runs on the allocation's first node), else
    one derived from the job id (two jobs on one node collide only if their ids differ by a
    multiple of 3000; the range stays below Linux's ephemeral ports, 32768 up)."""
    addr = _scontrol_field("node", first_node, "NodeAddr") or first_node
    if node_name() == first_node:
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
    else:
        port = RDZV_BASE_PORT + int(os.environ.get("SLURM_JOB_ID", "0")) % 3000
    return f"{addr}:{port}"


def node_agent_command(
    spec_path: Path,
    outdir: Path,
    t0: float,
    nnodes: int,
    rdzv: str,
    gpus_per_node: int | None = None,
    module: str = "wattflex.runs.real_run",
    program: list[str] | None = None,
) -> list[str]:
    """One srun step, one task (node agent) per node. Without ``--exact`` a step gets all the
    job's CPUs and memory on each node (srun(1)); ``--gpus-per-node`` names the GPUs each
    node's agent gets (omitted: the job's, SLURM's default for a step's GRES). ``module``: this
    one (a run at one cap, ``run_node``) or ``wattflex.runs.sweep.real`` (``run_sweep_node``);
    ``program`` instead of ``python -m module`` (benchmarks/gpu_check.py: its script)."""
    gpus = [f"--gpus-per-node={gpus_per_node}"] if gpus_per_node else []
    return [
        "srun",
        f"--nodes={nnodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        *gpus,
        *(program or [sys.executable, "-m", module]),
        *node_agent_args(spec_path, outdir, t0, rdzv),
    ]


def node_agent_args(spec_path: Path, outdir: Path, t0: float, rdzv: str) -> list[str]:
    """What ``node_main`` parses: ``node SPEC OUTDIR --t0 T --rdzv HOST:PORT``."""
    return ["node", str(spec_path), str(outdir), "--t0", repr(t0), "--rdzv", rdzv]


def gpus_per_node(spec: dict[str, Any] | RunSpec, nnodes: int) -> int | None:
    """The GPUs each node of the group has in its allocation (``group.gpus`` / nodes), if even."""
    gpus = int(RunSpec.of(spec).group.get("gpus") or 0)
    return gpus // nnodes if gpus and gpus % nnodes == 0 else None


def run_real(spec: dict[str, Any] | RunSpec, outdir: str | Path) -> None:
    """Run ``spec`` (``backend: cuda``) and write telemetry.parquet, steps.parquet, run.json."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    spec = RunSpec.of(spec)
    opts = spec.options
    spec.train_config(outdir).validate()  # missing model/data: fail before any cap
    start_utc, t0 = utc_now(), time.time()
    if opts.nnodes == 1:
        nodes = [run_node(spec, outdir, t0)]
    else:
        hosts = _node_hosts()
        if len(hosts) < opts.nnodes:
            raise RuntimeError(
                f"cuda.nnodes is {opts.nnodes} but the SLURM allocation has {len(hosts)} node(s) "
                f"({', '.join(hosts)}); ask for as many nodes (slurm_gpus_per_node)"
            )
        spec_path = outdir / "spec.json"
        spec_path.write_text(
            strict_json(spec.raw, indent=2)
        )  # each node agent parses it (node_main)
        rdzv = rendezvous_endpoint(hosts[0])
        run_training(
            node_agent_command(
                spec_path, outdir, t0, opts.nnodes, rdzv, gpus_per_node(spec, opts.nnodes)
            ),
            outdir / "nodes.log",
        )
        nodes = [
            read_json(outdir / NODE_DIR.format(rank=r) / "node.json")["node"]
            for r in range(opts.nnodes)
        ]
    end_utc = utc_now()
    assemble(spec, outdir, opts, nodes, t0, start_utc, end_utc)


def assemble(
    spec: RunSpec,
    outdir: Path,
    opts: RunOptions,
    nodes: list[dict[str, Any]],
    t0: float,
    start_utc: str,
    end_utc: str,
    extra: dict[str, Any] | None = None,
) -> None:
    """The run's files from the training's and the nodes' outputs; ``extra`` goes into run.json
    (the in-run staircase's record). The training's and nodes' scratch files are removed."""
    training = read_json(outdir / RESULT_FILE)["training"]
    steps = read_parquet(outdir / STEPS_FILE)
    parts = [outdir / NODE_DIR.format(rank=n["node_rank"]) / "telemetry.parquet" for n in nodes]
    if all(p.is_file() for p in parts):
        tel = align_nodes(
            pd.concat([read_parquet(p) for p in parts], ignore_index=True), opts.sampler_period_s
        )
        source = "+".join(
            sorted({n.get("telemetry_source", "nvml") for n in nodes})
        )  # nodes may choose apart
    else:
        end_s = max(float(steps["t_end_s"].max()) if len(steps) else 0.0, time.time() - t0)
        tel = telemetry_from_steps(
            steps,
            training["events"],
            opts.sampler_period_s,
            opts.nproc_per_node * opts.nnodes,
            nodes[0]["host"],
            end_s,
        )
        source = "steps"
    device_model = nodes[0].get("device_model") or training.get("device_name") or opts.device
    prov = provenance(params=spec.raw, backend="cuda", device_model=device_model)
    meta = {"run_id": spec.run_id, "group": spec.group_id}
    write_parquet(
        tel.reset_index(drop=True),
        outdir / "telemetry.parquet",
        prov,
        telemetry_source=source,
        **meta,
    )
    write_parquet(steps, outdir / STEPS_FILE, prov, **meta)
    gpus = [g for n in nodes for g in n.get("gpus_before_restore", [])]
    write_json(
        {
            "run_id": spec.run_id,
            "campaign": spec.campaign,
            "group": spec.group_id,
            "cap_w": spec.cap_w,
            "repeat": spec.repeat,
            "backend": "cuda",
            "device_model": device_model,
            **spec.clock_fields,
            "device": opts.device,
            "cap_control": nodes[0]["caps"]["cap_control"],
            "cap_command": opts.cap_command,
            "original_limit_w": [w for n in nodes for w in n["caps"]["original_limit_w"]],
            "enforced_limit_w": [g["enforced_limit_w"] for g in gpus],
            "power_limit_w": [g["power_limit_w"] for g in gpus],
            "start_utc": start_utc,
            "end_utc": end_utc,
            "t0_epoch": t0,
            "telemetry": {
                "source": source,
                "period_s": opts.sampler_period_s,
                "gpm": nodes[0].get("gpm"),
                "host_power": nodes[0].get("host_power"),
                "reason": [n.get("telemetry", {}).get("reason") for n in nodes],
                "note": None
                if source != "steps"
                else "no sampler: gpu_util=100 while steps run, 0 otherwise; other fields NaN",
            },
            "nodes": nodes,
            "training": training,
            "spec": spec.raw,
            **(extra or {}),
        },
        outdir / "run.json",
        prov,
    )
    for scratch in (RESULT_FILE, LIVE_STEPS_FILE, STOP_FILE):
        (outdir / scratch).unlink(missing_ok=True)
    for n in nodes:
        shutil.rmtree(outdir / NODE_DIR.format(rank=n["node_rank"]), ignore_errors=True)


def node_main(
    argv: list[str] | None = None, run: Any = None, prog: str = "wattflex.runs.real_run"
) -> int:
    """``python -m <prog> node SPEC OUTDIR --t0 T --rdzv HOST:PORT`` (an srun task): ``run``
    (default ``run_node``) for this node, its rank SLURM's node id."""
    p = argparse.ArgumentParser(prog=f"python -m {prog}")
    p.add_argument("what", choices=["node"])
    p.add_argument("spec")
    p.add_argument("outdir")
    p.add_argument("--t0", type=float, required=True)
    p.add_argument("--rdzv", required=True)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    spec = json.loads(Path(a.spec).read_text())
    (run or run_node)(spec, Path(a.outdir), a.t0, int(os.environ.get("SLURM_NODEID", "0")), a.rdzv)
    return 0


if __name__ == "__main__":
    sys.exit(node_main())
