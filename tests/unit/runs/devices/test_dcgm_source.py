"""DCGM as a telemetry source (``wattflex.runs.devices.dcgm_sampler``): the FAKE ``dcgmi`` program
(tests/fakes/fake_dcgmi.py, on PATH) replaying the dmon capture in tests/data, dcgm-exporter
scrapes from tests/data served by a real HTTP server on 127.0.0.1, the sampler merging them
with FAKE NVML GPUs (tests/fakes/fake_pynvml.py) and the per-run source choice. Real CPU
training runs with DCGM telemetry (torchrun): tests/workflow/torchrun/test_dcgm_source.py."""

import math
import time

import pandas as pd
import pytest

from tests.fakes import fake_dcgmi
from tests.fakes.dcgm_fixture import DMON, EXPORTER, exporter_url, fake_dcgmi_on_path, scrapes  # noqa: F401
from tests.fakes.nvml_fixture import fake_nvml  # noqa: F401 (fixture)
from wattflex.errors import ConfigError
from wattflex.ingest.dcgm import read_dcgm_exporter, read_dcgmi_dmon
from wattflex.runs import real_run
from wattflex.runs.devices import dcgm_sampler, nvml
from wattflex.runs.devices.base import TelemetrySampler

PROFILING = ["dram_active", "sm_active", "tensor_active", "gpu_util", "mem_copy_util"]


def by_sample(df: pd.DataFrame, cols: list[str]) -> list[list[tuple]]:
    """Rows grouped per sample time: [[(gpu, *cols) per GPU]] in time order."""
    return [
        [
            tuple(
                [int(r.gpu)]
                + [None if math.isnan(getattr(r, c)) else round(getattr(r, c), 6) for c in cols]
            )
            for r in g.itertuples()
        ]
        for _, g in df.sort_values(["t_s", "gpu"]).groupby("t_s", sort=True)
    ]


def test_fake_dcgmi_dmon_reader_stamps_and_parses_the_captured_rows(fake_dcgmi_on_path):
    settings = dcgm_sampler.DcgmSettings.from_spec({"mode": "dmon"})
    reader = dcgm_sampler.DmonReader(settings, [0, 1], period_s=0.05, t0=time.time(), node="n1")
    assert reader.command[:5] == ["dcgmi", "dmon", "-e", "1005,1002,1004,203,204", "-i"]
    reader.start()
    deadline = time.time() + 20
    while len([ln for ln in reader.lines if "GPU" in ln]) < 2 * 9 and time.time() < deadline:
        time.sleep(0.05)
    reader.stop()
    got = pd.DataFrame(reader.records())
    want = read_dcgmi_dmon(DMON, period_s=1.0)
    n = len(by_sample(want, PROFILING))
    assert by_sample(got, PROFILING)[:n] == by_sample(
        want, PROFILING
    )  # the capture, value for value
    assert (
        set(got["node"]) == {"n1"}
        and got["t_s"].is_monotonic_increasing
        and got["t_s"].iloc[0] >= 0
    )
    assert reader.describe()["stderr"] is None


def test_exporter_reader_reads_a_real_http_endpoint(exporter_url):
    settings = dcgm_sampler.DcgmSettings.from_spec({"mode": "exporter", "url": exporter_url})
    clock = iter(float(t) for t in range(100, 200)).__next__
    reader = dcgm_sampler.ExporterReader(
        settings, [0, 1], period_s=5.0, t0=100.0, node="n1", clock=clock
    )
    for _ in scrapes():
        reader.scrape_once()
    got = pd.DataFrame(reader.records())
    want = read_dcgm_exporter([EXPORTER])
    assert by_sample(got, PROFILING) == by_sample(want, PROFILING)
    assert sorted(got["t_s"].unique()) == [
        float(i) for i in range(len(scrapes()))
    ]  # our clock, not the file's
    assert set(got["node"]) == {"n1"} and reader.describe()["failures"] == 0
    assert dcgm_sampler.probe(settings) is None


def test_exporter_reader_keeps_going_when_the_endpoint_is_gone():
    settings = dcgm_sampler.DcgmSettings.from_spec(
        {"mode": "exporter", "url": "http://127.0.0.1:9/metrics"}
    )
    reader = dcgm_sampler.ExporterReader(settings, [0], period_s=0.1, t0=0.0, node="n1")
    reader.scrape_once()
    assert reader.records() == [] and reader.describe()["failures"] == 1
    assert "127.0.0.1:9" in dcgm_sampler.probe(settings, timeout_s=1.0)


