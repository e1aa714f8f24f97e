"""A run's id, the name of its directory under ``results/<campaign>/runs/<group>/``: written
and read back only here.

``cap<W>`` for a cap's first run, ``cap<W>_r<k>`` for its k-th repeat (k >= 1); ``<W>`` is the
cap in watts in ``:g`` form (``cap437.5``, ``cap1000``).
"""

from __future__ import annotations

import re

#: What a run id looks like (the Snakefile's ``{run}`` wildcard constraint).
RUN_ID_PATTERN = r"cap[0-9.]+(_r[0-9]+)?"
_PARSE = re.compile(r"cap(?P<cap>[0-9.]+)(?:_r(?P<repeat>[0-9]+))?")


def run_id(cap_w: float, repeat: int = 0) -> str:
    """The id of the ``repeat``-th run at ``cap_w`` watts."""
    # :g keeps 6 significant digits: exact for configured caps (whole or half watts within a
    # GPU's limit range), and an ingested 0.3 kW (300.00000000000006 W) still reads cap300
    return f"cap{cap_w:g}" + (f"_r{repeat}" if repeat else "")


def parse_run_id(rid: str) -> tuple[float, int]:
    """(cap_w, repeat) of a run id, the inverse of :func:`run_id`."""
    m = _PARSE.fullmatch(rid)
    if m is None:
        raise ValueError(f"run id {rid!r}: expected cap<watts> or cap<watts>_r<repeat> (e.g. cap437.5_r1)")
    return float(m["cap"]), int(m["repeat"] or 0)
