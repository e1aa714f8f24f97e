"""Meter baselines: what a utility says a site's load would have been during an event.

Demand-response programmes settle a site on delivered kW = baseline - metered load. Besides
wattflex's own curve baseline (the running jobs' uncapped power from their measured curves),
two meter baselines are computed here from a load history alone:

- **X of Y days** (``average_days``): the mean load in the event's window on the ``days``
  most recent eligible days before it (days with an event are not eligible). "10 of 10" is
  the form of CAISO's baseline, on which AEMO's wholesale demand response baselines are also
  built (AEMO, WDR Baseline Methodology Register).
- **Same-day adjustment** (``same_day_adjusted``): that baseline shifted by the difference
  between the event day's load and the baseline days' load in an adjustment window before
  the event, the shift limited to ``cap`` of the unadjusted baseline. The schema's window (3 h
  ending 1 h before the event) and 20 % cap are a common form, assumed; a programme's own
  rules set them.
- **Pre-event** (``pre_event``): the mean load of the ``pre_s`` seconds before the event, as
  ``wattflex.ops.services.mv`` reports it.

Times are seconds from the history's start; a day is 86,400 s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wattflex.schema import section_defaults

DAY_S = 86_400.0
_RULE = section_defaults("statement", "baseline")


@dataclass(frozen=True)
class BaselineRule:
    """An X-of-Y-days baseline and its same-day adjustment (config ``statement.baseline``;
    defaults: the schema's)."""

    days: int = _RULE["days"]  # eligible days averaged ("10 of 10")
    adjust_hours: float = _RULE["adjust_hours"]  # adjustment window length (h)
    adjust_gap_hours: float = _RULE[
        "adjust_gap_hours"
    ]  # the window ends this long before the event (h)
    cap: float = _RULE["cap"]  # the shift is at most this fraction of the baseline
    pre_s: float = _RULE["pre_s"]  # the pre-event baseline's window (s)

    def __post_init__(self) -> None:
        if (
            self.days < 1
            or self.adjust_hours <= 0
            or self.adjust_gap_hours < 0
            or not 0 <= self.cap <= 1
            or self.pre_s <= 0
        ):
            raise ValueError(f"baseline rule out of range: {self}")


def window_mean(t_s: np.ndarray, load_w: np.ndarray, start_s: float, end_s: float) -> float:
    """Mean load over ``[start_s, end_s)``; NaN when no sample falls there."""
    inside = (t_s >= start_s) & (t_s < end_s)
    return float(load_w[inside].mean()) if inside.any() else float("nan")


def eligible_days(event_day: int, event_days: set[int], days: int) -> list[int]:
    """The ``days`` most recent days before ``event_day`` without an event (fewer when the
    history is shorter)."""
    out = [d for d in range(event_day - 1, -1, -1) if d not in event_days]
    return out[:days]


def average_days(
    t_s: np.ndarray,
    load_w: np.ndarray,
    start_s: float,
    end_s: float,
    event_days: set[int],
    rule: BaselineRule,
) -> float:
    """The X-of-Y-days baseline of the event ``[start_s, end_s)``; NaN without enough history
    (fewer than ``rule.days`` eligible days)."""
    day = int(start_s // DAY_S)
    prior = eligible_days(day, event_days | {day}, rule.days)
    if len(prior) < rule.days:
        return float("nan")
    shift = (day - np.asarray(prior)) * DAY_S
    return float(np.mean([window_mean(t_s, load_w, start_s - s, end_s - s) for s in shift]))


def same_day_adjusted(
    t_s: np.ndarray,
    load_w: np.ndarray,
    start_s: float,
    end_s: float,
    event_days: set[int],
    rule: BaselineRule,
) -> float:
    """The X-of-Y-days baseline plus the event day's excess over its baseline days in the
    adjustment window, limited to ``rule.cap`` of the baseline."""
    base = average_days(t_s, load_w, start_s, end_s, event_days, rule)
    a_end = start_s - 3600.0 * rule.adjust_gap_hours
    a_start = a_end - 3600.0 * rule.adjust_hours
    today = window_mean(t_s, load_w, a_start, a_end)
    usual = average_days(t_s, load_w, a_start, a_end, event_days, rule)
    shift = float(np.clip(today - usual, -rule.cap * abs(base), rule.cap * abs(base)))
    return base + shift


def pre_event(t_s: np.ndarray, load_w: np.ndarray, start_s: float, rule: BaselineRule) -> float:
    """Mean load of the ``rule.pre_s`` seconds before the event."""
    return window_mean(t_s, load_w, start_s - rule.pre_s, start_s)
