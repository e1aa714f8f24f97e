"""``real_run.terminate`` leaves no process of a training run alive: real processes started by
``start_training``, laid out as torchrun lays out its workers (each in a session of its own;
tests/fakes/fake_torchrun.py); a real torchrun: tests/workflow/torchrun/test_orphans.py.
Survival is read from the pids that the processes write themselves; a zombie counts as dead
(it holds no memory and only its parent can reap it)."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from wattflex.runs import real_run
from wattflex.runs.devices import caps

FAKE_TORCHRUN = Path(__file__).resolve().parents[2] / "fakes" / "fake_torchrun.py"
UP_TIMEOUT_S = 60.0


def running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_up(pid_dir: Path, names: list[str]) -> dict[str, psutil.Process]:
    """The processes ``names`` once each has written its pid file."""
    deadline = time.monotonic() + UP_TIMEOUT_S
    while not all((pid_dir / f"{n}.pid").is_file() for n in names):
        if time.monotonic() > deadline:
            pytest.fail(
                f"not up within {UP_TIMEOUT_S:g} s: {sorted(p.name for p in pid_dir.glob('*.pid'))}"
            )
        time.sleep(0.05)
    procs = {n: psutil.Process(int((pid_dir / f"{n}.pid").read_text())) for n in names}
    workers = {n: p for n, p in procs.items() if n != "launcher-0"}  # the launcher may exit already
    assert survivors(workers) == sorted(workers)
    return procs


def survivors(procs: dict[str, psutil.Process]) -> list[str]:
    return sorted(n for n, p in procs.items() if running(p))


def start_fake(tmp_path: Path, *flags: str) -> tuple[real_run.TrainingProcess, Path]:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    cmd = [sys.executable, str(FAKE_TORCHRUN), str(pid_dir), "--workers", "2", *flags]
    return real_run.start_training(cmd, tmp_path / "train.log"), pid_dir


def names(*roles: str, workers: int = 2) -> list[str]:
    return ["launcher-0"] + [f"{r}-{i}" for r in roles for i in range(workers)]


@pytest.fixture
def cleanup():
    """SIGKILL whatever a failing test left behind, so it does not linger on the machine."""
    started: list[subprocess.Popen] = []
    yield started.append
    for proc in started:
        for p in real_run.run_processes(proc):
            p.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_fake_torchrun_lays_workers_out_like_torchrun(tmp_path, cleanup):
    """The premise: workers in sessions of their own, outside torchrun's process group."""
    proc, pid_dir = start_fake(tmp_path, "--child")
    cleanup(proc)
    procs = wait_up(pid_dir, names("worker", "child"))
    assert os.getsid(proc.pid) == os.getpgid(proc.pid) == proc.pid
    for n in ("worker-0", "worker-1"):
        assert os.getsid(procs[n].pid) == procs[n].pid != proc.pid
        assert procs[n].ppid() == proc.pid
    real_run.terminate(proc)


def test_terminate_sigterm_stops_launcher_workers_children_and_daemons(
    tmp_path, monkeypatch, cleanup
):
    monkeypatch.setattr(real_run, "TERMINATE_GRACE_S", 20.0)
    proc, pid_dir = start_fake(tmp_path, "--child", "--daemon")
    cleanup(proc)
    procs = wait_up(pid_dir, names("worker", "child", "daemon"))
    t = time.monotonic()
    real_run.terminate(proc)
    assert time.monotonic() - t < 10.0  # SIGTERM sufficed: no wait for the grace
    assert proc.returncode == -signal.SIGTERM
    assert survivors(procs) == []


@pytest.mark.parametrize(
    "launcher_ignores_term", [False, True], ids=["launcher_dies", "launcher_ignores"]
)
def test_terminate_sigkill_fallback_when_sigterm_is_ignored(
    tmp_path, monkeypatch, cleanup, launcher_ignores_term
):
    monkeypatch.setattr(real_run, "TERMINATE_GRACE_S", 0.5)
    flags = ["--worker-ignores-term", "--child", "--daemon"] + (
        ["--launcher-ignores-term"] * launcher_ignores_term
    )
    proc, pid_dir = start_fake(tmp_path, *flags)
    cleanup(proc)
    procs = wait_up(pid_dir, names("worker", "child", "daemon"))
    real_run.terminate(proc)
    assert proc.returncode == (-signal.SIGKILL if launcher_ignores_term else -signal.SIGTERM)
    assert survivors(procs) == []


