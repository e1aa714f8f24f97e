"""The power model's calibration against its sources (wattflex.calibration; see
wattflex.runs.emulator's docstring): the DGEMM table, the anchor and what it implies."""

import dataclasses

import pytest

from wattflex.calibration import UJENIYA_H100_DGEMM, fit_power_curve, physics_at_anchor
from wattflex.gpus import GPUS
from wattflex.runs.emulator import PHYSICS, Physics, power_model_clock_for_cap, voltage


def test_every_physics_constant_names_its_source_and_whether_perturbing_it_makes_sense():
    for f in dataclasses.fields(Physics):
        assert isinstance(f.metadata.get("source"), str) and len(f.metadata["source"]) > 10, f.name
        assert isinstance(f.metadata.get("sensitivity"), bool), f.name
        assert isinstance(getattr(PHYSICS, f.name), (int, float)), f.name


@pytest.mark.parametrize("cap_w,clock_mhz", sorted(UJENIYA_H100_DGEMM.items()))
def test_calibration_reproduces_the_published_h100_dgemm_cap_to_clock_table(cap_w, clock_mhz):
    assert abs(power_model_clock_for_cap(GPUS["H100"], cap_w) - clock_mhz) <= 30


def test_a_bf16_gemm_holds_the_anchor_clock_under_700_w():
    clock = power_model_clock_for_cap(GPUS["H100"], 700, tensor_util=PHYSICS.anchor_tensor_util)
    assert abs(clock - PHYSICS.anchor_clock_mhz) <= 15


def test_the_power_curve_constants_are_the_fit_at_the_anchor():
    c = fit_power_curve(PHYSICS.anchor_clock_mhz)
    assert c.sm_dyn_w == pytest.approx(PHYSICS.sm_dyn_w, rel=0.002)
    assert c.v_min == pytest.approx(PHYSICS.v_min, abs=0.005)
    assert c.v_exp == pytest.approx(PHYSICS.v_exp, abs=0.05)
    assert c.calib_tensor_util == pytest.approx(PHYSICS.calib_tensor_util, abs=0.002)
    assert c.max_table_error_mhz <= 30


def test_a_lower_anchor_means_more_sm_power_and_the_same_voltage_curve():
    # the table fixes the voltage curve; the anchor only splits the DGEMM's power
    lo, hi = fit_power_curve(1605.0), fit_power_curve(1830.0)
    assert lo.sm_dyn_w > hi.sm_dyn_w * 1.25
    assert lo.v_min == pytest.approx(hi.v_min, abs=1e-3) and lo.v_exp == pytest.approx(
        hi.v_exp, abs=1e-2
    )
    # the earlier reading (the datasheet's 1830 MHz as the bf16 clock) gave 1045 W
    assert hi.sm_dyn_w == pytest.approx(1045, rel=0.01)
    ph = physics_at_anchor(1605.0)
    assert (
        abs(
            power_model_clock_for_cap(
                GPUS["H100"], 700, tensor_util=ph.anchor_tensor_util, physics=ph
            )
            - 1605
        )
        <= 15
    )


def test_voltage_curve_is_flat_at_low_clocks_and_steep_near_the_top():
    lo = voltage(0.5) - voltage(0.3)
    hi = voltage(1.0) - voltage(0.8)
    assert hi > 5 * lo
    assert voltage(1.0) == pytest.approx(1.0)
