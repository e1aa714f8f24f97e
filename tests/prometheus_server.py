"""A real Prometheus (Debian's ``prometheus`` package, /usr/bin/prometheus; CI installs it in
.ci/run) on loopback, configured by the shipped resources/prometheus/prometheus.yml with its
targets replaced by the ones a test starts; and ``wattflex control`` on FAKE NVML during a grid
event, scraped by it (tests/unit/ops/test_prometheus.py, benchmarks/dashboard_queries.py)."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from tests.fakes.nvml_fixture import FAKES, control_popen, control_process
from wattflex.ops.services.dashboard import api

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "resources" / "prometheus" / "prometheus.yml"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(
    targets: dict[str, list[str]], scrape_interval: str, file_sd: Path | None = None
) -> dict:
    """The shipped configuration every ``scrape_interval``: each scrape job's static targets
    those of ``targets`` (job name: host:port list; none: no static targets), its file_sd
    file ``file_sd`` (none: no file_sd)."""
    cfg = yaml.safe_load(SHIPPED.read_text())
    cfg["global"]["scrape_interval"] = scrape_interval
    for job in cfg["scrape_configs"]:
        job["scrape_interval"] = scrape_interval
        job["static_configs"] = [{"targets": targets.get(job["job_name"], [])}]
        if "file_sd_configs" in job:
            job["file_sd_configs"] = (
                [{"files": [str(file_sd)], "refresh_interval": "1s"}] if file_sd else []
            )
    return cfg


@contextmanager
def prometheus(
    folder: Path,
    targets: dict[str, list[str]],
    scrape_interval: str = "1s",
    file_sd: Path | None = None,
    flags: tuple[str, ...] = (),
) -> Iterator[str]:
    """Prometheus scraping ``targets`` (and ``file_sd``'s, :func:`config`), with more command
    line ``flags``; its HTTP API's base URL while the context lasts."""
    exe = shutil.which("prometheus")
    assert exe, "no prometheus on PATH: apt-get install prometheus (.ci/run installs it)"
    folder.mkdir(parents=True, exist_ok=True)
    cfg = folder / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(config(targets, scrape_interval, file_sd)))
    port = free_port()
    log = (folder / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            exe,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            *flags,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None, (folder / "prometheus.log").read_text()
            try:
                if urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "Prometheus not ready in 60 s"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def scraped_periods(url: str) -> int:
    """How many samples of the controller's period counter Prometheus holds from the last minute."""
    got = api(
        url, "/api/v1/query", {"query": "count_over_time(wattflex_control_periods_total[1m])"}
    )
    return int(float(got["result"][0]["value"][1])) if got["result"] else 0


@contextmanager
def control_during_event(
    folder: Path,
    hpc_jobs: dict[int, str],
    samples: int = 8,
    event_s: tuple[float, float] = (0.5, 120.0),
    prometheus_flags: tuple[str, ...] = (),
):
    """``wattflex control`` on the fake GPUs (the ``fake_nvml`` state under ``folder``) in a
    0.7 event from ``event_s`` (0.5 s to 120 s), 0.2 s periods, each GPU's job a FAKE trainer
    (tests/fakes/fake_trainer.py) whose torchtitan log it follows, exporting metrics with dcgm-exporter's job
    mapping ``hpc_jobs`` (GPU index: SLURM job id), scraped every second by :func:`prometheus`
    until it holds ``samples`` periods (of at most 60 in its one-minute count), with more
    ``prometheus_flags``; yields (Prometheus URL, the control process), which is
    stopped with SIGTERM on leaving (its caps restored)."""
    events = folder / "events.json"
    events.write_text(
        json.dumps(
            {
                "events": [
                    {"event_id": "ev", "start_s": event_s[0], "end_s": event_s[1], "fraction": 0.7}
                ]
            }
        )
    )
    mapping = folder / "job-map"  # as a SLURM prolog writes it for dcgm-exporter
    mapping.mkdir()
    for gpu, job in hpc_jobs.items():
        (mapping / str(gpu)).write_text(f"{job}\n")
    logs = [folder / f"train{gpu}.log" for gpu in range(2)]
    trainers = [  # FAKE trainers logging torchtitan's line, tokens/s following their GPU's power
        subprocess.Popen(
            [sys.executable, str(FAKES / "fake_trainer.py"), str(gpu), str(t_max), "0.6"]
            + [str(log), str(folder / f"tokens{gpu}"), "300"]
        )
        for gpu, (log, t_max) in enumerate(zip(logs, (20000, 8000)))
    ]
    late = event_s[0] >= 1.0  # nothing is capped before the event: no cap to wait for
    proc = (control_popen if late else control_process)(
        folder,
        "--signal",
        str(events),
        "--period-s",
        "0.2",
        "--state-dir",
        str(folder / "st"),
        "--metrics-port",
        "0",
        "--hpc-job-mapping-dir",
        str(mapping),
        "--throughput-preset",
        "torchtitan",
        *(f"--throughput-log={log}" for log in logs),
    )
    if late:
        assert proc.stdout.readline().startswith("controlling 2 GPU(s)"), proc.stderr.read()
    try:
        target = proc.stdout.readline().split("metrics at http://", 1)[1].split("/")[0]
        with prometheus(folder / "prom", {"wattflex": [target]}, flags=prometheus_flags) as url:
            deadline = time.time() + 2 * samples + 30  # 1 s scrapes, on a busy machine
            while scraped_periods(url) < samples:  # rate() and increase() need samples to span
                assert time.time() < deadline and proc.poll() is None, proc.stderr.read()
                time.sleep(0.5)
            yield url, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        for t in trainers:
            t.kill()
            t.wait()
