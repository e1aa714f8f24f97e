"""Grid links that hang or half-parse (issue 47, "Reliability classes"). An OpenADR 3 VTN that
accepts a poll and never answers stopped the VEN for good (no timeout: no later event was
followed, exit 0); an event whose start has no UTC offset raised ``TypeError`` out of the
poll. Now every request is bounded (``VenSettings.request_timeout_s``) and one bad event is
refused with a warning while the rest are followed; the same for OpenADR 2.0b's events.
The VTN is a real aiohttp server on 127.0.0.1; no GPU (the VEN's schedule is read)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import pytest

from tests.unit.ops.test_openadr3 import ReplayVTN, vtn  # noqa: F401 (fixture)
from tests.unit.ops.test_openadr3_messages import POLL_S, cap_event, targets_w, wait_for
from wattflex.ops.adapters.openadr import OpenADRVen, VenSettings
from wattflex.ops.adapters.openadr3 import OpenADR3Ven


class HangingVTN(ReplayVTN):
    """GET /events: request ``hang_on`` is held open and never answered; the ones before it
    list no event, the ones after it list ``events``."""

    def __init__(self, events, hang_on: int):
        super().__init__()
        self.events, self.hang_on = events, hang_on
        self.release = asyncio.Event()

    async def listed(self, request):
        self.queries.append(dict(request.query))
        if len(self.queries) == self.hang_on:
            await self.release.wait()  # a VTN that took the request and hung
        return self.events if len(self.queries) > self.hang_on else []

    def stop(self):
        self.loop.call_soon_threadsafe(self.release.set)
        super().stop()


def settings(url: str, **kw) -> VenSettings:
    return VenSettings("gpu-node", url, floor_w=400.0, basis_w=1300.0, period_s=0.2, **kw)


@pytest.mark.parametrize("hang_on", [1, 2])
def test_a_vtn_that_never_answers_a_poll_does_not_stop_the_ven(caplog, hang_on):
    """Before: the VEN waited on the hung poll for ever: the event listed after it was never
    followed (and a hung first poll was only noticed by start's own 30 s wait)."""
    caplog.set_level(logging.WARNING, logger="wattflex.ops.adapters.openadr3")
    server = HangingVTN([cap_event("ev", 0.91)], hang_on)
    ven = OpenADR3Ven(
        settings(server.url, request_timeout_s=0.5), "dr-gpu", lambda: 1000.0, poll_s=POLL_S
    )
    try:
        if hang_on == 1:  # the first poll: refused at start, within the request's bound
            with pytest.raises(ConnectionError, match="first poll failed.*TimeoutError"):
                ven.start(timeout_s=20)
            return
        ven.start()
        assert wait_for(lambda: targets_w(ven) == {"ev": pytest.approx(910.0)}, timeout_s=8)
        assert any("no answer in 0.5 s" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        ven.stop()
        server.stop()


def test_an_event_time_without_utc_offset_is_refused_and_the_rest_followed(vtn):  # noqa: F811
    """Before: TypeError (naive minus aware) out of the poll; the event never said refused."""
    naive = cap_event("naive", 0.5)
    naive["intervalPeriod"]["start"] = (datetime.now() + timedelta(seconds=30)).isoformat()
    vtn.events = [naive, cap_event("good", 0.91, start_in_s=120.0)]
    ven = OpenADR3Ven(settings(vtn.url), "dr-gpu", lambda: 1000.0, poll_s=POLL_S)
    try:
        ven.start()
        assert wait_for(lambda: len(vtn.queries) >= 3)
        assert ven.responses == {"naive": "refused", "good": "followed"}
        assert any("'naive'" in m and "no UTC offset" in m for m in ven.messages), ven.messages
        assert targets_w(ven) == {"good": pytest.approx(910.0)}
    finally:
        ven.stop()


def _oadr2_event(eid: str, start: datetime, payload="0.9") -> dict:
    """An event as openleadr hands it to ``on_event`` (its parsed oadrDistributeEvent)."""
    return {
        "event_descriptor": {"event_id": eid, "event_status": "far"},
        "event_signals": [
            {
                "signal_name": "LOAD_DISPATCH",
                "signal_type": "setpoint",
                "intervals": [
                    {"dtstart": start, "duration": timedelta(seconds=60), "signal_payload": payload}
                ],
            }
        ],
    }


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (_oadr2_event("naive", datetime.now() + timedelta(seconds=30)), "no UTC offset"),
        (_oadr2_event("text", datetime.now(UTC) + timedelta(seconds=30), "abc"), "ValueError"),
        (
            {
                "event_descriptor": {"event_id": "bare"},
                "event_signals": [{"signal_name": "LOAD_DISPATCH", "signal_type": "setpoint"}],
            },
            "KeyError",
        ),
    ],
)
def test_an_openadr2_event_that_cannot_be_used_is_opted_out_and_the_ven_goes_on(event, reason):
    """Before: TypeError/ValueError/KeyError out of on_event, the event neither in nor out."""
    ven = OpenADRVen(settings("http://127.0.0.1:1"), lambda: 1000.0)
    good = _oadr2_event("good", datetime.now(UTC) + timedelta(seconds=120))
    assert asyncio.run(ven.on_event(event)) == "optOut"
    assert asyncio.run(ven.on_event(good)) == "optIn"
    eid = event["event_descriptor"]["event_id"]
    assert any(f"'{eid}'" in m and reason in m for m in ven.messages), ven.messages
    assert [e.event_id for e in ven.live.events] == ["good"]
