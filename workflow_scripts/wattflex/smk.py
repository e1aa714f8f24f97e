"""Glue between Snakemake and wattflex: logging to a rule's ``log:`` file, and exiting
without the final garbage collection (Snakemake's private internals: wattflex.snakemake_internals).

Rule scripts stay thin: ``log = rule_logger(snakemake)``, then library calls.
"""

from __future__ import annotations

import atexit
import functools
import gc
import logging
import sys
from typing import Any


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
