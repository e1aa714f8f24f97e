"""A run's id, the name of its directory under ``results/<campaign>/runs/<group>/``: written
and read back only here.

``cap<W>`` for a cap's first run, ``cap<W>_r<k>`` for its k-th repeat (k >= 1); ``<W>`` is the
cap in watts in ``:g`` form (``cap437.5``, ``cap1000``). A clock group's (``knob: clock``)
are ``clk<MHz>`` and ``clk<MHz>_r<k>``: the locked SM clock in MHz (``clk1200``).
"""

from __future__ import annotations

import re

from wattflex.schema import group_default

#: What a run id looks like (the Snakefile's ``{run}`` wildcard constraint).
RUN_ID_PATTERN = r"(cap|clk)[0-9.]+(_r[0-9]+)?"
_PARSE = re.compile(r"(?P<knob>cap|clk)(?P<cap>[0-9.]+)(?:_r(?P<repeat>[0-9]+))?")
_PREFIX = {"cap": "cap", "clock": "clk"}


def run_id(setpoint: float, repeat: int = 0, knob: str = group_default("knob")) -> str:
    """The id of the ``repeat``-th run at ``setpoint``: a cap in watts, or (``knob="clock"``)
    a locked SM clock in MHz."""
    # :g keeps 6 significant digits: exact for configured caps (whole or half watts within a
    # GPU's limit range), and an ingested 0.3 kW (300.00000000000006 W) still reads cap300
    return f"{_PREFIX[knob]}{setpoint:g}" + (f"_r{repeat}" if repeat else "")


def parse_run_id(rid: str) -> tuple[float, int]:
    """(setpoint, repeat) of a run id, the inverse of :func:`run_id` (the cap in W, or for a
    ``clk`` id the clock in MHz: :func:`run_knob` says which)."""
    m = _PARSE.fullmatch(rid)
    if m is None:
        raise ValueError(
            f"run id {rid!r}: expected cap<watts> or cap<watts>_r<repeat> (e.g. cap437.5_r1), "
            f"or clk<MHz>[_r<repeat>] for a clock group"
        )
    return float(m["cap"]), int(m["repeat"] or 0)


def run_knob(rid: str) -> str:
    """``cap`` or ``clock``: the knob a run id's setpoint is of."""
    parse_run_id(rid)
    return "clock" if rid.startswith("clk") else "cap"


def cap_rows(runs):
    """The rows of a runs table (``runs.parquet``, ``pfi.parquet``) that are cap groups': a ``knob:
    clock`` group's runs all sit at the default limit (their setpoint is ``clock_mhz``), so no cap
    curve or cap analysis takes them; the knob menu (``wattflex.allocation.knobs``) takes their
    clock curve."""
    return runs[runs["knob"].ne("clock")] if "knob" in runs.columns else runs
