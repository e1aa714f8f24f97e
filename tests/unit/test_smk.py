"""Snakemake glue (wattflex.smk): the exit hook that cancels the scheduler's pending timers."""

import threading
import types

from wattflex.smk import SCHEDULER_MODULE, release_scheduler_timers


def _callback(module: str):
    fn = types.FunctionType((lambda: None).__code__, {}, "release")
    fn.__module__ = module
    return fn


def test_release_cancels_only_the_schedulers_pending_timers():
    scheduler = threading.Timer(60, _callback(SCHEDULER_MODULE))
    other = threading.Timer(60, _callback("somebody.else"))
    scheduler.start()
    other.start()
    try:
        assert release_scheduler_timers() == 1
        scheduler.join(timeout=5)
        assert not scheduler.is_alive()  # cancelled: the interpreter need not wait for it
        assert other.is_alive() and not other.finished.is_set()
        assert release_scheduler_timers() == 0
    finally:
        other.cancel()


def test_the_snakefile_calls_it_when_a_run_ends():
    from pathlib import Path

    snakefile = (Path(__file__).resolve().parents[2] / "Snakefile").read_text()
    assert "onsuccess:\n    release_scheduler_timers()" in snakefile
    assert "onerror:\n    release_scheduler_timers()" in snakefile
