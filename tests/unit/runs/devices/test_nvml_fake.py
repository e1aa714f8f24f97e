"""NvmlGpu and the telemetry sampler against a FAKE pynvml (tests/fakes/fake_pynvml.py):
only the NVML library is fake; wattflex's device, sampler and schema code is real."""

import logging
import math
import time

import pytest

from tests.fakes import fake_pynvml
from tests.fakes.nvml_fixture import fake_nvml  # noqa: F401 (fixture)
from wattflex.runs.devices import nvml
from wattflex.runs.devices.base import (
    EXTRA_COLUMNS,
    CapConstraintError,
    CapPermissionError,
    PowerCapDevice,
    TelemetrySampler,
    TelemetrySource,
)
from wattflex.telemetry import TELEMETRY_COLUMNS

pytestmark = pytest.mark.fake_gpu


def test_fake_nvml_gpu_satisfies_both_protocols(fake_nvml):
    gpu = nvml.NvmlGpu(0)
    assert isinstance(gpu, PowerCapDevice) and isinstance(gpu, TelemetrySource)
    assert gpu.constraints() == (200.0, 700.0)
    assert gpu.original_limit_w == 700.0 and gpu.enforced_limit_w() == 700.0
    assert gpu.model == "NVIDIA H200" and gpu.uuid == "GPU-fake-0000"


def test_fake_nvml_sample_row_has_schema_units_and_gpm_fractions(fake_nvml):
    gpu = nvml.NvmlGpu(1, node="n1")
    first = gpu.sample(0.0)
    assert set(first) == set(TELEMETRY_COLUMNS + EXTRA_COLUMNS)
    assert first["dram_active"] == pytest.approx(0.45)  # GPM since the GPU was opened
    fake_nvml.update_gpu(1, fb_used=40 * 1024**3)
    row = gpu.sample(5.0)
    assert row["node"] == "n1" and row["gpu"] == 1 and row["t_s"] == 5.0
    assert row["power_w"] == pytest.approx(650.0)
    assert row["fb_used_gib"] == pytest.approx(40.0)
    assert row["power_limit_w"] == 700.0 and row["enforced_limit_w"] == 700.0
    assert row["gpu_util"] == 98 and row["mem_copy_util"] == 40
    assert row["dram_active"] == pytest.approx(0.45) and row["sm_active"] == pytest.approx(0.90)
    assert row["tensor_active"] == pytest.approx(0.60)
    assert row["energy_j"] >= 0 and first["energy_j"] == 0.0
    assert row["clock_event_reasons"] == 0


def test_fake_nvml_cap_lowers_clock_and_sets_throttle_reason(fake_nvml):
    gpu = nvml.NvmlGpu(0, gpm=False)
    base = gpu.sample(0.0)
    assert gpu.set_cap(300) == 300.0
    capped = gpu.sample(1.0)
    assert capped["power_w"] == pytest.approx(300.0) and capped["power_limit_w"] == 300.0
    assert capped["sm_clock_mhz"] < base["sm_clock_mhz"]
    assert capped["clock_event_reasons"] == fake_pynvml.CLOCKS_EVENT_REASON_SW_POWER_CAP
    gpu.restore()
    assert fake_nvml.state()["gpus"][0]["limit_mw"] == 700_000


def test_fake_nvml_instant_power_unsupported_falls_back_to_average(fake_nvml):
    fake_nvml.reset(n_gpus=1, instant_power=False)
    row = nvml.NvmlGpu(0, gpm=False).sample(0.0)
    assert row["power_w"] == pytest.approx(650.0)


def test_fake_nvml_gpm_permission_error_disables_gpm_with_warning(fake_nvml, caplog):
    fake_nvml.reset(n_gpus=1, gpm="no_permission")
    with caplog.at_level(logging.WARNING, logger="wattflex.runs.devices.nvml"):
        gpu = nvml.NvmlGpu(0)
        rows = [gpu.sample(t) for t in (0.0, 1.0)]
    assert gpu.gpm.status.startswith("disabled: no permission")
    assert "GPM disabled" in caplog.text
    assert all(math.isnan(r["dram_active"]) for r in rows)
    assert rows[1]["power_w"] == pytest.approx(650.0)  # the rest of the sample still works


