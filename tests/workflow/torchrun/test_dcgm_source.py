"""DCGM as the telemetry source of real CPU training runs (torchrun), on FAKE NVML GPUs
(tests/fakes/fake_pynvml.py) whose GPM is held by "DCGM", with the FAKE ``dcgmi`` program
(tests/fakes/fake_dcgmi.py, on PATH) replaying the dmon capture in tests/data. (The source
itself: tests/unit/runs/devices/test_dcgm_source.py.)"""

import pytest

from tests.fakes.dcgm_fixture import DMON, fake_dcgmi_on_path  # noqa: F401 (fixture)
from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from wattflex.ingest.dcgm import read_dcgmi_dmon
from wattflex.provenance import read_json, read_parquet, read_parquet_meta
from wattflex.runs import real_run

pytestmark = pytest.mark.usefixtures("one_thread_subprocesses")  # tiny models: torch on one thread


@pytest.mark.slow
@pytest.mark.fake_gpu
def test_fake_nvml_real_cpu_run_with_dcgm_telemetry(fake_nvml, fake_dcgmi_on_path, tmp_path):
    """A real torchrun training run on CPU, caps observed on FAKE NVML GPUs whose GPM is held
    by "DCGM" (no permission), profiling fields from the FAKE dcgmi: run.json and the
    telemetry metadata say dcgm, and the DCGM fields are the capture's values."""
    from tests.unit.runs.test_real_run import cuda_spec

    fake_nvml.reset(n_gpus=2, path=fake_nvml._state_path(), gpm="no_permission")
    spec = cuda_spec(
        tmp_path,
        model="Llama-3.1-70B",
        task="pt",
        sampler=True,
        sampler_period_s=0.1,
        max_steps=None,
        telemetry="dcgm",
    )
    spec["run"]["duration_s"] = 2.0
    out = tmp_path / "run"
    real_run.run_real(spec, out)
    run = read_json(out / "run.json")
    assert run["telemetry"]["source"] == "dcgm" and run["telemetry"]["reason"] == [
        "cuda.telemetry: dcgm"
    ]
    assert run["telemetry"]["gpm"] == ["off"]  # GPM left to DCGM: never opened
    reader = run["nodes"][0]["telemetry"]["dcgm_reader"]
    assert reader["command"][:2] == ["dcgmi", "dmon"] and reader["lines"] > 0
    tel = read_parquet(out / "telemetry.parquet")
    assert read_parquet_meta(out / "telemetry.parquet")["telemetry_source"] == "dcgm"
    captured = set(read_dcgmi_dmon(DMON, period_s=1.0)["dram_active"].round(6))
    assert (
        tel["dram_active"].notna().any() and set(tel["dram_active"].dropna().round(6)) <= captured
    )
    assert tel["power_w"].notna().all() and limits_w() == [700.0, 700.0]


@pytest.mark.slow
@pytest.mark.fake_gpu
def test_fake_nvml_staircase_where_auto_chooses_dcgm(fake_nvml, fake_dcgmi_on_path, tmp_path):
    """The one-run staircase (real CPU training steered through the cap grid on FAKE NVML)
    where GPM is held by "DCGM": ``auto`` picks the FAKE dcgmi, every cap is still set and
    restored through NVML, and the run's telemetry carries DCGM's fields."""
    from tests.unit.runs.sweep.test_sweep_real import CAPS, sweep_spec
    from wattflex.runs.sweep.real import write_real_sweep_run

    fake_nvml.reset(n_gpus=2, path=fake_nvml._state_path(), gpm="no_permission")
    out = tmp_path / "staircase"
    write_real_sweep_run(sweep_spec(tmp_path, "staircase", telemetry="auto"), out)
    run = read_json(out / "run.json")
    assert run["telemetry"]["source"] == "dcgm"
    assert run["telemetry"]["reason"][0].startswith("auto: GPM disabled: no permission to profile")
    assert [v["cap_w"] for v in run["visits"]] == CAPS and limits_w() == [700.0, 700.0]
    assert read_parquet_meta(out / "telemetry.parquet")["telemetry_source"] == "dcgm"
    tel = read_parquet(out / "telemetry.parquet")
    captured = set(read_dcgmi_dmon(DMON, period_s=1.0)["tensor_active"].dropna().round(6))
    assert (
        tel["tensor_active"].notna().any()
        and set(tel["tensor_active"].dropna().round(6)) <= captured
    )
    assert set(CAPS) <= set(tel["power_limit_w"].unique())  # limits: NVML's, per cap
