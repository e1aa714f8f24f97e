"""OpenADR 3 signal adapter: a VEN polling a VTN's REST API with ``toadr3`` (its pydantic
models of the 3.0 objects validate what the VTN sends).

``openadr3-client``, the library the issue names, needs Python >= 3.12 (this project
supports 3.11), so the VEN uses ``toadr3``, the other maintained OpenADR 3 client on PyPI.

Every ``poll_s`` the VEN reads ``GET /events?programID=...``. An event's intervals whose
payload is ``IMPORT_CAPACITY_LIMIT`` (kW, the OpenADR 3 load cap; W when the event's
payload descriptor says ``units: W``) become :class:`wattflex.ops.events.Event` objects,
through the same checks as a schedule (:meth:`wattflex.ops.adapters.openadr.LiveSchedule.offer`);
an event the VTN no longer lists is dropped (the controller restores). While an event is
active the VEN posts a ``DEMAND`` report (the measured load in kW) when the event asks for
one (``reportDescriptors``). As with OpenADR 2.0b, events are held locally with their end
times: a VTN that stops answering leaves them followed to their end, never past it. Every
request (a poll, a report) is bounded by ``VenSettings.request_timeout_s``: a VTN that takes
a request and never answers is a failed poll, and the next poll goes on.

**One bad event stops nothing.** The list is read as JSON and each event validated on its
own: an event that cannot be used (not a valid OpenADR 3 object, a limit that is not a
number, a start without a UTC offset) is logged once with its id and refused, and the rest of the list is still followed,
withdrawals included. An event listed again with other content (same id, e.g. a new limit)
replaces the one held; an update that cannot be used or is refused leaves the earlier
version followed, and says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from wattflex.ops.adapters.openadr import BAD_EVENT, LiveSchedule, VenSettings, aware
from wattflex.ops.events import Event, ScheduleError

log = logging.getLogger("wattflex.ops.adapters.openadr3")

PAYLOAD = "IMPORT_CAPACITY_LIMIT"
REPORT = "DEMAND"


def events_from_oadr3(event: Any, s: VenSettings, t0_wall: datetime) -> tuple[Event, ...]:
    """A ``toadr3.models.Event``'s capacity-limit intervals as events (seconds from ``t0_wall``).
    Intervals without their own period follow one another from the event's period."""
    eid = str(event.id)
    scale = 1e3
    for d in event.payload_descriptors or []:
        if (
            getattr(d, "payload_type", None) == PAYLOAD
            and str(getattr(d, "units", "KW") or "KW").upper() == "W"
        ):
            scale = 1.0
    out = []
    base = event.interval_period
    for k, iv in enumerate(event.intervals):
        period = iv.interval_period or base
        if period is None or isinstance(period.start, str):
            raise ScheduleError(f"event {eid!r}: interval {iv.id} has no start")
        start = aware(
            period.start if iv.interval_period is not None else period.start + k * period.duration,
            f"event {eid!r}: interval {iv.id}",
        )
        values = [p.values[0] for p in iv.payloads if p.type == PAYLOAD and p.values]
        if not values:
            continue
        if isinstance(values[0], bool) or not isinstance(
            values[0], (int, float)
        ):  # the model also allows str, Point
            raise ScheduleError(
                f"event {eid!r}: interval {iv.id}: {PAYLOAD} value {values[0]!r} is not a number"
            )
        begin = (start - t0_wall).total_seconds()
        out.append(
            Event(
                eid if len(event.intervals) == 1 else f"{eid}.{iv.id}",
                begin,
                begin + period.duration.total_seconds(),
                target_w=float(values[0]) * scale,
                ramp_w_per_s=s.ramp_w_per_s,
                deadline_s=s.deadline_s,
            )
        )
    if not out:
        raise ScheduleError(
            f"event {eid!r}: no {PAYLOAD} interval (wattflex follows load caps only)"
        )
    return tuple(out)


def _reason(exc: Exception) -> str:
    """One line for an event the OpenADR 3 model refuses (pydantic says one error a line)."""
    errors = exc.errors()
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{'.'.join(map(str, errors[0]['loc'])) or 'the event'}: {errors[0]['msg']}{more}"


