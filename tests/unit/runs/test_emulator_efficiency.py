"""Achieved efficiency and SM activity from published facts: the dense-GEMM
efficiency is what torchtitan's published H100 throughput implies, and a kernel's SM power
follows its own roofline activity."""

import dataclasses

import numpy as np
import pytest

from wattflex.analysis import calibration as cal
from wattflex.gpus import GPUS
from wattflex.runs.emulator.physics import PHYSICS
from wattflex.runs.emulator.step import Kernel


def test_the_dense_gemm_efficiency_is_the_one_torchtitans_published_throughput_implies():
    eff, table = cal.derive_dense_gemm_eff(PHYSICS)
    assert PHYSICS.dense_gemm_eff == pytest.approx(eff)
    # every bf16 pure-FSDP row of the published table within 10 % (compile's effect is not modelled)
    ratio = table["emulated_tps"] / table["published_tps"]
    assert len(table) == 4 and ratio.between(0.90, 1.10).all(), table


def test_the_anchor_is_defined_at_its_own_reference_activity_not_a_jobs_efficiency():
    # changing a training job's efficiency leaves the fitted power curve of an anchor alone
    ph = dataclasses.replace(PHYSICS, dense_gemm_eff=0.9)
    assert cal.fit_power_curve(1600, ph).sm_dyn_w == pytest.approx(
        cal.fit_power_curve(1600, PHYSICS).sm_dyn_w
    )


def test_a_memory_bound_kernel_keeps_its_sms_less_busy_and_draws_less_than_a_compute_bound_one():
    gpu = GPUS["H200"]
    x = np.array([1.0, 0.3])
    stream = Kernel("elementwise", dram_bytes=1e12, issue_bytes=1e12)
    act = stream.sm_activity(gpu, x)
    assert act[0] < 1.0 and act[1] == pytest.approx(1.0)  # issue-bound at low clocks
    gemm = Kernel("dense_gemm", tensor_flops=1e15, efficiency=0.5, dram_bytes=1e9)
    assert gemm.sm_activity(gpu, x) == pytest.approx([1.0, 1.0])
    # floor: a kernel HBM sets never drops below the stall activity
    assert Kernel("x", dram_bytes=1e12, issue_bytes=1e6).sm_activity(gpu, x)[0] == pytest.approx(
        PHYSICS.sm_stall_activity
    )
