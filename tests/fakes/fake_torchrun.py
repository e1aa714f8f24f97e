"""A stand-in for torchrun for tests of ``real_run.terminate``: a launcher that starts its
workers the way torch's elastic agent does (``SubprocessHandler``: ``Popen(...,
start_new_session=True)``, so each worker leads a session of its own), then waits.

``fake_torchrun.py PID_DIR [--workers N] [--worker-ignores-term] [--launcher-ignores-term]
[--child] [--daemon] [--launcher-exits]``

* ``--child``: each worker starts a child in its own session (a DataLoader worker, say).
* ``--daemon``: each worker double-forks a process into a new session: orphaned at once.
* ``--worker-ignores-term``: workers (and what they start) ignore SIGTERM: only SIGKILL ends them.
* ``--launcher-ignores-term``: so does the launcher (after starting its workers).
* ``--launcher-exits``: the launcher exits once everything is up, leaving its workers
  reparented (a torchrun that crashed or was killed).

Every process writes its pid to ``PID_DIR/<role>-<n>.pid`` (launcher-0, worker-<n>,
child-<n>, daemon-<n>) once it is up, so the test knows whom to check.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def write_pid(pid_dir: Path | str, name: str) -> None:
    pid_dir = Path(pid_dir)
    tmp = pid_dir / f".{name}.tmp"
    tmp.write_text(str(os.getpid()))
    os.replace(tmp, pid_dir / f"{name}.pid")  # whole or absent: the test polls for it


def sleep_forever() -> None:
    while True:
        time.sleep(1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "role", nargs="?", default="launcher", choices=["launcher", "worker", "child", "daemon"]
    )
    p.add_argument("pid_dir", type=Path)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--worker-ignores-term", action="store_true")
    p.add_argument("--launcher-ignores-term", action="store_true")
    p.add_argument("--child", action="store_true")
    p.add_argument("--daemon", action="store_true")
    p.add_argument("--launcher-exits", action="store_true")
    a = p.parse_args()
    me = [sys.executable, __file__]
    if a.role == "launcher":
        worker = [
            str(a.pid_dir),
            *(["--worker-ignores-term"] if a.worker_ignores_term else []),
            *(["--child"] if a.child else []),
            *(["--daemon"] if a.daemon else []),
        ]
        procs = [
            subprocess.Popen([*me, "worker", *worker, "--rank", str(r)], start_new_session=True)
            for r in range(a.workers)
        ]
        if a.launcher_ignores_term:
            signal.signal(
                signal.SIGTERM, signal.SIG_IGN
            )  # after the Popen: workers would inherit it
        write_pid(a.pid_dir, "launcher-0")
        if a.launcher_exits:
            expected = a.workers * (1 + a.child + a.daemon) + 1
            while len(list(a.pid_dir.glob("*.pid"))) < expected:
                time.sleep(0.05)
            os._exit(0)  # no wait for the workers: they live on
        for proc in procs:
            proc.wait()
        return
    if a.worker_ignores_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by what it starts
    if a.role == "worker":
        if a.child:
            subprocess.Popen(
                [*me, "child", str(a.pid_dir), "--rank", str(a.rank)], start_new_session=True
            )
        if a.daemon and os.fork() == 0:  # classic double fork
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [*me, "daemon", str(a.pid_dir), "--rank", str(a.rank)])
            os._exit(0)
    write_pid(a.pid_dir, f"{a.role}-{a.rank}")
    sleep_forever()


if __name__ == "__main__":
    main()