def test_fake_nvml_gpm_unsupported_is_reported_not_fatal(fake_nvml):
    fake_nvml.reset(n_gpus=1, gpm="unsupported")
    gpu = nvml.NvmlGpu(0)
    assert gpu.gpm.status == "disabled: GPM not supported on this GPU"
    assert math.isnan(gpu.sample(0.0)["sm_active"])


def test_fake_nvml_cap_outside_constraints_is_refused_untouched(fake_nvml):
    gpu = nvml.NvmlGpu(0, gpm=False)
    with pytest.raises(
        CapConstraintError, match="outside the limits this GPU accepts \\(200-700 W\\)"
    ):
        gpu.set_cap(150)
    assert fake_nvml.state()["set_calls"] == []


def test_fake_nvml_set_without_permission_says_what_to_do(fake_nvml):
    fake_nvml.reset(n_gpus=1, allow_set=False)
    gpu = nvml.NvmlGpu(0, gpm=False)
    with pytest.raises(CapPermissionError, match="cap_control: command.*cap_control: observe"):
        gpu.set_cap(400)


def test_fake_nvml_cap_equal_to_current_limit_needs_no_permission(fake_nvml):
    fake_nvml.reset(n_gpus=1, allow_set=False)
    assert nvml.NvmlGpu(0, gpm=False).set_cap(700) == 700.0


def test_fake_nvml_lower_enforced_limit_is_accepted_with_warning(fake_nvml, caplog):
    fake_nvml.reset(n_gpus=1)
    fake_nvml.update_gpu(0, extra_limit_w=350.0)
    with caplog.at_level(logging.WARNING):
        assert nvml.NvmlGpu(0, gpm=False).set_cap(500) == 350.0
    assert "lower limit is enforced" in caplog.text


def test_fake_nvml_local_gpus_follow_cuda_visible_devices(fake_nvml):
    fake_nvml.reset(n_gpus=4)
    assert nvml.local_gpu_indices(visible="") == [0, 1, 2, 3]
    assert nvml.local_gpu_indices(visible="2,3") == [2, 3]
    assert nvml.local_gpu_indices(visible="GPU-fake-0003,GPU-fake-0001") == [3, 1]
    assert nvml.local_gpu_indices(2, visible="") == [0, 1]
    with pytest.raises(RuntimeError, match="wants 3 GPUs.*may open 2"):
        nvml.local_gpu_indices(3, visible="0,1")


def test_fake_nvml_sampler_thread_rows_per_gpu_per_period(fake_nvml):
    gpus = nvml.open_gpus(gpm=False)
    t0 = time.time()
    host = {"host_cpu_w": 120.0, "host_dram_w": 20.0}
    with TelemetrySampler(gpus, 0.05, t0, host=lambda: host) as sampler:
        time.sleep(0.32)
    df = sampler.frame()
    assert list(df.columns) == TELEMETRY_COLUMNS + EXTRA_COLUMNS
    n = len(df) // 2
    assert 4 <= n <= 9 and len(df) == 2 * n
    assert sorted(df["gpu"].unique()) == [0, 1]
    assert df["t_s"].is_monotonic_increasing and df["t_s"].iloc[-1] < 1.0
    # host power is node level: on the first GPU's row only
    assert (df.loc[df.gpu == 0, "host_cpu_w"] == 120.0).all() and df.loc[
        df.gpu == 1, "host_cpu_w"
    ].isna().all()


def test_fake_nvml_sampler_survives_a_failing_source(fake_nvml, caplog):
    class Broken:
        index, node = 7, "n0"

        def sample(self, t_s):
            raise RuntimeError("sensor gone")

    sampler = TelemetrySampler([nvml.NvmlGpu(0, gpm=False), Broken()], 1.0, time.time())
    with caplog.at_level(logging.WARNING):
        sampler.sample_once()
        sampler.sample_once()
    df = sampler.frame()
    assert len(df) == 4 and df.loc[df.gpu == 7, "power_w"].isna().all()
    assert caplog.text.count("sensor gone") == 1
