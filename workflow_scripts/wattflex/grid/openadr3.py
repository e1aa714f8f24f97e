"""OpenADR 3 signal adapter: a VEN polling a VTN's REST API with ``toadr3`` (its pydantic
models of the 3.0 objects validate what the VTN sends).

``openadr3-client``, the library the issue names, needs Python >= 3.12 (this project
supports 3.11), so the VEN uses ``toadr3``, the other maintained OpenADR 3 client on PyPI.

Every ``poll_s`` the VEN reads ``GET /events?programID=...``. An event's intervals whose
payload is ``IMPORT_CAPACITY_LIMIT`` (kW, the OpenADR 3 load cap; W when the event's
payload descriptor says ``units: W``) become :class:`wattflex.grid.events.Event` objects,
through the same checks as a schedule (:meth:`wattflex.grid.openadr.LiveSchedule.offer`);
an event the VTN no longer lists is dropped (the controller restores). While an event is
active the VEN posts a ``DEMAND`` report (the measured load in kW) when the event asks for
one (``reportDescriptors``). As with OpenADR 2.0b, events are held locally with their end
times: a VTN that stops answering leaves them followed to their end, never past it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

from wattflex.grid.events import Event, ScheduleError
from wattflex.grid.openadr import LiveSchedule, VenSettings

log = logging.getLogger("wattflex.grid.openadr3")

PAYLOAD = "IMPORT_CAPACITY_LIMIT"
REPORT = "DEMAND"


def events_from_oadr3(event: Any, s: VenSettings, t0_wall: datetime) -> tuple[Event, ...]:
    """A ``toadr3.models.Event``'s capacity-limit intervals as events (seconds from ``t0_wall``).
    Intervals without their own period follow one another from the event's period."""
    eid = str(event.id)
    scale = 1e3
    for d in event.payload_descriptors or []:
        if getattr(d, "payload_type", None) == PAYLOAD and str(getattr(d, "units", "KW") or "KW").upper() == "W":
            scale = 1.0
    out = []
    base = event.interval_period
    for k, iv in enumerate(event.intervals):
        period = iv.interval_period or base
        if period is None or isinstance(period.start, str):
            raise ScheduleError(f"event {eid!r}: interval {iv.id} has no start")
        start = period.start if iv.interval_period is not None else period.start + k * period.duration
        values = [p.values[0] for p in iv.payloads if p.type == PAYLOAD and p.values]
        if not values:
            continue
        begin = (start - t0_wall).total_seconds()
        out.append(Event(eid if len(event.intervals) == 1 else f"{eid}.{iv.id}", begin,
                         begin + period.duration.total_seconds(), target_w=float(values[0]) * scale,
                         ramp_w_per_s=s.ramp_w_per_s, deadline_s=s.deadline_s))
    if not out:
        raise ScheduleError(f"event {eid!r}: no {PAYLOAD} interval (wattflex follows load caps only)")
    return tuple(out)


class OpenADR3Ven:
    """Polls in a background thread: ``start()`` (first poll must succeed), ``stop()``."""

    def __init__(self, settings: VenSettings, program_id: str | None, load_w: Callable[[], float],
                 poll_s: float = 2.0, token: str | None = None):
        self.s, self.program_id, self.load_w, self.poll_s = settings, program_id, load_w, poll_s
        self.live = LiveSchedule()
        self.accepted: dict[str, bool] = {}
        self.messages: list[str] = []
        self.reports_sent = 0
        self.last_poll_ok: float | None = None
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._stop = threading.Event()
        self._first = threading.Event()
        self._error: str | None = None
        self._thread: threading.Thread | None = None

    @property
    def responses(self) -> dict[str, str]:
        """Per event: followed (it passed the checks) or refused."""
        return {k: "followed" if v else "refused" for k, v in self.accepted.items()}

    async def _poll_once(self, client: Any) -> None:
        events = await client.get_events(program_id=self.program_id, custom_headers=self._headers)
        self.last_poll_ok = time.monotonic()
        listed = set()
        for ev in events:
            eid = str(ev.id)
            listed.add(eid)
            if eid not in self.accepted:
                try:
                    taken, msgs = self.live.offer(eid, events_from_oadr3(ev, self.s, self.live.t0_wall), self.s)
                except ScheduleError as exc:
                    taken, msgs = False, [str(exc)]
                self.accepted[eid] = taken
                self.messages += msgs
                for m in msgs:
                    (log.info if taken else log.warning)("OpenADR 3 %s", m)
            if self.accepted.get(eid) and ev.report_descriptors and math.isfinite(self.load_w()):
                now_s = (datetime.now(timezone.utc) - self.live.t0_wall).total_seconds()
                if self.live.active(now_s):
                    await self._report(client, ev)
        for eid in [e for e in self.accepted if e not in listed and self.accepted[e]]:
            self.live.drop(eid)                          # withdrawn by the VTN
            self.accepted[eid] = False
            self.messages.append(f"event {eid!r} withdrawn by the VTN: dropped")

    async def _report(self, client: Any, ev: Any) -> None:
        from toadr3.models import Report

        rep = Report.create_report(ev, self.s.ven_name, REPORT, [round(self.load_w() / 1e3, 4)],
                                   report_name="wattflex measured load")
        await client.post_report(rep, custom_headers=self._headers)
        self.reports_sent += 1

    async def _main(self) -> None:
        import toadr3

        async with toadr3.ToadrClient(self.s.vtn_url, None) as client:
            while not self._stop.is_set():
                try:
                    await self._poll_once(client)
                except Exception as exc:   # a VTN that fails keeps what it sent: see the module docstring
                    if not self._first.is_set():
                        self._error = f"{type(exc).__name__}: {exc}"
                    else:
                        log.warning("OpenADR 3 VTN %s: %s (%s); held events are followed to their end",
                                    self.s.vtn_url, type(exc).__name__, exc)
                self._first.set()
                if self._error:
                    return
                await asyncio.sleep(self.poll_s)

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="openadr3-ven", daemon=True)
        self._thread.start()
        if not self._first.wait(timeout_s) or self._error:
            self.stop()
            raise ConnectionError(f"OpenADR 3 VTN {self.s.vtn_url}: first poll failed "
                                  f"({self._error or f'no answer in {timeout_s:g} s'})")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 + self.poll_s)

