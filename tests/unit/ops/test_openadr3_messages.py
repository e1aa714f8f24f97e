"""OpenADR 3 messages that cannot be used (wattflex.ops.adapters.openadr3): the VEN polls a real
HTTP server on 127.0.0.1 (test_openadr3's ReplayVTN) whose event list the test changes
between polls. An event with a non-numeric limit is refused once, with its id, and the
good events beside it are still followed and withdrawn; an event the VTN updates (same
id, new limit) replaces the one held. No GPU: the VEN's schedule is read directly."""

import copy
import logging
import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.unit.ops.test_openadr3 import EXCHANGE, ReplayVTN, vtn  # noqa: F401 (fixture)
from wattflex.ops.adapters.openadr import VenSettings
from wattflex.ops.adapters.openadr3 import OpenADR3Ven

POLL_S = 0.1


def cap_event(eid, limit_kw, start_in_s=30.0):
    """The exchange's ev30 (a capacity limit, DEMAND reports asked), as ``eid`` with ``limit_kw``."""
    ev = copy.deepcopy(EXCHANGE["events"][0]["event"])
    ev["id"] = eid
    ev["intervalPeriod"] = {
        "start": (datetime.now(UTC) + timedelta(seconds=start_in_s)).isoformat(),
        "duration": "PT60S",
    }
    ev["intervals"][0]["payloads"][0]["values"] = [limit_kw]
    return ev


def wait_for(cond, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(POLL_S / 2)
    return cond()


@pytest.fixture
def ven(vtn):
    v = OpenADR3Ven(
        VenSettings("gpu-node", vtn.url, floor_w=400.0, basis_w=1300.0, period_s=0.2),
        "dr-gpu",
        lambda: 1000.0,
        poll_s=POLL_S,
    )
    yield v
    v.stop()


def targets_w(ven):
    return {e.event_id: e.target_w for e in ven.live.events}


def test_an_event_with_a_non_numeric_limit_is_refused_once_and_the_rest_still_followed(
    vtn, ven, caplog
):
    caplog.set_level(logging.INFO, logger="wattflex.ops.adapters.openadr3")
    vtn.events = [cap_event("bad", "abc"), cap_event("good", 0.91, start_in_s=120.0)]
    ven.start()
    assert wait_for(lambda: len(vtn.queries) >= 4)  # several polls
    assert ven.responses == {"bad": "refused", "good": "followed"}
    assert targets_w(ven) == {"good": pytest.approx(910.0)}
    said = [r.getMessage() for r in caplog.records if "'bad'" in r.getMessage()]
    assert len(said) == 1 and "'abc' is not a number" in said[0]
    vtn.events = [cap_event("bad", "abc")]  # the good one withdrawn
    assert wait_for(lambda: "good" not in targets_w(ven))
    assert (
        ven.responses["good"] == "refused"
        and "event 'good' withdrawn by the VTN: dropped" in ven.messages
    )


def test_an_event_that_is_no_openadr3_object_is_refused_and_the_rest_still_followed(vtn, ven):
    broken = cap_event("broken", 0.5)
    del broken["intervals"]
    vtn.events = [broken, {"programID": "dr-gpu", "objectType": "EVENT"}, cap_event("good", 0.91)]
    ven.start()
    assert wait_for(lambda: "good" in targets_w(ven))
    assert ven.responses == {"broken": "refused", "(no id, item 1)": "refused", "good": "followed"}
    assert any("'broken' is not a valid OpenADR 3 event: intervals" in m for m in ven.messages)


def test_an_updated_event_replaces_the_one_held_and_a_bad_update_keeps_it(vtn, ven):
    vtn.events = [cap_event("ev", 0.91)]
    ven.start()
    assert wait_for(lambda: targets_w(ven) == {"ev": pytest.approx(910.0)})
    vtn.events = [cap_event("ev", 0.8)]  # same id, a new limit
    assert wait_for(lambda: targets_w(ven) == {"ev": pytest.approx(800.0)})
    assert "event 'ev' updated by the VTN: the new version replaces the old" in ven.messages
    vtn.events = [cap_event("ev", "abc")]  # an update that cannot be used
    assert wait_for(lambda: any("earlier version is still followed" in m for m in ven.messages))
    assert targets_w(ven) == {"ev": pytest.approx(800.0)} and ven.responses == {"ev": "followed"}