def test_merge_takes_the_latest_dcgm_reading_and_never_a_stale_one():
    nvml_rows = pd.DataFrame(
        {
            "t_s": [1.0, 2.0, 3.0, 9.0, 1.0],
            "gpu": [0, 0, 0, 0, 1],
            "power_w": [1, 2, 3, 4, 5.0],
            "dram_active": 0.9,
        }
    )
    records = [
        {"t_s": 0.5, "gpu": 0, "dram_active": 0.1},
        {"t_s": 2.5, "gpu": 0, "dram_active": 0.2},
        {"t_s": 0.9, "gpu": 1, "dram_active": 0.7},
    ]
    out = dcgm_sampler.merge_dcgm(nvml_rows, records, ["dram_active", "sm_active"], staleness_s=2.0)
    assert list(out.columns) == ["t_s", "gpu", "power_w", "dram_active", "sm_active"]
    assert out["power_w"].tolist() == [1, 2, 3, 4, 5]
    assert out["dram_active"].tolist()[:3] == [0.1, 0.1, 0.2] and math.isnan(
        out["dram_active"].iloc[3]
    )
    assert out["dram_active"].iloc[4] == 0.7 and out["sm_active"].isna().all()


def test_settings_refuse_bad_input_with_the_key():
    with pytest.raises(ValueError, match=r"cuda.dcgm.mode 'smi'"):
        dcgm_sampler.DcgmSettings.from_spec({"mode": "smi"})
    with pytest.raises(ValueError, match=r"cuda.dcgm.url None: mode exporter needs"):
        dcgm_sampler.DcgmSettings.from_spec({"mode": "exporter"})
    with pytest.raises(ValueError, match=r"cuda.dcgm.fields \[155\]"):
        dcgm_sampler.DcgmSettings.from_spec({"fields": [1005, 155]})
    with pytest.raises(ValueError, match=r"cuda.telemetry 'dcmg'"):
        real_run.RunOptions.from_spec({"cuda": {"telemetry": "dcmg"}})
    assert dcgm_sampler.DcgmSettings.from_spec({"fields": [1005]}).columns == ["dram_active"]


@pytest.mark.fake_gpu
def test_fake_nvml_auto_chooses_dcgm_only_when_gpm_fails_and_dcgm_answers(
    fake_nvml, fake_dcgmi_on_path, monkeypatch
):
    settings = dcgm_sampler.DcgmSettings()
    assert (
        dcgm_sampler.choose_source("auto", nvml.open_gpus(gpm=True), settings)["source"] == "nvml"
    )
    fake_nvml.reset(n_gpus=2, path=fake_nvml._state_path(), gpm="no_permission")
    gpus = nvml.open_gpus(gpm=True)
    choice = dcgm_sampler.choose_source("auto", gpus, settings)
    assert choice["source"] == "dcgm" and "no permission to profile" in choice["reason"]
    monkeypatch.setenv(fake_dcgmi.DOWN_ENV, "1")
    choice = dcgm_sampler.choose_source("auto", gpus, settings)
    assert (
        choice["source"] == "nvml"
        and "DCGM does not answer" in choice["reason"]
        and "exited 255" in choice["reason"]
    )
    monkeypatch.delenv(fake_dcgmi.DOWN_ENV)
    no_tensor = dcgm_sampler.DcgmSettings(fields=(1004,))  # the capture's first sample: TENSO N/A
    capture = fake_nvml._state_path() + ".dmon"
    open(capture, "w").write("\n".join(DMON.read_text().splitlines()[:4]) + "\n")
    monkeypatch.setenv(fake_dcgmi.CAPTURE_ENV, capture)
    choice = dcgm_sampler.choose_source("auto", gpus, no_tensor)
    assert choice["source"] == "nvml" and "gives no value for tensor_active" in choice["reason"]
    monkeypatch.setenv(fake_dcgmi.DOWN_ENV, "1")
    with pytest.raises(
        RuntimeError, match="cuda.telemetry: dcgm, but DCGM does not answer: .*nv-hostengine"
    ):
        dcgm_sampler.choose_source("dcgm", gpus, settings)
    assert dcgm_sampler.choose_source("nvml", gpus, settings)["source"] == "nvml"


@pytest.mark.fake_gpu
def test_fake_nvml_sampler_power_from_nvml_profiling_from_the_exporter(fake_nvml, exporter_url):
    gpus = nvml.open_gpus(gpm=False)
    settings = dcgm_sampler.DcgmSettings.from_spec({"mode": "exporter", "url": exporter_url})
    sampler = dcgm_sampler.DcgmSampler.open(
        TelemetrySampler(gpus, 0.1, time.time()), settings, [0, 1], "n1"
    )
    with sampler:
        time.sleep(1.2)
    tel = sampler.frame()
    assert (
        len(tel) >= 2 * 8 and tel["power_w"].notna().all() and (tel["power_limit_w"] == 700).all()
    )
    captured = set(read_dcgm_exporter([EXPORTER])["dram_active"].round(6))
    assert (
        tel["dram_active"].notna().mean() > 0.8
        and set(tel["dram_active"].dropna().round(6)) <= captured
    )
    assert sampler.describe()["scrapes"] >= 8


