"""Work that several test modules read, done once per test session however pytest-xdist spreads them."""

from __future__ import annotations

import fcntl
import os
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``name`` made by ``build(folder)`` once per test session, by whichever pytest-xdist
    worker asks first; the others wait for it (a file lock in the folder all workers share, as
    pytest-xdist's docs do it) and get the same folder. Read it only: a test copies it first. A
    failed build fails every test that asks, with the first worker's error, and is not retried."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # each worker's basetemp is a folder of the session's
    folder, built, failed = shared / name, shared / f"{name}.built", shared / f"{name}.failed"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if failed.exists():
            pytest.fail(
                f"building {name} failed (on another worker):\n{failed.read_text()}", pytrace=False
            )
        if not built.exists():
            shutil.rmtree(folder, ignore_errors=True)
            try:
                build(folder)
            except BaseException:
                failed.write_text(traceback.format_exc()[-8000:])
                raise
            built.touch()
    return folder