class OpenADR3Ven:
    """Polls in a background thread: ``start()`` (first poll must succeed), ``stop()``."""

    def __init__(
        self,
        settings: VenSettings,
        program_id: str | None,
        load_w: Callable[[], float],
        poll_s: float = 2.0,
        token: str | None = None,
    ):
        self.s, self.program_id, self.load_w, self.poll_s = settings, program_id, load_w, poll_s
        self.live = LiveSchedule()
        self.accepted: dict[str, bool] = {}  # per event id: held (followed) or refused
        self._versions: dict[str, str] = {}  # per listed event id: the content last considered
        self._held: dict[str, Any] = {}  # per event id: the toadr3 Event held
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
        async with asyncio.timeout(self.s.request_timeout_s):
            docs = await self._get_events(client)
        self.last_poll_ok = time.monotonic()
        listed = {}
        for k, doc in enumerate(docs):
            eid = (
                str(doc["id"])
                if isinstance(doc, dict) and doc.get("id") is not None
                else f"(no id, item {k})"
            )
            listed[eid] = version = json.dumps(doc, sort_keys=True)
            if (
                self._versions.get(eid) != version
            ):  # new, or updated by the VTN: (re)considered once
                self._versions[eid] = version
                self._consider(eid, doc)
        for eid in [e for e in self.accepted if e not in listed and self.accepted[e]]:
            self.live.drop(eid)  # withdrawn by the VTN
            self.accepted[eid] = False
            self.messages.append(f"event {eid!r} withdrawn by the VTN: dropped")
        self._versions = {k: v for k, v in self._versions.items() if k in listed}
        now_s = (datetime.now(UTC) - self.live.t0_wall).total_seconds()
        if math.isfinite(self.load_w()) and self.live.active(now_s):
            for eid, ev in self._held.items():
                if self.accepted.get(eid) and ev.report_descriptors:
                    async with asyncio.timeout(self.s.request_timeout_s):
                        await self._report(client, ev)

    async def _get_events(self, client: Any) -> list[Any]:
        """The VTN's event list as JSON (toadr3's ``get_events`` validates the whole list at
        once: one malformed event would hide every other)."""
        params = {"programID": self.program_id} if self.program_id else {}
        async with client.client_session.get(
            f"{client.vtn_url}/events", params=params, headers=self._headers
        ) as resp:
            resp.raise_for_status()
            docs = await resp.json(content_type=None)
        if not isinstance(docs, list):
            raise ValueError(f"GET /events answered a {type(docs).__name__}, not a list of events")
        return docs

    def _consider(self, eid: str, doc: Any) -> None:
        """Offer one listed event (new or updated) to the schedule; log what became of it."""
        from pydantic import ValidationError
        from toadr3.models import Event as Oadr3Event

        update = self.accepted.get(eid, False)
        try:
            ev = Oadr3Event.model_validate(doc)
            taken, msgs = self.live.offer(
                eid, events_from_oadr3(ev, self.s, self.live.t0_wall), self.s
            )
        except ValidationError as exc:
            taken, msgs = False, [f"event {eid!r} is not a valid OpenADR 3 event: {_reason(exc)}"]
        except ScheduleError as exc:  # names the event
            taken, msgs = False, [str(exc)]
        except BAD_EVENT as exc:  # one bad event is refused; the rest are still followed
            taken, msgs = False, [f"event {eid!r} cannot be used ({type(exc).__name__}: {exc})"]
        if taken:
            self._held[eid] = ev
            if update:
                msgs.insert(
                    0, f"event {eid!r} updated by the VTN: the new version replaces the old"
                )
        elif update:
            msgs.append(
                f"event {eid!r}: the VTN's update is refused; the earlier version is still followed"
            )
        self.accepted[eid] = taken or update
        self.messages += msgs
        for m in msgs:
            log.info(  # accepted or refused: the VEN's normal work
                "OpenADR 3 %s", m
            )

    async def _report(self, client: Any, ev: Any) -> None:
        from toadr3.models import Report

        rep = Report.create_report(
            ev,
            self.s.ven_name,
            REPORT,
            [round(self.load_w() / 1e3, 4)],
            report_name="wattflex measured load",
        )
        await client.post_report(rep, custom_headers=self._headers)
        self.reports_sent += 1

    async def _main(self) -> None:
        import toadr3

        async with toadr3.ToadrClient(self.s.vtn_url, None) as client:
            while not self._stop.is_set():
                try:
                    await self._poll_once(client)
                except (
                    Exception
                ) as exc:  # a VTN that fails keeps what it sent: see the module docstring
                    why = str(exc) or f"no answer in {self.s.request_timeout_s:g} s"
                    if not self._first.is_set():
                        self._error = f"{type(exc).__name__}: {why}"
                    else:
                        log.warning(
                            "OpenADR 3 VTN %s: %s (%s); held events are followed to their end",
                            self.s.vtn_url,
                            type(exc).__name__,
                            why,
                        )
                self._first.set()
                if self._error:
                    return
                await asyncio.sleep(self.poll_s)

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._main()), name="openadr3-ven", daemon=True
        )
        self._thread.start()
        if not self._first.wait(timeout_s) or self._error:
            self.stop()
            raise ConnectionError(
                f"OpenADR 3 VTN {self.s.vtn_url}: first poll failed "
                f"({self._error or f'no answer in {timeout_s:g} s'})"
            )

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 + self.poll_s)