def test_schema_takes_the_dcgm_keys_and_wants_a_url_for_the_exporter():
    import yaml

    from wattflex.config import REPO_ROOT, validate_schema

    base = {**yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text()), "backend": "cuda"}
    validate_schema(
        {
            **base,
            "cuda": {
                "telemetry": "dcgm",
                "dcgm": {
                    "mode": "exporter",
                    "url": "http://h:9400/metrics",
                    "fields": [1005, 1004],
                },
            },
        }
    )
    with pytest.raises(
        ConfigError, match=r"config error at cuda.dcgm: 'url' is a required property"
    ):
        validate_schema({**base, "cuda": {"telemetry": "dcgm", "dcgm": {"mode": "exporter"}}})
    with pytest.raises(ConfigError, match=r"cuda.telemetry: 'dcgmi' is not one of"):
        validate_schema({**base, "cuda": {"telemetry": "dcgmi"}})


def test_dmon_dies_with_the_process_that_started_it(fake_dcgmi_on_path, tmp_path):
    """A run SIGKILLed mid-measurement leaves no ``dcgmi dmon`` behind (PR_SET_PDEATHSIG). A
    60 s period: dmon's next write, which would end it by SIGPIPE, is a minute away."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    code = (
        "import sys, time; from wattflex.runs.devices import dcgm_sampler; "
        "r = dcgm_sampler.DmonReader(dcgm_sampler.DcgmSettings(), [0, 1], 60.0, time.time(), 'n1'); r.start()\n"
        "while not r.lines: time.sleep(0.01)\n"  # its first sample is out: the next is 60 s away
        "print(r.proc.pid, flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    dmon_pid = int(parent.stdout.readline())
    assert psutil.pid_exists(dmon_pid)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            if psutil.Process(dmon_pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        psutil.Process(dmon_pid).kill()
        pytest.fail("dcgmi dmon outlived the run that started it")


def test_dmon_lines_parsed_as_they_come_equal_one_parse_and_a_bad_chunk_is_left_out():
    """records() parses only the lines since its last call (a sweep asks every period), never
    the sample still being printed: the same readings as one parse of everything, whatever
    the calls' timing; a line that does not parse costs only its sample."""
    lines = ["#Entity   DRAMA     SMACT", "ID"] + [
        f"GPU {g}     0.{k}00     0.9{k}0" for k in range(6) for g in (0, 1)
    ]
    stamps = [None, None] + [0.5 * k + 0.01 * g for k in range(6) for g in (0, 1)]

    def reader(calls_after=()):
        r = dcgm_sampler.DmonReader(
            dcgm_sampler.DcgmSettings(fields=[1005, 1002]), [0, 1], 0.5, 0.0, "n1"
        )
        for i, (line, t) in enumerate(zip(lines, stamps)):
            r.add_line(line, t)
            if i in calls_after:
                r.records()
        return r

    once = reader()
    once.stop()
    whole = once.records()
    assert len(whole) == 12 and [r["t_s"] for r in whole[:4]] == [
        0.0,
        0.0,
        0.5,
        0.5,
    ]  # a sample: one time
    chunked = reader(calls_after={2, 5, 6, 9})
    assert len(chunked.records()) == 10  # the last sample may still be printing
    chunked.stop()
    assert chunked.records() == whole
    bad = reader(calls_after={5})
    bad.add_line("GPU 0     45.0     0.900", 3.0)  # a percentage where a ratio belongs
    bad.add_line("GPU 0     0.700     0.900", 3.5)
    bad.add_line("GPU 0     0.800     0.900", 4.0)
    bad.stop()
    got = bad.records()
    assert got[:12] == whole and [r["dram_active"] for r in got[12:]] == [
        0.7,
        0.8,
    ]  # only the bad one lost
    assert "dram_active = 45 is outside 0-1" in bad.describe()["unreadable"][0]


def test_a_dmon_that_dies_mid_run_is_logged_and_the_run_goes_on(
    fake_dcgmi_on_path, monkeypatch, caplog
):
    monkeypatch.setenv(fake_dcgmi.DOWN_ENV, "1")
    reader = dcgm_sampler.DmonReader(dcgm_sampler.DcgmSettings(), [0, 1], 0.05, time.time(), "n1")
    with caplog.at_level("WARNING", logger="wattflex.runs.devices.dcgm_sampler"):
        reader.start()
        reader._thread.join(20)
    assert "dcgmi dmon exited 255 mid-run (Error: Unable to connect to host engine" in caplog.text
    reader.stop()
    assert reader.records() == [] and reader.describe()["exit_status"] == 255
