"""Glue for rule scripts: logging to the rule's ``log:`` file.

Rule scripts stay thin: ``log = rule_logger(snakemake)``, then library calls.
"""

from __future__ import annotations

import logging
import sys
from typing import Any


def rule_logger(smk: Any, name: str = "wattflex") -> logging.Logger:
    """Send logging (and stray stderr) of a rule script to its first ``log:`` file."""
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
