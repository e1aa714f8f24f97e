"""``real_run.terminate`` leaves no process of a real torchrun alive (torch.distributed.run, 2
workers on CPU). Survival is read from the pids that the processes write themselves; a zombie
counts as dead. (The same against tests/fakes/fake_torchrun.py, and the helpers:
tests/unit/runs/test_orphans.py.)"""

import os
import sys
import textwrap

import pytest

from tests.unit.runs.test_orphans import FAKE_TORCHRUN, cleanup, names, survivors, wait_up  # noqa: F401 (fixture)
from wattflex.runs import real_run


@pytest.mark.slow
@pytest.mark.parametrize("ignores_term", [False, True], ids=["sigterm", "sigkill_fallback"])
def test_real_torchrun_workers_are_gone_after_terminate(
    tmp_path, monkeypatch, cleanup, ignores_term
):
    """The real launcher (torch.distributed.run, 2 workers on CPU): after ``terminate`` neither
    torchrun nor its workers live, also when the workers ignore SIGTERM."""
    monkeypatch.setattr(real_run, "TERMINATE_GRACE_S", 3.0)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    worker = tmp_path / "worker.py"
    worker.write_text(
        textwrap.dedent(f"""\
        import os, signal, sys, time
        if {ignores_term}:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.path.insert(0, {str(FAKE_TORCHRUN.parent)!r})
        from fake_torchrun import sleep_forever, write_pid
        write_pid({str(pid_dir)!r}, "worker-" + os.environ["LOCAL_RANK"])
        sleep_forever()
        """)
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(worker),
    ]
    proc = real_run.start_training(cmd, tmp_path / "train.log")
    cleanup(proc)
    (pid_dir / "launcher-0.pid").write_text(str(proc.pid))
    procs = wait_up(pid_dir, names("worker"))
    assert all(
        os.getsid(p.pid) == p.pid for n, p in procs.items() if n != "launcher-0"
    )  # as read in torch
    real_run.terminate(proc)
    assert survivors(procs) == []
