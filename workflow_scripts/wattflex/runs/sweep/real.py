"""The one-run sweep on real GPUs (``backend: cuda``): one torchrun training run whose NVML
GPUs the sweep controller (``wattflex.runs.sweep.algorithm``) steps through the cap grid.

``PollingRun`` is the live run of real training: it sleeps and polls the NVML telemetry
sampler and the trainer's live step log (``steps.live.csv``); ``GpuSet`` makes a job's NVML
GPUs one device. The controller's ``restored_on_exit`` runs inside ``caps.CapGuard``, which
adds the state file for restores after a SIGKILL. Never fingerprinted
(``wattflex.fingerprint.REAL_BACKEND``), and never imported by the emulated sweep.
"""

from __future__ import annotations

import io
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from wattflex.runs.devices.base import check_cap
from wattflex.runs.devices.caps import CapError, CapGuard, restore_each
from wattflex.runs.real_run import NodeSetup, RunOptions, assemble, start_training, terminate, training_error, utc_now
from wattflex.runs.runner import atomic_run_dir
from wattflex.runs.sweep.algorithm import CapDevice, run_controller, separate_sweep_seconds, sweep_record
from wattflex.runs.training.config import TrainConfig
from wattflex.telemetry import job_series

STOP_GRACE_S = 300.0  # a stop waits for the current step, or an eval/checkpoint in progress


class GpuSet:
    """A job's GPUs as one ``CapDevice``: the same cap on each (the enforced limit reported
    is the lowest read back); restore tries every GPU and then reports any that failed."""

    def __init__(self, gpus: Sequence[CapDevice]) -> None:
        self.gpus = list(gpus)

    def set_cap(self, cap_w: float) -> float:
        return min(g.set_cap(cap_w) for g in self.gpus)

    def restore(self) -> None:
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

    def __init__(self, device: CapDevice, read_series: Callable[[], pd.DataFrame],
                 read_steps: Callable[[], pd.DataFrame], stop_training: Callable[[], None],
                 max_duration_s: float, poll_s: float = 5.0, t0: float | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 ended: Callable[[], bool] | None = None) -> None:
        self.device, self.poll_s, self.max_duration_s = device, float(poll_s), float(max_duration_s)
        self._read_series, self._read_steps, self._stop = read_series, read_steps, stop_training
        self._clock, self._sleep, self._ended = clock, sleep, ended
        self._t0 = clock() if t0 is None else t0

    @property
    def now_s(self) -> float:
        return self._clock() - self._t0

    def advance(self, dt_s: float) -> None:
        self._sleep(max(0.0, min(dt_s, self.max_duration_s - self.now_s)))
        if self._ended is not None and self._ended():
            self.max_duration_s = min(self.max_duration_s, self.now_s)

    def series(self) -> pd.DataFrame:
        return self._read_series()

    def steps(self) -> pd.DataFrame:
        return self._read_steps()

    def stop(self) -> None:
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
        return pd.DataFrame({c: pd.Series(dtype=float) for c in ("step", "t_end_s", "tokens", "loss")})
    return pd.read_csv(io.StringIO(text))


class _Training:
    """The torchrun training process of a real sweep, seen from the controller."""

    def __init__(self, proc: Any, log_path: Path, outdir: Path) -> None:
        # Lazy: training.loop imports torch, which importing this module must not need.
        from wattflex.runs.training.loop import LIVE_STEPS_FILE, STOP_FILE

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
            raise RuntimeError(f"training did not stop within {grace_s:g} s of the stop request "
                               f"(see {self.log_path})") from exc
        if rc != 0:
            raise training_error(rc, self.log_path)


def run_real_sweep(spec: dict[str, Any], outdir: str | Path) -> None:
    """``backend: cuda``: one real training run (torchrun, as ``real_run``) whose NVML GPUs the
    controller steps through the cap grid, reading the sampler's telemetry and the trainer's
    live step log while it runs; training is stopped when the sweep ends. Everything runs
    inside ``caps.CapGuard`` (state file, signals, atexit) around ``restored_on_exit``, so
    the original limits come back on every exit path. Writes telemetry.parquet,
    steps.parquet, run.json (real_run's record + the controller's) and train.log.

    Needs caps that can change (``cuda.cap_control: nvml | command``), the NVML sampler
    (``cuda.sampler: true``) and one node (``nnodes: 1``)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    opts = RunOptions.from_spec(spec)
    if opts.cap_control == "observe" or not opts.sampler:
        raise ValueError(f"sweep: {spec['sweep']} on the cuda backend steps the GPUs' power caps and reads "
                         f"their power: it needs cuda.cap_control nvml or command (got {opts.cap_control}) "
                         f"and cuda.sampler: true (got {opts.sampler}); use sweep: separate otherwise")
    if opts.nnodes != 1:
        raise NotImplementedError(f"sweep: {spec['sweep']} on the cuda backend runs on one node "
                                  f"(nnodes {opts.nnodes}); use sweep: separate for multi-node jobs")
    caps = sorted(float(c) for c in spec["caps"])
    separate_s = separate_sweep_seconds(spec)
    # Training may run as long as the separate sweep would; the controller stops it sooner.
    train_spec = {**spec, "run": {**spec.get("run", {}), "duration_s": separate_s}}
    TrainConfig.from_spec(train_spec, outdir).validate()       # missing model/data: fail before any cap
    start_utc, t0 = utc_now(), time.time()
    node = NodeSetup.open(spec, outdir, opts, t0, train_spec=train_spec)
    if not node.gpus:
        raise RuntimeError("no NVML GPU to sweep")
    for gpu in node.gpus:                                        # refuse a bad grid before any cap
        for cap in caps:
            check_cap(gpu, cap)
    n_gpus = len(node.gpus)
    # The guard sets the lowest cap, where the staircase starts (so warm-up lands there too).
    guard = CapGuard(node.gpus, caps[0], opts.cap_control, opts.state_dir, opts.cap_command)
    with guard:
        node.facts["gpus_after_set"] = [g.describe() for g in node.gpus]
        sampler = node.sampler().start()
        proc = None
        try:
            proc = start_training(node.cmd, node.log_path, node.env)
            training = _Training(proc, node.log_path, outdir)
            training.wait_first_step(separate_s, opts.sampler_period_s)

            def series() -> pd.DataFrame:
                s = job_series(sampler.frame())
                return s[s["n_gpus"] == n_gpus].reset_index(drop=True)  # not a sample read half-way

            run = PollingRun(GpuSet(node.gpus), series, training.steps, training.request_stop,
                             max_duration_s=separate_s, poll_s=opts.sampler_period_s, t0=t0, clock=time.time,
                             ended=training.ended)
            result = run_controller(run, spec, caps, separate_s)
            training.finish()
        finally:
            if proc is not None:
                terminate(proc)
            sampler.stop()
        node.facts["gpus_before_restore"] = [g.describe() for g in node.gpus]
    node.finish(guard, sampler)
    assemble(spec, outdir, opts, [node.facts], t0, start_utc, utc_now(), extra=sweep_record(spec, result))


def write_real_sweep_run(spec: dict[str, Any], outdir: str | Path) -> Path:
    """``run_real_sweep`` written atomically into ``outdir`` (``runner.atomic_run_dir``):
    telemetry.parquet, steps.parquet, run.json and train.log, or nothing if it fails."""
    with atomic_run_dir(outdir) as tmp:
        run_real_sweep(spec, tmp)
    return Path(outdir)
