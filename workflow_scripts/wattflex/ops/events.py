"""The grid event model: what every signal adapter (schedule file, OpenADR) produces.

An :class:`Event` asks for the load to be at or below a target from ``start_s + deadline_s``
until ``end_s``: a target in W (``target_w``) or a ``fraction`` of the baseline (the
uncapped load when the event starts). ``ramp_w_per_s`` limits how fast the load is taken
down at the start and brought back at the end (synchronised training jobs swing grid load,
arXiv 2508.14318): the budget handed to the controller walks from the baseline to the
target at that rate, and back after ``end_s``. Times are seconds from the controller's
start.

A :class:`Schedule` is a list of events that do not overlap. Its ``budget(t, basis_w)``
(W, ``inf`` = no event) and ``active(t)`` are the interface the controller loop and the
cluster simulation read; a :class:`Signal` (the ``time_s,fraction`` CSV) offers the same two
methods, so either drives both. The controller, the simulation, the adapters and the M&V all
take events from here: nothing in this module imports them.

:func:`read_schedule` reads a CSV or JSON file of events (or, for the legacy
``time_s,fraction`` CSV, returns its :class:`Signal`). :func:`check_schedule` finds what
is wrong with a schedule before anything is capped: overlapping or past events and
unordered times are refused (:class:`ScheduleError`, one line naming the event); a target
below the GPUs' floors or a deadline the ramp cannot meet is a warning (the GPUs are held
at their floors / the load follows the ramp and misses the deadline, and the M&V record
shows it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from wattflex.ingest.reader import (
    MAX_DOC_BYTES,
    check_input_file,
    read_csv_named,
    read_input_text,
    strip_columns,
)

# Columns / keys of an event in a schedule file; kW in files, W inside.
EVENT_KEYS = (
    "event_id",
    "start_s",
    "end_s",
    "start",
    "end",
    "target_kw",
    "fraction",
    "ramp_kw_per_s",
    "deadline_s",
)


# The longest span a schedule, a control run or one of its waits may have: a leap year. No grid
# event lasts longer, and every time derived from it stays far inside time_t and
# threading.TIMEOUT_MAX (a start or period of 1e300 s overflowed them).
MAX_SPAN_S = 8784 * 3600.0


class ScheduleError(ValueError):
    """A schedule that cannot be followed safely (one line: which event, what, what to do)."""


@dataclass(frozen=True)
class Signal:
    """A budget signal: ``fraction`` of a basis power at ``time_s``, piecewise linear between
    rows (two rows at the same time make a step); before the first row the first value
    holds, after the last row the last one. A fraction >= 1 means no curtailment."""

    time_s: np.ndarray
    fraction: np.ndarray

    @property
    def duration_s(self) -> float:
        return float(self.time_s[-1])

    def at(self, t_s: np.ndarray | float) -> np.ndarray:
        t = np.asarray(t_s, float)
        # a step (repeated time) takes its new value from the step on
        return np.interp(t + 1e-9, self.time_s, self.fraction)

    def budget(self, t_s: np.ndarray | float, basis_w: float) -> np.ndarray:
        """Budget in W (inf: no curtailment), the interface of :class:`Schedule`."""
        f = self.at(t_s)
        return np.where(f < 1.0, f * basis_w, np.inf)

    def active(self, t_s: np.ndarray | float) -> np.ndarray:
        return self.at(t_s) < 1.0


def read_signal(path: str | Path) -> Signal:
    """Read a signal CSV with columns ``time_s,fraction`` (``#`` comment lines allowed)."""
    df = read_csv_named(path, "signal", comment="#")
    missing = {"time_s", "fraction"} - set(df.columns)
    if missing:
        raise ValueError(
            f"signal {path}: missing column(s) {', '.join(sorted(missing))} (need time_s,fraction)"
        )
    t, f = df["time_s"].to_numpy(float), df["fraction"].to_numpy(float)
    if len(t) == 0 or not (np.isfinite(t).all() and np.isfinite(f).all()):
        raise ValueError(f"signal {path}: empty or non-numeric time_s/fraction")
    if (np.diff(t) < 0).any():
        raise ValueError(
            f"signal {path}: time_s must not decrease (row {int(np.argmax(np.diff(t) < 0)) + 3})"
        )
    if t[-1] < 0:  # its length is its last time: it would run "for -50 s"
        raise ValueError(
            f"signal {path}: time_s ends at {t[-1]:g} s, before the start: times are seconds "
            "from the start, the last one >= 0"
        )
    if (f <= 0).any() or (f > 2).any():
        raise ValueError(f"signal {path}: fraction must be in (0, 2], got {f.min():g}..{f.max():g}")
    return Signal(t, f)


@dataclass(frozen=True)
class Event:
    event_id: str
    start_s: float
    end_s: float
    target_w: float | None = None  # absolute target for these GPUs, W
    fraction: float | None = None  # or: fraction of the baseline (uncapped load at the start)
    ramp_w_per_s: float = math.inf  # largest change of the budget per second, down and up
    deadline_s: float = math.inf  # at or below target from start_s + deadline_s on

    def __post_init__(self) -> None:
        where = f"event {self.event_id!r}"
        if (self.target_w is None) == (self.fraction is None):
            raise ScheduleError(f"{where}: give exactly one of target_kw and fraction")
        if (
            not (math.isfinite(self.start_s) and math.isfinite(self.end_s))
            or self.end_s <= self.start_s
        ):
            raise ScheduleError(
                f"{where}: end ({self.end_s:g} s) must be after start ({self.start_s:g} s)"
            )
        if self.end_s > MAX_SPAN_S:  # a past one is said "ended" by check_schedule
            raise ScheduleError(
                f"{where}: end {self.end_s:g} s lies more than a year ({MAX_SPAN_S:g} s) "
                "ahead: give times within it"
            )
        if self.target_w is not None and not (math.isfinite(self.target_w) and self.target_w > 0):
            raise ScheduleError(
                f"{where}: target_kw must be a finite number > 0, got {self.target_w / 1e3:g}"
            )
        if self.fraction is not None and not (0 < self.fraction < 1):
            raise ScheduleError(
                f"{where}: fraction must be in (0, 1) (a share of the baseline), got {self.fraction:g}"
            )
        if not self.ramp_w_per_s > 0:
            raise ScheduleError(f"{where}: ramp_kw_per_s must be > 0 (leave it empty for no limit)")
        if not self.deadline_s >= 0:
            raise ScheduleError(f"{where}: deadline_s must be >= 0 (leave it empty for none)")

    def target_for(self, basis_w: float) -> float:
        """The target in W for a baseline of ``basis_w``."""
        return float(self.target_w) if self.target_w is not None else float(self.fraction) * basis_w

    def ramp_s(self, basis_w: float) -> float:
        """Seconds the ramp limit needs to take ``basis_w`` down to the target."""
        return max(basis_w - self.target_for(basis_w), 0.0) / self.ramp_w_per_s

    def budget(self, t_s: np.ndarray, basis_w: float) -> np.ndarray:
        """Budget (W) at ``t_s``: inf outside the event and its ramp back, the ramp from the
        baseline down to the target after the start, the ramp back up after the end."""
        t = np.asarray(t_s, float)
        target = self.target_for(basis_w)
        inside = (t >= self.start_s) & (t < self.end_s)
        if not math.isfinite(self.ramp_w_per_s):
            return np.where(inside, target, np.inf)
        down = np.maximum(basis_w - self.ramp_w_per_s * (t - self.start_s), target)
        at_end = max(basis_w - self.ramp_w_per_s * (self.end_s - self.start_s), target)
        up = at_end + self.ramp_w_per_s * (t - self.end_s)
        b = np.where(inside, down, up)
        return np.where((t >= self.start_s) & (inside | (b < basis_w)), b, np.inf)


@dataclass(frozen=True)
class Schedule:
    events: tuple[Event, ...]
    source: str = "schedule"

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", tuple(sorted(self.events, key=lambda e: e.start_s)))

    @property
    def duration_s(self) -> float:
        return max((e.end_s for e in self.events), default=0.0)

    def budget(self, t_s: np.ndarray | float, basis_w: float) -> np.ndarray:
        """The tightest budget of the events at ``t_s`` (inf: none)."""
        t = np.asarray(t_s, float)
        out = np.full(t.shape, np.inf)
        for e in self.events:
            out = np.minimum(out, e.budget(t, basis_w))
        return out

    def active(self, t_s: np.ndarray | float) -> np.ndarray:
        """True inside an event [start, end)."""
        t = np.asarray(t_s, float)
        out = np.zeros(t.shape, bool)
        for e in self.events:
            out |= (t >= e.start_s) & (t < e.end_s)
        return out

    def event_at(self, t_s: float) -> Event | None:
        return next((e for e in self.events if e.start_s <= t_s < e.end_s), None)


# ---------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------


def _number(row: Mapping[str, Any], key: str, where: str) -> float | None:
    """``row[key]`` as a finite number, None when absent or blank. JSON's ``NaN`` and
    ``Infinity`` (Python's json reads them) are refused, never taken for a blank: a ramp limit
    or deadline of NaN was silently none."""
    v = row.get(key)
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    if isinstance(v, bool):  # JSON true/false: float() would follow true as 1
        raise ScheduleError(f"{where}: {key} {str(v).lower()} is not a number")  # as JSON spells it
    try:
        number = float(v)
    except (TypeError, ValueError):
        raise ScheduleError(f"{where}: {key} {v!r} is not a number") from None
    if not math.isfinite(number):
        raise ScheduleError(f"{where}: {key} {v!r} is not a finite number (leave it out for none)")
    return number


def _time(row: Mapping[str, Any], key: str, where: str, now: datetime) -> float | None:
    """``start_s``/``end_s`` (seconds from now) or ``start``/``end`` (ISO 8601 with a zone)."""
    rel = _number(row, f"{key}_s", where)
    stamp = row.get(key)
    if rel is not None and stamp not in (None, ""):
        raise ScheduleError(
            f"{where}: give {key}_s (seconds from the start) or {key} (a time), not both"
        )
    if rel is not None or stamp in (None, "") or (isinstance(stamp, float) and math.isnan(stamp)):
        return rel
    try:
        at = datetime.fromisoformat(str(stamp))
    except ValueError:
        raise ScheduleError(
            f"{where}: {key} {stamp!r} is not an ISO 8601 time (e.g. 2027-01-15T17:00:00+00:00)"
        ) from None
    if at.tzinfo is None:
        raise ScheduleError(f"{where}: {key} {stamp!r} has no time zone (write +00:00 or Z)")
    return (at - now).total_seconds()


def event_from_row(row: Mapping[str, Any], where: str, now: datetime | None = None) -> Event:
    """One event from a schedule row / JSON object (kW and seconds, see ``EVENT_KEYS``)."""
    now = now or datetime.now(UTC)
    unknown = set(row) - set(EVENT_KEYS)
    if unknown:
        blank = sorted(k for k in unknown if isinstance(k, str) and k.strip() in EVENT_KEYS)
        if blank:
            raise ScheduleError(
                f"{where}: key(s) {', '.join(map(repr, blank))} have blanks around them: "
                f"write {', '.join(repr(k.strip()) for k in blank)}"
            )
        raise ScheduleError(
            f"{where}: unknown key(s) {', '.join(map(repr, sorted(map(str, unknown))))} "
            f"(known: {', '.join(EVENT_KEYS)})"
        )
    start, end = _time(row, "start", where, now), _time(row, "end", where, now)
    if start is None or end is None:
        raise ScheduleError(f"{where}: needs a start and an end (start_s/end_s or start/end)")
    target_kw, ramp_kw = _number(row, "target_kw", where), _number(row, "ramp_kw_per_s", where)
    deadline = _number(row, "deadline_s", where)
    eid = row.get("event_id")
    try:
        return _event(
            eid, where, start, end, target_kw, _number(row, "fraction", where), ramp_kw, deadline
        )
    except ScheduleError as exc:
        raise ScheduleError(f"{where}: {exc}") from None


def _event(
    eid: Any,
    where: str,
    start: float,
    end: float,
    target_kw: float | None,
    fraction: float | None,
    ramp_kw: float | None,
    deadline: float | None,
) -> Event:
    return Event(
        event_id=str(eid)
        if eid not in (None, "") and not (isinstance(eid, float) and math.isnan(eid))
        else where,
        start_s=start,
        end_s=end,
        target_w=None if target_kw is None else target_kw * 1e3,
        fraction=fraction,
        ramp_w_per_s=math.inf if ramp_kw is None else ramp_kw * 1e3,
        deadline_s=math.inf if deadline is None else deadline,
    )


def read_schedule(path: str | Path, now: datetime | None = None):
    """A :class:`Schedule` from a CSV (one event per row) or JSON (``{"events": [...]}``) file;
    the legacy ``time_s,fraction`` CSV comes back as its :class:`Signal`."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        try:
            doc = json.loads(read_input_text(path, "schedule"))
        except json.JSONDecodeError as exc:
            raise ScheduleError(f"schedule {path}: not valid JSON ({exc})") from None
        rows = doc.get("events") if isinstance(doc, dict) else None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ScheduleError(
                f'schedule {path}: expected {{"events": [{{"start_s": ..., "end_s": ..., ...}}]}}'
            )
    else:
        check_input_file(path, "schedule", MAX_DOC_BYTES)
        df = strip_columns(
            read_csv_named(path, "schedule", comment="#", dtype=str, keep_default_na=False),
            f"schedule {path}",
        )  # `event_id, start_s` names start_s
        if (
            {"time_s", "fraction"} <= set(df.columns)
            and "start_s" not in df.columns
            and "start" not in df.columns
        ):
            return read_signal(path)
        rows = df.to_dict("records")
    if not rows:
        raise ScheduleError(f"schedule {path}: no events")
    line = 1 if path.suffix.lower() == ".json" else 2
    events = [
        event_from_row(
            r,
            f"schedule {path}: event {i + 1}"
            if path.suffix.lower() == ".json"
            else f"schedule {path}: row {i + line}",
            now,
        )
        for i, r in enumerate(rows)
    ]
    return Schedule(tuple(events), source=str(path))


# ---------------------------------------------------------------------------------------
# Checking
# ---------------------------------------------------------------------------------------


@dataclass
class ScheduleCheck:
    warnings: list[str] = field(default_factory=list)
    schedule: Schedule | None = None


# A target this many times what the GPUs draw at their largest limits is a unit slip (W written
# where kW is read: 1000 for 1 kW), not a target; from 1x to this a target curtails nothing.
UNIT_SLIP_RATIO = 10.0


def check_target_units(target_w: float, ceiling_w: float | None, what: str, unit: str) -> None:
    """Refuse a target over :data:`UNIT_SLIP_RATIO` times ``ceiling_w`` (the sum of the GPUs'
    largest power limits) with the hint that names the unit ``what`` is read in."""
    if ceiling_w and math.isfinite(target_w) and target_w > UNIT_SLIP_RATIO * ceiling_w:
        raise ScheduleError(
            f"{what} is {target_w / ceiling_w:,.0f}x the {ceiling_w / 1e3:.4g} kW these GPUs "
            f"draw at their largest limits: {unit} (written in the wrong unit?)"
        )


def check_schedule(
    schedule: Schedule,
    floor_w: float,
    basis_w: float,
    period_s: float,
    settle_s: float = 2.0,
    ceiling_w: float | None = None,
) -> ScheduleCheck:
    """Refuse what cannot be followed (overlap, an event already over, a target far above what
    the GPUs can draw, ``ceiling_w``: a unit slip); warn about what can only be followed safely
    (a target below the floors: held at the floors; a deadline the ramp cannot meet: the ramp
    is kept, the deadline likely missed, the M&V measures it; a target above ``ceiling_w``:
    nothing is curtailed). An event already under way starts now. ``settle_s``: the firmware's
    time to act on a cap (~2 s, SETTLE_TAU_S)."""
    out = ScheduleCheck()
    kept: list[Event] = []
    for e in schedule.events:
        where = f"event {e.event_id!r}"
        if e.target_w is not None:
            check_target_units(
                e.target_w,
                ceiling_w,
                f"{where}: target_kw {e.target_w / 1e3:g}",
                f"target_kw is kW ({e.target_w / 1e3:g} W is {e.target_w / 1e6:g} kW)",
            )
            if ceiling_w and e.target_w >= ceiling_w:
                out.warnings.append(
                    f"{where}: target {e.target_w / 1e3:g} kW is at or above the "
                    f"{ceiling_w / 1e3:.4g} kW these GPUs draw at their largest limits: "
                    "nothing is curtailed"
                )
        if e.end_s <= 0:
            raise ScheduleError(
                f"{where} ended {-e.end_s:.0f} s ago (end {e.end_s:g} s): remove it or fix its times"
            )
        if e.start_s < 0:
            out.warnings.append(f"{where} started {-e.start_s:.0f} s ago: it is followed from now")
        if kept and e.start_s < kept[-1].end_s:
            raise ScheduleError(
                f"{where} (start {e.start_s:g} s) overlaps event {kept[-1].event_id!r} (ends "
                f"{kept[-1].end_s:g} s): one target at a time; merge or move them"
            )
        target = e.target_for(basis_w)
        if target < floor_w:
            out.warnings.append(
                f"{where}: target {target:.0f} W is below the GPUs' floor of {floor_w:.0f} W (every "
                f"GPU at its minimum cap): they are held at their floors, the load stays above target"
            )
        need = e.ramp_s(basis_w) + period_s + settle_s
        if need > e.deadline_s:
            out.warnings.append(
                f"{where}: the ramp of {e.ramp_w_per_s / 1e3:g} kW/s from {basis_w:.0f} W to "
                f"{target:.0f} W with a {period_s:g} s control period needs {need:.1f} s, over the "
                f"{e.deadline_s:g} s deadline (the firmware's {settle_s:g} s to act included): "
                f"the ramp is kept, so the deadline is likely missed; the M&V says whether it was"
            )
        kept.append(e if e.start_s >= 0 else replace(e, start_s=0.0))
    out.schedule = Schedule(tuple(kept), schedule.source)
    return out


def windows(
    source: Any, t_s: np.ndarray, default_deadline_s: float = math.inf, basis_w: float | None = None
) -> list[dict[str, Any]]:
    """The events of a schedule, or the spans where a legacy signal curtails (``active``),
    as ``{event_id, start_s, end_s, deadline_s}``, with the event's ``target_w`` when the
    basis is known (else M&V takes the lowest budget of the event)."""
    if isinstance(source, Schedule):
        return [
            {
                "event_id": e.event_id,
                "start_s": e.start_s,
                "end_s": e.end_s,
                "deadline_s": e.deadline_s if math.isfinite(e.deadline_s) else default_deadline_s,
                **({"target_w": e.target_for(basis_w)} if basis_w is not None else {}),
            }
            for e in source.events
        ]
    act = np.asarray(source.active(t_s), bool)
    edges = np.flatnonzero(np.diff(np.r_[False, act, False].astype(int)))
    return [
        {
            "event_id": f"event{i + 1}",
            "start_s": float(t_s[a]),
            "end_s": float(t_s[b - 1] + (t_s[1] - t_s[0] if len(t_s) > 1 else 1.0)),
            "deadline_s": default_deadline_s,
        }
        for i, (a, b) in enumerate(zip(edges[::2], edges[1::2]))
    ]


def ramp_at(source: Any, t_s: float) -> float:
    """The ramp limit (W/s) in force at ``t_s``: that of the latest event started by then (its
    ramp back and the restore after it included); inf for a source without events."""
    started = [e for e in getattr(source, "events", ()) if e.start_s <= t_s]
    return float(started[-1].ramp_w_per_s) if started else math.inf


def event_end(source: Any, t_s: float) -> float | None:
    """End (s) of the event in force at ``t_s``: a schedule's event, or the end of a signal's
    curtailment span (searched on a 1-s grid)."""
    event_at = getattr(source, "event_at", None)
    if event_at is not None:
        e = event_at(t_s)
        return None if e is None else e.end_s
    if not bool(np.asarray(source.active(t_s))):
        return None
    grid = np.arange(t_s, t_s + 7 * 86400.0, 1.0)
    off = np.flatnonzero(~np.asarray(source.active(grid), bool))
    return float(grid[off[0]]) if len(off) else float(grid[-1])


def signal_end_s(schedule, basis_w: float, extra_s: float) -> float:
    """When a schedule's last event has ramped back, plus ``extra_s`` (staggered restore)."""
    ends = [
        e.end_s + (e.ramp_s(basis_w) if math.isfinite(e.ramp_w_per_s) else 0.0)
        for e in schedule.events
    ]
    return max(ends, default=0.0) + extra_s
