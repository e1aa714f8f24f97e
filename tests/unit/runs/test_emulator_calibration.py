"""The power model's calibration against its sources (see wattflex.runs.emulator's docstring)."""

import dataclasses

import numpy as np
import pytest
from scipy.optimize import least_squares

from wattflex.gpus import GPUS
from wattflex.runs.emulator import PHYSICS, Physics, power_model_clock_for_cap, voltage

# Ujeniya et al. 2026 (arXiv:2604.11391), H100, FP64 DGEMM: cap (W) -> steady SM clock (MHz).
UJENIYA_H100_DGEMM = {200: 625, 300: 1132, 400: 1501, 500: 1731, 600: 1889, 700: 1969}


def _dgemm_power(gpu, f_mhz, sm_dyn_w, v_min, v_exp, activity, ph=PHYSICS):
    x = np.asarray(f_mhz, float) / gpu.sm_clock_max_mhz
    v = v_min + (1 - v_min) * x**v_exp
    return (gpu.idle_w + gpu.mem_dyn_w * ph.calib_dram_util
            + sm_dyn_w * x * v**2 * (ph.sm_busy_weight + ph.tensor_weight * activity))


def test_every_physics_constant_names_its_source_and_whether_perturbing_it_makes_sense():
    for f in dataclasses.fields(Physics):
        assert isinstance(f.metadata.get("source"), str) and len(f.metadata["source"]) > 10, f.name
        assert isinstance(f.metadata.get("sensitivity"), bool), f.name
        assert isinstance(getattr(PHYSICS, f.name), (int, float)), f.name


@pytest.mark.parametrize("cap_w,clock_mhz", sorted(UJENIYA_H100_DGEMM.items()))
def test_calibration_reproduces_the_published_h100_dgemm_cap_to_clock_table(cap_w, clock_mhz):
    assert abs(power_model_clock_for_cap(GPUS["H100"], cap_w) - clock_mhz) <= 30


def test_a_bf16_gemm_holds_the_datasheet_peak_clock_under_700_w():
    gpu = GPUS["H100"]
    clock = power_model_clock_for_cap(gpu, 700, tensor_util=PHYSICS.dense_gemm_eff)
    assert abs(clock - PHYSICS.calib_bf16_clock_mhz) <= 15
    # the datasheet's peak is the rate at that clock
    x = PHYSICS.calib_bf16_clock_mhz / gpu.sm_clock_max_mhz
    assert gpu.tensor_flops_per_s(x) == pytest.approx(989.4e12)


def test_constants_are_the_least_squares_fit_to_the_table_and_the_datasheet_clock():
    gpu = GPUS["H100"]
    caps = np.array(list(UJENIYA_H100_DGEMM), float)
    clocks = np.array(list(UJENIYA_H100_DGEMM.values()), float)

    def residuals(p):
        sm_dyn_w, v_min, v_exp, activity = p
        r = (_dgemm_power(gpu, clocks, *p) - caps) / 10.0
        x = PHYSICS.calib_bf16_clock_mhz / gpu.sm_clock_max_mhz
        v = v_min + (1 - v_min) * x**v_exp
        p_bf16 = (gpu.idle_w + gpu.mem_dyn_w * PHYSICS.calib_dram_util
                  + sm_dyn_w * x * v**2 * (PHYSICS.sm_busy_weight + PHYSICS.tensor_weight * PHYSICS.dense_gemm_eff))
        return np.append(r, (p_bf16 - 700.0) / 10.0)

    fit = least_squares(residuals, [1200, 0.8, 7.0, 0.3], bounds=([200, 0.3, 1, 0], [5000, 1, 20, 1]))
    sm_dyn_w, v_min, v_exp, activity = fit.x
    assert sm_dyn_w == pytest.approx(gpu.sm_dyn_w, rel=0.01)
    assert v_min == pytest.approx(PHYSICS.v_min, abs=0.005)
    assert v_exp == pytest.approx(PHYSICS.v_exp, abs=0.05)
    assert activity == pytest.approx(PHYSICS.calib_tensor_util, abs=0.005)
    # the H200 shares the die, hence the fit (no H200 table was found)
    assert GPUS["H200"].sm_dyn_w == GPUS["H100"].sm_dyn_w


def test_voltage_curve_is_flat_at_low_clocks_and_steep_near_the_top():
    lo = voltage(0.5) - voltage(0.3)
    hi = voltage(1.0) - voltage(0.8)
    assert hi > 5 * lo
    assert voltage(1.0) == pytest.approx(1.0)
