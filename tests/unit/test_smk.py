"""Snakemake glue: the exit hook that cancels the scheduler's pending timers
(wattflex.snakemake_internals), and the exit without a final garbage collection (wattflex.smk)."""

import subprocess
import sys
import threading
import types
from pathlib import Path

from wattflex.snakemake_internals import SCHEDULER_MODULE, release_scheduler_timers

ROOT = Path(__file__).resolve().parents[2]


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
    snakefile = (ROOT / "Snakefile").read_text()
    assert "onsuccess:\n    release_scheduler_timers()" in snakefile
    assert "onerror:\n    release_scheduler_timers()" in snakefile


EXIT_PROBE = """
import atexit, gc, logging, sys, types
# registered first, so it runs last: after skip_exit_gc's hook and logging's shutdown
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, "| log:", open(log).read().strip()))
from wattflex.smk import rule_logger, skip_exit_gc
log = sys.argv[1]
rule_logger(types.SimpleNamespace(log=[log])).info("written")
skip_exit_gc()  # a second call registers nothing more
print("frozen before exit:", gc.get_freeze_count() > 0, "| exit hooks:", atexit._ncallbacks())
"""


def test_a_rule_script_exits_without_collecting_and_loses_no_log_line(tmp_path):
    log = tmp_path / "rule.log"
    out = subprocess.run(
        [sys.executable, "-c", EXIT_PROBE, str(log)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.splitlines()
    assert out[0].startswith("frozen before exit: False")
    before = subprocess.run(
        [sys.executable, "-c", "import atexit, logging; print(atexit._ncallbacks())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out[0].endswith(f"exit hooks: {int(before) + 2}")  # the probe's own, and one freeze hook
    assert out[1].startswith("frozen at exit: True") and out[1].endswith("INFO written")


def test_snakemake_exits_without_collecting_too():
    common = (ROOT / "rules" / "common" / "setup.smk").read_text()
    assert "\nskip_exit_gc()\n" in common
