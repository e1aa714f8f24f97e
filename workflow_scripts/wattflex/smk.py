"""Glue between Snakemake and wattflex: logging to a rule's ``log:`` file, exiting
without the final garbage collection, and a SLURM job's Snakemake dying with its job script
(Snakemake's private internals: wattflex.snakemake_internals).

Rule scripts stay thin: ``log = rule_logger(snakemake)``, then library calls.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import gc
import logging
import os
import signal
import sys
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>: the signal this process gets when its parent exits


@functools.cache
def skip_exit_gc() -> None:
    """Spare this process the collector's passes over every live object when it exits.

    At exit the interpreter runs the garbage collector over all it holds: 0.22-0.27 s for a
    rule script that imported pandas and matplotlib (half of it each), ~0.5 s for a no-op
    ``snakemake -n`` with the default campaign's DAG, where the whole dry run takes ~3 s
    (measured on 2 cores). An atexit hook that calls ``gc.freeze()`` moves the live
    objects out of the collector's reach; atexit handlers, stream flushes and module
    teardown still run. Only reference cycles still alive at exit stay uncollected: an
    object in one is not finalized, so files are closed where they are written, never
    left to a finalizer. Registered once per process; the hook runs after those registered
    later (atexit is last-in, first-out)."""
    atexit.register(gc.freeze)


def rule_logger(smk: Any, name: str = "wattflex") -> logging.Logger:
    """Send logging (and stray stderr) of a rule script to its first ``log:`` file; the
    script then exits without the final garbage collection (``skip_exit_gc``)."""
    skip_exit_gc()
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.handlers.clear()
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    if getattr(smk, "log", None) and len(smk.log):
        fh = open(smk.log[0], "a", buffering=1)
        sys.stderr = fh
        handler: logging.Handler = logging.StreamHandler(fh)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(fmt)
    logger.addHandler(handler)
    logging.captureWarnings(True)
    return logger


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits (Linux
    ``prctl(PR_SET_PDEATHSIG)``), and send it now if the parent is already gone (this process
    reparented to init). False where prctl is not there (not Linux).

    Why: a SLURM job's own Snakemake (snakemake-executor-plugin-slurm's ``--executor
    slurm-jobstep``, started by the batch script) outlived a cancelled job. scancel's SIGTERM
    ends the batch shell first; its Snakemake, reparented to init, leaves the job's process tree,
    which is all ``ProctrackType=proctrack/linuxproc`` (SLURM's proctrack_linuxproc.c: the
    descendants of slurmstepd by parent pid) knows of, so KillWait's SIGKILL missed it. The
    setting survives exec and is cleared by fork: it is this process's alone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() == 1:  # the parent died before the call: nobody will signal us
        os.kill(os.getpid(), sig)
    return True


def in_slurm_job_step(argv: list[str] | None = None, environ: dict | None = None) -> bool:
    """Whether this process is the Snakemake a SLURM job runs (``--executor slurm-jobstep``
    inside an allocation: ``SLURM_JOB_ID`` set)."""
    argv = sys.argv if argv is None else argv
    environ = os.environ if environ is None else environ
    pairs = zip(argv, [*argv[1:], ""])
    jobstep = any(
        a == "--executor=slurm-jobstep" or (a == "--executor" and b == "slurm-jobstep")
        for a, b in pairs
    )
    return jobstep and bool(environ.get("SLURM_JOB_ID"))
