"""OpenADR 2.0b against a real openleadr VTN on 127.0.0.1 (FAKE NVML: tests/fakes/fake_pynvml.py,
two fake H200s drawing 650 W each uncapped): ``wattflex control --openadr-vtn`` registers as
a VEN, receives an event, opts in, caps follow it, measured load is reported back; an event
it cannot follow is opted out; a VTN that goes away mid-event leaves the event followed to
its received end and every cap restored."""

import asyncio
import socket
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from wattflex import cli
from wattflex.provenance import read_csv, read_json

# slow: each test follows a real openleadr VTN for 5-11 s of wall time (the serial slow tier, not
# the 4 parallel workers of the fast one, whose load could starve that timing)
pytestmark = [pytest.mark.fake_gpu, pytest.mark.slow]
VEN_ID = "ven-wattflex"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VTN:
    """A real openleadr VTN in a thread: registers any VEN as VEN_ID, records opt responses
    and reported values."""

    def __init__(self):
        self.port = free_port()
        self.opts, self.reports = {}, []
        self.loop = asyncio.new_event_loop()
        self.server = None
        started = threading.Event()

        def run():
            from openleadr import (
                OpenADRServer,  # here, not at the top: the fast tier collects this module too
            )

            asyncio.set_event_loop(self.loop)
            self.server = OpenADRServer(
                vtn_id="test-vtn",
                http_host="127.0.0.1",
                http_port=self.port,
                requested_poll_freq=timedelta(seconds=1),
            )
            self.server.add_handler("on_create_party_registration", lambda info: (VEN_ID, "reg-1"))
            self.server.add_handler("on_register_report", self.on_register_report)
            self.loop.run_until_complete(self.server.run())
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(30)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/OpenADR2/Simple/2.0b"

    def on_register_report(
        self,
        ven_id,
        resource_id,
        measurement,
        unit,
        scale,
        min_sampling_interval,
        max_sampling_interval,
    ):
        return (lambda values: self.reports.extend((measurement, v) for _, v in values)), timedelta(
            seconds=1
        )

    def add_event(self, event_id, start_in_s, duration_s, name, kind, payload):
        def add():
            self.server.add_event(
                ven_id=VEN_ID,
                event_id=event_id,
                signal_name=name,
                signal_type=kind,
                intervals=[
                    {
                        "dtstart": datetime.now(UTC) + timedelta(seconds=start_in_s),
                        "duration": timedelta(seconds=duration_s),
                        "signal_payload": payload,
                    }
                ],
                callback=lambda ven_id, event_id, opt_type: self.opts.__setitem__(
                    event_id, opt_type
                ),
            )

        self.loop.call_soon_threadsafe(add)

    def stop(self):
        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout=10)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture
def vtn():
    v = VTN()
    yield v
    v.stop()


def control(tmp_path, url, duration_s, *extra):
    return cli.main(
        [
            "control",
            "--openadr-vtn",
            url,
            "--ven-name",
            "gpu-node",
            "--basis",
            "measured",
            "--duration-s",
            str(duration_s),
            "--period-s",
            "0.2",
            "--response-s",
            "1.5",
            "--state-dir",
            str(tmp_path / "st"),
            "--mv-out",
            str(tmp_path / "mv"),
            *extra,
        ]
    )


def test_the_ven_opts_in_caps_follow_the_event_and_load_is_reported_fake_nvml(
    fake_nvml, vtn, tmp_path, capsys
):
    vtn.add_event("ev30", 3.0, 4.0, "LOAD_CONTROL", "x-loadControlCapacity", 0.7)
    vtn.add_event("strange", 3.0, 4.0, "SIMPLE", "level", 1)
    assert control(tmp_path, vtn.url, 9.0) == 0
    out = capsys.readouterr().out
    assert "OpenADR event ev30: optIn" in out and "OpenADR event strange: optOut" in out
    assert vtn.opts == {"ev30": "optIn", "strange": "optOut"}
    powers = [v for m, v in vtn.reports if m == "RealPower"]
    assert (
        powers and max(powers) == pytest.approx(1300.0) and min(powers) <= 0.7 * 1300
    )  # the load, capped
    rec = read_json(tmp_path / "mv" / "mv.json")["events"][0]
    assert rec["event_id"] == "ev30" and rec["target_w"] == pytest.approx(910.0)
    assert rec["seconds_above_target_after_deadline"] == 0 and rec["deadline_met"]
    ts = read_csv(tmp_path / "mv" / "timeseries.csv")
    inside = ts[(ts["t_s"] > rec["start_s"] + 1.5) & (ts["t_s"] < rec["end_s"])]
    assert len(inside) >= 5 and (inside["power_w"] <= 910.0).all()
    assert limits_w() == [700.0, 700.0]


def test_a_vtn_that_goes_away_mid_event_leaves_it_followed_to_its_end_then_restored_fake_nvml(
    fake_nvml, vtn, tmp_path, capsys
):
    vtn.add_event("ev", 3.0, 5.0, "LOAD_DISPATCH", "setpoint", 1.0)  # 1 kW for the two GPUs
    threading.Timer(6.0, vtn.stop).start()  # 1+ s into the event, ~2 s registration
    assert control(tmp_path, vtn.url, 11.0) == 0
    assert "OpenADR event ev: optIn" in capsys.readouterr().out
    rec = read_json(tmp_path / "mv" / "mv.json")["events"][0]
    ts = read_csv(tmp_path / "mv" / "timeseries.csv")
    late = ts[
        (ts["t_s"] > rec["end_s"] - 1.5) & (ts["t_s"] < rec["end_s"])
    ]  # after the VTN stopped
    assert (
        len(late) >= 3 and (late["power_w"] <= 1000.0).all() and (late["budget_w"] == 1000.0).all()
    )
    after = ts[ts["t_s"] > rec["end_s"] + 0.5]
    assert len(after) and (after["cap_w:job0"] == 700).all() and (after["cap_w:job1"] == 700).all()
    assert limits_w() == [700.0, 700.0]


def test_no_vtn_is_one_line_and_nothing_capped_fake_nvml(fake_nvml, tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}/OpenADR2/Simple/2.0b"
    start = time.monotonic()
    assert control(tmp_path, url, 5.0) == 2
    err = capsys.readouterr().err
    assert f"OpenADR VTN {url}: no registration" in err and len(err.strip().splitlines()) == 1
    assert limits_w() == [700.0, 700.0] and time.monotonic() - start < 60


def test_a_ven_stopped_mid_poll_stops_cleanly_without_a_cancelled_traceback(vtn, caplog):
    """The VTN kept busy (its loop asleep 3 s) so that the VEN's next scheduled poll (every
    1 s) is in flight when the VEN stops: openleadr's scheduler logged that poll's
    cancellation as a failed job, with a CancelledError traceback."""
    import logging

    from wattflex.ops.adapters.openadr import OpenADRVen, VenSettings

    caplog.set_level(logging.INFO)
    ven = OpenADRVen(
        VenSettings("gpu-node", vtn.url, floor_w=400.0, basis_w=1300.0, period_s=0.2),
        lambda: 1000.0,
    )
    ven.start()
    vtn.loop.call_soon_threadsafe(time.sleep, 3.0)
    time.sleep(1.5)  # a scheduled poll has started and waits on the VTN
    loop = ven._loop
    ven.stop()
    assert not ven._thread.is_alive() and not loop.is_running()
    assert not [r for r in caplog.records if r.exc_info or "raised an exception" in r.getMessage()]
    assert not asyncio.all_tasks(loop)  # nothing left pending on the VEN's loop
