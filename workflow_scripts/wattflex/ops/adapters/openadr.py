"""OpenADR 2.0b signal adapter: a VEN (``openleadr.OpenADRClient``) feeding the event model.

The VEN runs in a thread of its own (openleadr is asyncio; the control loop is not). Each
``oadrDistributeEvent`` becomes :class:`wattflex.ops.events.Event` objects, one per
interval of the event's signal:

- ``LOAD_DISPATCH`` / ``setpoint``: the interval's payload is the target in kW;
- ``LOAD_CONTROL`` / ``x-loadControlCapacity``: the payload is the fraction of the
  baseline to keep (0 < f < 1);

ramp limit and deadline come from the VEN's settings (OpenADR 2.0b carries no response
deadline; its ``rampUp`` is a *notice* before the start, not a rate). The event is opted
in when :func:`wattflex.ops.events.check_schedule` accepts it beside the events already
held, and opted out (with the reason logged, nothing changed) when not: unsupported
signals, an event already over, an overlap. A ``cancelled`` event is dropped at once (the
controller restores). Measured load is reported back as a ``TELEMETRY_USAGE`` report of
``powerReal`` (RealPower) in W, sampled every control period.

**Dropped connection.** Events are held locally with their end times: a VTN that stops
answering cannot extend or cancel them, so the controller follows what it received to
its end and then restores; it never holds a cap past a received end. ``last_poll_ok``
says when the VTN last answered.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from wattflex.ops.events import Event, Schedule, ScheduleError, check_schedule
from wattflex.schema import section_defaults

log = logging.getLogger("wattflex.ops.adapters.openadr")

SIGNALS = {
    ("LOAD_DISPATCH", "setpoint"): "target_kw",
    ("LOAD_CONTROL", "x-loadControlCapacity"): "fraction",
}


@dataclass
class VenSettings:
    ven_name: str
    vtn_url: str
    floor_w: float  # the GPUs' floor (every GPU at its minimum cap)
    basis_w: float  # what fractions apply to
    period_s: float = section_defaults("control", "controller")[
        "period_s"
    ]  # the controller's period
    ramp_w_per_s: float = math.inf
    deadline_s: float = math.inf
    # the longest one request to the VTN may take (a poll, a report): a VTN that accepts the
    # connection and never answers must not stop the VEN from polling again
    request_timeout_s: float = 10.0


class LiveSchedule:
    """A schedule that the VEN changes while the controller reads it (thread-safe); times
    are seconds from ``t0_wall`` (the controller's start)."""

    def __init__(self, t0_wall: datetime | None = None):
        self.t0_wall = t0_wall or datetime.now(UTC)
        self._events: dict[str, tuple[Event, ...]] = {}
        self._lock = threading.Lock()

    @property
    def schedule(self) -> Schedule:
        with self._lock:
            return Schedule(
                tuple(e for evs in self._events.values() for e in evs), source="openadr"
            )

    @property
    def events(self) -> tuple[Event, ...]:
        return self.schedule.events

    def budget(self, t_s: Any, basis_w: float) -> np.ndarray:
        return self.schedule.budget(t_s, basis_w)

    def active(self, t_s: Any) -> np.ndarray:
        return self.schedule.active(t_s)

    def offer(
        self, event_id: str, events: tuple[Event, ...], s: VenSettings
    ) -> tuple[bool, list[str]]:
        """Take the event if the schedule with it passes the checks; ``(taken, messages)``."""
        with self._lock:
            now_s = (datetime.now(UTC) - self.t0_wall).total_seconds()
            others = tuple(
                e
                for k, evs in self._events.items()
                if k != event_id
                for e in evs
                if e.end_s > now_s
            )
            try:
                shifted = Schedule(tuple(_shift(e, -now_s) for e in others + events))
                checked = check_schedule(shifted, s.floor_w, s.basis_w, s.period_s)
            except ScheduleError as exc:
                return False, [str(exc)]
            self._events[event_id] = events
            return True, checked.warnings

    def drop(self, event_id: str) -> None:
        with self._lock:
            self._events.pop(event_id, None)

    def rebase(self, t0_wall: datetime) -> None:
        """Count from ``t0_wall`` (the control loop's start) from now on."""
        with self._lock:
            by = (self.t0_wall - t0_wall).total_seconds()
            self._events = {k: tuple(_shift(e, by) for e in evs) for k, evs in self._events.items()}
            self.t0_wall = t0_wall


def _shift(e: Event, by_s: float) -> Event:
    from dataclasses import replace

    return replace(e, start_s=e.start_s + by_s, end_s=e.end_s + by_s)


def aware(at: datetime, where: str) -> datetime:
    """``at``, refused with one line when it carries no UTC offset (a time of no zone cannot
    be placed: subtracting it from an aware time raises ``TypeError``)."""
    if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
        raise ScheduleError(f"{where}: start {at} has no UTC offset (the VTN must send one)")
    return at


# What a malformed event raises on its way to Events besides ScheduleError: a field missing
# (KeyError), of the wrong type (TypeError, AttributeError) or value (ValueError).
BAD_EVENT = (ScheduleError, KeyError, TypeError, AttributeError, ValueError)


def events_from_openadr(
    event: dict[str, Any], s: VenSettings, t0_wall: datetime
) -> tuple[Event, ...]:
    """The intervals of an openleadr event dict as events (seconds from ``t0_wall``)."""
    eid = str(event["event_descriptor"]["event_id"])
    out = []
    for sig in event.get("event_signals", []):
        kind = SIGNALS.get((sig.get("signal_name"), sig.get("signal_type")))
        if kind is None:
            raise ScheduleError(
                f"event {eid!r}: signal {sig.get('signal_name')}/{sig.get('signal_type')} is not a load "
                f"target (wattflex follows {', '.join('/'.join(k) for k in SIGNALS)})"
            )
        for k, iv in enumerate(sig["intervals"]):
            start = (aware(iv["dtstart"], f"event {eid!r}: interval {k}") - t0_wall).total_seconds()
            end = start + iv["duration"].total_seconds()
            value = float(iv["signal_payload"])
            out.append(
                Event(
                    f"{eid}" if len(sig["intervals"]) == 1 else f"{eid}.{k}",
                    start,
                    end,
                    target_w=value * 1e3 if kind == "target_kw" else None,
                    fraction=value if kind == "fraction" else None,
                    ramp_w_per_s=s.ramp_w_per_s,
                    deadline_s=s.deadline_s,
                )
            )
    if not out:
        raise ScheduleError(f"event {eid!r}: no signal")
    return tuple(out)


class OpenADRVen:
    """The VEN in a background thread: ``start()``, ``stop()``; ``live`` is the schedule it
    feeds; ``load_w()`` (called from its thread) gives the measured load it reports."""

    def __init__(
        self, settings: VenSettings, load_w: Callable[[], float], live: LiveSchedule | None = None
    ):
        self.s, self.load_w = settings, load_w
        self.live = live or LiveSchedule()
        self.responses: dict[str, str] = {}
        self.messages: list[str] = []
        self.last_poll_ok: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._ready = threading.Event()
        self._stopping = False
        self.registered = False

    async def on_event(self, event: dict[str, Any]) -> str:
        eid = str(event["event_descriptor"]["event_id"])
        if str(event["event_descriptor"].get("event_status", "")).lower() == "cancelled":
            self.live.drop(eid)
            self.messages.append(f"event {eid!r} cancelled: dropped")
            self.responses[eid] = "optIn"
            return "optIn"
        try:
            events = events_from_openadr(event, self.s, self.live.t0_wall)
            taken, msgs = self.live.offer(eid, events, self.s)
        except ScheduleError as exc:
            taken, msgs = False, [str(exc)]
        except BAD_EVENT as exc:  # one bad event is refused; the VEN goes on
            taken, msgs = False, [f"event {eid!r} cannot be used ({type(exc).__name__}: {exc})"]
        for m in msgs:
            log.info(  # accepted or refused: the VEN's normal work
                "OpenADR %s", m
            )
        self.messages += msgs
        self.responses[eid] = "optIn" if taken else "optOut"
        return self.responses[eid]

    def _report(self) -> float:
        return float(self.load_w())

    async def _main(self) -> None:
        from openleadr import OpenADRClient, enums

        client = OpenADRClient(ven_name=self.s.ven_name, vtn_url=self.s.vtn_url)
        client.add_handler("on_event", self.on_event)
        client.add_handler("on_update_event", self.on_event)
        client.add_report(
            callback=self._report,
            resource_id="wattflex-gpus",
            measurement=enums.MEASUREMENTS.POWER_REAL,
            unit="W",
            sampling_rate=timedelta(seconds=max(self.s.period_s, 1.0)),
        )
        poll = client._poll

        async def watched_poll() -> None:  # when the VTN last answered a poll
            try:
                async with asyncio.timeout(self.s.request_timeout_s):
                    await poll()
            except TimeoutError:
                log.warning(
                    "OpenADR VTN %s: no answer to a poll in %g s; held events are followed "
                    "to their end, the next poll goes on",
                    self.s.vtn_url,
                    self.s.request_timeout_s,
                )
                return
            except asyncio.CancelledError:
                if not self._stopping:
                    raise
                return  # stopped mid-poll: not a failed job for openleadr's scheduler to log
            self.last_poll_ok = time.monotonic()

        client._poll = watched_poll
        self._client = client
        try:
            await client.run()
        finally:
            self.registered = bool(client.registration_id)
            self._ready.set()

    def start(self, timeout_s: float = 30.0) -> None:
        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._loop.create_task(self._main())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="openadr-ven", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s) or not self.registered:
            self.stop()
            raise ConnectionError(
                f"OpenADR VTN {self.s.vtn_url}: no registration within {timeout_s:g} s "
                f"(is the VTN running, and is this its OpenADR2/Simple/2.0b URL?)"
            )

    async def _shutdown(self) -> None:
        """openleadr's stop, then every task still on the VEN's loop (a poll in flight)
        cancelled and awaited, so none is left pending when the loop stops."""
        await self._client.stop()
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def stop(self) -> None:
        if self._loop is None:
            return
        self._stopping = True
        if self._client is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
