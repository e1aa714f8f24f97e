"""benchmarks/gpu_check.py step g), the emulator's anchor measured: observe-only GEMM and triad
readings in the form ``wattflex calibrate --gpu-check`` reads. On this machine the kernels run
on the CPU against FAKE NVML GPUs (tests/fakes/fake_pynvml.py): the plumbing is tested, the
measurement itself is unproven until a GPU runs it."""

import argparse
import json

import pytest

from tests.fakes import fake_pynvml
from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from tests.unit.test_gpu_check import gpu_check  # noqa: F401 (fixture: the script as a module)
from wattflex.cli import main as wattflex
from wattflex.gpus import GPUS


def test_the_anchor_step_needs_a_gpu(gpu_check):
    out = gpu_check.anchor_kernels(
        argparse.Namespace(device="cpu", anchor_seconds=1.0), "NVIDIA H200"
    )
    assert "needs --device cuda" in out["skipped"]
    assert (
        gpu_check.catalogue_model("NVIDIA H200") == "H200"
        and gpu_check.catalogue_model("Tesla V100") is None
    )


@pytest.mark.fake_gpu
def test_fake_gpu_gemm_and_triad_readings_are_steady_second_half_values_and_set_nothing(
    gpu_check, fake_nvml, tmp_path, capsys
):
    from wattflex.runs.devices import nvml

    gpu = nvml.open_gpus(indices=[0], gpm=False, set_limit=gpu_check.refuse_to_set)[0]
    gemm = gpu_check.steady_reading(
        "gemm", gpu_check.kernel_timeline("gemm", "cpu", 1.2, gpu.sample, n=128), "H200"
    )
    triad = gpu_check.steady_reading(
        "triad", gpu_check.kernel_timeline("triad", "cpu", 1.2, gpu.sample, triad_mb=4), "H200"
    )
    # the fake GPU: 650 W demand under a 700 W limit, so full clock and no binding limit
    assert gemm["sm_clock_mhz"] == 1980 and gemm["power_w"] == pytest.approx(650, rel=0.05)
    assert gemm["power_limit_w"] == 700 and gemm["n_samples"] >= 2
    peak_at_clock = GPUS["H200"].tensor_flops_per_s(1.0)  # 1980 MHz = f_max
    assert gemm["tensor_activity"] == pytest.approx(gemm["tflops"] * 1e12 / peak_at_clock)
    assert triad["hbm_efficiency"] == pytest.approx(
        triad["bandwidth_gb_s"] / (GPUS["H200"].hbm_tb_s * 1e3)
    )
    assert fake_pynvml.state()["set_calls"] == [] and limits_w() == [700.0, 700.0]
    # what calibrate makes of it: 650 W of 700 W never binds, so no anchor (a clear refusal)
    path = tmp_path / "gpu_check_h200.json"
    path.write_text(json.dumps({"steps": {"anchor_gemm": {"ok": True, **gemm}}}))
    assert wattflex(["calibrate", "--gpu-check", str(path)]) == 2
    assert "the limit did not bind" in capsys.readouterr().err