def test_terminate_after_the_launcher_died_kills_its_reparented_workers(
    tmp_path, monkeypatch, cleanup
):
    monkeypatch.setattr(real_run, "TERMINATE_GRACE_S", 0.5)
    proc, pid_dir = start_fake(
        tmp_path, "--launcher-exits", "--worker-ignores-term", "--child", "--daemon"
    )
    cleanup(proc)
    procs = wait_up(pid_dir, names("worker", "child", "daemon"))
    assert proc.wait(UP_TIMEOUT_S) == 0
    assert survivors(procs) == sorted(names("worker", "child", "daemon")[1:])
    assert all(procs[f"worker-{i}"].ppid() != proc.pid for i in range(2))  # reparented
    real_run.terminate(proc)
    assert survivors(procs) == []


def test_run_training_leaves_nothing_of_a_launcher_that_exited(tmp_path, cleanup):
    """The normal end of ``run_training``: torchrun has exited; what it left goes with it."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    cmd = [
        sys.executable,
        str(FAKE_TORCHRUN),
        str(pid_dir),
        "--workers",
        "2",
        "--launcher-exits",
        "--child",
    ]
    real_run.run_training(cmd, tmp_path / "train.log")
    procs = {
        n: psutil.Process(int((pid_dir / f"{n}.pid").read_text()))
        for n in names("worker", "child")[1:]
    }
    assert survivors(procs) == []


@pytest.mark.fake_gpu
def test_fake_nvml_signals_to_run_node_restore_caps_first_then_kill_the_run(
    fake_nvml, tmp_path, monkeypatch, cleanup
):
    """The signal path of a real run (``run_node`` under ``CapGuard``): the first SIGTERM puts
    the caps back at once, before the run is stopped (SLURM's KillWait, 30 s by default, would
    SIGKILL this agent before a 30 s grace and a 30 s kill sweep end); a second one during the
    grace period (workers ignoring SIGTERM) still cuts the grace short, and every process of the
    run is dead when run_node returns."""
    from tests.unit.runs.test_real_run import cuda_spec

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    fake = [
        sys.executable,
        str(FAKE_TORCHRUN),
        str(pid_dir),
        "--workers",
        "2",
        "--worker-ignores-term",
        "--launcher-ignores-term",
        "--child",
        "--daemon",
    ]
    monkeypatch.setattr(real_run, "training_command", lambda *a, **k: fake)
    monkeypatch.setattr(real_run, "TERMINATE_GRACE_S", 60.0)
    started, procs, restored_at = [], {}, []
    start_training = real_run.start_training

    def start_and_record(*a, **k):
        started.append(proc := start_training(*a, **k))
        cleanup(proc)
        return proc

    restore_each = caps.restore_each

    def restore_and_record(gpus):
        if started:  # not the stale-state check before the run
            restored_at.append((time.monotonic(), len(survivors(procs))))
        return restore_each(gpus)

    monkeypatch.setattr(real_run, "start_training", start_and_record)
    monkeypatch.setattr(caps, "restore_each", restore_and_record)
    signalled = []

    def signal_twice():
        procs.update(wait_up(pid_dir, names("worker", "child", "daemon")))
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    spec = cuda_spec(tmp_path, cap_control="nvml", sampler=False)
    sender = threading.Thread(target=signal_twice, daemon=True)
    sender.start()
    t = time.monotonic()
    with pytest.raises(caps.CapSignal):
        real_run.run_node(spec, tmp_path / "run", time.time())
    sender.join()
    assert time.monotonic() - t < 40.0  # the second signal cut the 60 s grace short
    ((when, alive),) = restored_at  # restored once, first, the run still up
    assert alive == 7 and when - signalled[0] < 1.0
    assert survivors(procs) == [] and limits_w() == [700.0, 700.0]
