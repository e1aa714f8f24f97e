"""``run_real`` (backend: cuda) end to end on CPU: real torchrun training of a tiny model,
without NVML (observe) or on FAKE NVML GPUs (tests/fakes/fake_pynvml.py): caps set, sampled
and restored, also when training fails or the run gets SIGTERM. (The parts that start no
torchrun, and ``cuda_spec``: tests/unit/runs/test_real_run.py.)"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from tests.unit.runs.test_real_run import _cmdline_has, cuda_spec
from wattflex import cli
from wattflex.provenance import read_json, read_parquet
from wattflex.runs import real_run
from wattflex.runs.devices.base import EXTRA_COLUMNS
from wattflex.telemetry import TELEMETRY_COLUMNS

pytestmark = pytest.mark.usefixtures("one_thread_subprocesses")  # tiny models: torch on one thread

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_smoke_cpu_run_at_cap_cli_without_sampler(tmp_path, capsys):
    """Smoke variant: device cpu, no NVML at all, through ``wattflex run-at-cap``."""
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(cuda_spec(tmp_path)))
    out = tmp_path / "run"
    assert cli.main(["run-at-cap", str(spec_path), str(out)]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [
        "run.json",
        "steps.parquet",
        "telemetry.parquet",
        "train.log",
    ]
    steps = read_parquet(out / "steps.parquet")
    assert list(steps.columns[:4]) == ["step", "t_end_s", "tokens", "loss"] and len(steps) == 12
    tel = read_parquet(out / "telemetry.parquet")
    assert list(tel.columns) == TELEMETRY_COLUMNS + EXTRA_COLUMNS
    assert set(tel["gpu_util"].unique()) <= {0.0, 100.0} and tel["power_w"].isna().all()
    busy = tel.loc[tel.gpu_util == 100, "t_s"]
    first_start = (steps["t_end_s"] - steps["step_time_s"]).iloc[0]
    assert ((busy >= first_start) & (busy <= steps["t_end_s"].iloc[-1])).all()
    assert (tel.loc[tel.t_s < first_start, "gpu_util"] == 0).all()  # model loading: idle
    run = read_json(out / "run.json")
    assert run["backend"] == "cuda" and run["device_model"] == "cpu" and run["cap_w"] == 400.0
    assert run["cap_control"] == "observe" and run["telemetry"]["source"] == "steps"
    assert run["training"]["task"] == "lora" and run["training"]["world_size"] == 1
    assert [e["event"] for e in run["training"]["events"]] == ["eval", "checkpoint"]
    assert run["provenance"]["backend"] == "cuda"
    assert run["start_utc"] <= run["end_utc"]


@pytest.mark.slow
def test_fake_nvml_run_real_caps_samples_and_restores(fake_nvml, tmp_path):
    spec = cuda_spec(
        tmp_path,
        model="Llama-3.1-70B",
        task="pt",
        cap_control="nvml",
        sampler=True,
        sampler_period_s=0.1,
        max_steps=None,
    )
    spec["run"]["duration_s"] = 2.0
    real_run.run_real(spec, tmp_path / "run")
    out = tmp_path / "run"
    tel = read_parquet(out / "telemetry.parquet")
    assert list(tel.columns) == TELEMETRY_COLUMNS + EXTRA_COLUMNS
    assert sorted(tel["gpu"].unique()) == [0, 1] and len(tel) >= 2 * 10
    assert (tel["power_limit_w"] == 400.0).all() and (tel["power_w"] <= 400.0).all()
    assert tel["dram_active"].between(0, 1).all()
    run = read_json(out / "run.json")
    assert run["device_model"] == "NVIDIA H200" and run["cap_control"] == "nvml"
    assert run["original_limit_w"] == [700.0, 700.0] and run["enforced_limit_w"] == [400.0, 400.0]
    assert run["telemetry"]["source"] == "nvml" and run["telemetry"]["gpm"] == ["enabled"]
    assert limits_w() == [700.0, 700.0]
    assert not list((tmp_path / "state").glob("caps-*.json"))
    steps = read_parquet(out / "steps.parquet")
    assert steps["t_end_s"].iloc[-1] <= tel["t_s"].max() + 1.0  # one clock for both


@pytest.mark.slow
def test_fake_nvml_training_failure_restores_caps_and_shows_the_log(fake_nvml, tmp_path):
    pq.write_table(pa.table({"input_ids": [[1, 2, 999] * 50]}), tmp_path / "bad.parquet")
    spec = cuda_spec(
        tmp_path, cap_control="nvml", sampler=False, data_path=str(tmp_path / "bad.parquet")
    )
    with pytest.raises(
        RuntimeError, match="(?s)training exited with status 1.*outside \\[0, 256\\)"
    ):
        real_run.run_real(spec, tmp_path / "run")
    assert limits_w() == [700.0, 700.0]
    assert [c[1] for c in fake_nvml.state()["set_calls"]] == [400_000, 400_000, 700_000, 700_000]


@pytest.mark.slow
def test_fake_nvml_sigterm_during_run_stops_training_and_restores(fake_nvml, tmp_path):
    spec = cuda_spec(
        tmp_path, cap_control="nvml", sampler=True, sampler_period_s=0.2, max_steps=None
    )
    spec["run"]["duration_s"] = 300
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "run"
    code = (
        "import sys; from tests.fakes import fake_pynvml; sys.modules['pynvml'] = fake_pynvml; "
        "from wattflex import cli; sys.exit(cli.main(sys.argv[1:]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "workflow_scripts"), str(REPO)])}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "run-at-cap", str(tmp_path / "spec.json"), str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 120
    while not any(
        "step 1 " in p.read_text(errors="replace") for p in out.parent.glob(".*/train.log")
    ):
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail("training never started: " + proc.communicate()[0][-2000:])
        time.sleep(0.2)
    assert limits_w() == [400.0, 400.0]
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=90)[0]
    assert proc.returncode == 128 + signal.SIGTERM, output[-2000:]
    assert limits_w() == [700.0, 700.0]
    assert not list((tmp_path / "state").glob("caps-*.json"))
    left = [p for p in Path("/proc").glob("[0-9]*") if _cmdline_has(p, str(out.parent))]
    assert not left, "training processes outlived the run"
