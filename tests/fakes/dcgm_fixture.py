"""Fixtures for DCGM telemetry tests: ``fake_dcgmi_on_path`` (the FAKE ``dcgmi`` program,
tests/fakes/fake_dcgmi.py, first on PATH, replaying tests/data/dcgm_dmon_h100x2.txt) and
``exporter_url`` (a real HTTP server on 127.0.0.1 serving the scrapes of
tests/data/dcgm_exporter_h100x2.prom in turn, as a dcgm-exporter's /metrics does). Both
captures are format samples of unrecorded provenance (see fake_dcgmi's docstring). Import
them into a test module: ``from tests.fakes.dcgm_fixture import exporter_url, fake_dcgmi_on_path``."""

import contextlib
import http.server
import os
import re
import threading
from pathlib import Path

import pytest

from tests.fakes import fake_dcgmi

DATA = Path(__file__).resolve().parents[1] / "data"
DMON = DATA / "dcgm_dmon_h100x2.txt"
EXPORTER = DATA / "dcgm_exporter_h100x2.prom"


@pytest.fixture
def fake_dcgmi_on_path(tmp_path, monkeypatch):
    """A program named ``dcgmi`` (the FAKE) first on PATH; its host engine answers."""
    fake_dcgmi.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(fake_dcgmi.DOWN_ENV, raising=False)
    return tmp_path / "bin" / "dcgmi"


def scrapes() -> list[str]:
    """The exporter capture split into its scrapes, ``# scrape_time`` lines removed: what a
    dcgm-exporter's /metrics returns, one scrape per GET."""
    parts = re.split(r"^# scrape_time .*\n", EXPORTER.read_text(), flags=re.M)
    return [p for p in parts if p.strip()]


@contextlib.contextmanager
def serve_metrics(bodies: list[str]):
    """A real HTTP server on 127.0.0.1: ``http://127.0.0.1:<port>/metrics``, each GET the next
    of ``bodies`` (then the last again), as a dcgm-exporter's /metrics answers."""
    count = {"n": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = bodies[min(count["n"], len(bodies) - 1)].encode()
            count["n"] += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def exporter_url():
    """The captured scrapes (``scrapes()``) served in turn by ``serve_metrics``."""
    with serve_metrics(scrapes()) as url:
        yield url
