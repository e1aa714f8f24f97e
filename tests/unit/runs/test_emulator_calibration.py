"""The power model's calibration against its sources (wattflex.analysis.calibration; see
wattflex.runs.emulator's docstring): the measured H100 power-clock reading, the anchor fitted on
public sweeps, and what they imply."""

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import wattflex.analysis.calibration as cal
from wattflex.analysis.calibration import fit_power_curve, physics_at_anchor
from wattflex.config import load_config
from wattflex.gpus import GH100_STATIC_W, GPUS, HBM_DYN_W_94GB, HBM_IDLE_W_94GB
from wattflex.runs.emulator.physics import PHYSICS, Physics, voltage
from wattflex.runs.emulator.step import job_at_cap, power_model_clock_for_cap

REPO = Path(__file__).resolve().parents[3]


def test_every_physics_constant_names_its_source_and_whether_perturbing_it_makes_sense():
    for f in dataclasses.fields(Physics):
        assert isinstance(f.metadata.get("source"), str) and len(f.metadata["source"]) > 10, f.name
        assert isinstance(f.metadata.get("sensitivity"), bool), f.name
        assert isinstance(getattr(PHYSICS, f.name), (int, float)), f.name


def test_the_reading_is_fitted_on_its_measured_draws_and_reproduced_within_30_mhz():
    table = cal.read_power_clock()
    # the reading itself: at the 700 W cap the draw is below the cap and the clock near f_max
    top = table.iloc[-1]
    assert top["cap_w"] == 700 and top["power_w"] < 0.95 * top["cap_w"]
    assert top["sm_clock_mhz"] >= GPUS["H100-94GB"].sm_clock_max_mhz - 15
    errors = cal.reading_clock_errors()
    assert np.abs(errors).max() <= 30, errors


def test_the_catalogue_and_physics_hold_the_fit_of_the_reading():
    v = cal.fit_voltage_curve()
    assert max(map(abs, v.residuals_w)) <= 2.0 and max(map(abs, v.mem_residuals_w)) <= 2.0
    assert v.v_min == pytest.approx(PHYSICS.v_min, abs=0.001)
    assert v.v_exp == pytest.approx(PHYSICS.v_exp, abs=0.01)
    assert v.static_w == pytest.approx(GH100_STATIC_W, abs=0.05)
    assert v.mem_idle_w == pytest.approx(HBM_IDLE_W_94GB, abs=0.05)
    assert v.mem_dyn_w == pytest.approx(HBM_DYN_W_94GB, abs=0.05)
    part = GPUS["H100-94GB"]
    assert (part.mem_idle_w, part.mem_dyn_w) == (HBM_IDLE_W_94GB, HBM_DYN_W_94GB)


def test_a_fit_on_caps_written_as_draws_is_refused(tmp_path):
    table = pd.read_csv(cal.UJENIYA_READING)
    table["power_w"] = table["cap_w"]  # the earlier calibration's reading: each cap as the draw
    path = tmp_path / "caps_as_draws.csv"
    table.to_csv(path, index=False)
    with pytest.raises(ValueError, match="every draw equals its cap: these are caps, not measured"):
        cal.read_power_clock(path)
    with pytest.raises(ValueError, match="without a measured board draw"):
        cal.read_power_clock_frame(table.assign(power_w=np.nan))


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


class _Opened:
    """The files opened while active (a Python audit hook: it sees every open, C-level too)."""

    def __init__(self):
        self.paths: list[str] | None = None
        sys.addaudithook(self._hook)

    def _hook(self, event, args):
        if event == "open" and self.paths is not None and isinstance(args[0], (str, Path)):
            self.paths.append(str(args[0]))


_OPENED = _Opened()


def test_the_default_anchor_is_fitted_on_public_sweeps_and_reads_no_paper_table():
    _OPENED.paths = []
    try:
        anchor, a100 = cal.public_anchor()
    finally:
        opened, _OPENED.paths = _OPENED.paths, None
    assert anchor == PHYSICS.anchor_clock_mhz
    assert a100.pinned and a100.gpu_die == "GA100"
    assert any("perseus-sosp24" in p for p in opened)
    assert not [p for p in opened if "resources/paper" in p or "/work/shared" in p]


def test_a_lower_anchor_means_more_sm_power_and_the_same_voltage_curve():
    # the reading fixes the voltage curve; the anchor only splits the workload's power
    lo, hi = fit_power_curve(1605.0), fit_power_curve(1830.0)
    assert lo.sm_dyn_w > hi.sm_dyn_w * 1.1
    assert (lo.v_min, lo.v_exp) == (hi.v_min, hi.v_exp)
    ph = physics_at_anchor(1605.0)
    clock = power_model_clock_for_cap(
        GPUS["H100"], 700, tensor_util=ph.anchor_tensor_util, physics=ph
    )
    assert abs(clock - 1605) <= 15


def test_a_memory_bound_group_draws_below_the_700_w_cap_at_the_top_clock():
    cfg = load_config(REPO / "config" / "config.yaml")
    groups = {g.id: g for g in cal.config_group_models(cfg)}
    # gpt-oss-20b LoRA at seq 4096: eager attention streams every score through HBM
    g = groups["moe-ft-gptoss20b-x8-seq4096-bs8"]
    gpu = GPUS[g.gpu]
    state = job_at_cap(g.job, gpu, 700.0, np.ones(1)).per_gpu[0]
    assert state.dram_active > 0.3
    assert state.sm_clock_mhz == gpu.sm_clock_max_mhz  # the cap does not bind
    assert state.power_w < 0.95 * 700.0


def test_voltage_curve_is_flat_at_low_clocks_and_steep_near_the_top():
    lo = voltage(0.5) - voltage(0.3)
    hi = voltage(1.0) - voltage(0.8)
    assert hi > 2.5 * lo
    assert voltage(1.0) == pytest.approx(1.0)


def test_the_caps_as_draws_what_if_refits_the_refused_reading_with_its_own_anchor():
    # what the fidelity table sets beside the default: the same fit on caps read as draws
    ph = cal.caps_as_draws_physics()
    assert ph.v_exp > PHYSICS.v_exp + 2  # caps as draws: power rising steeply at the top
    assert ph.anchor_clock_mhz != PHYSICS.anchor_clock_mhz
    assert (ph.dense_gemm_eff, ph.expert_gemm_rel_eff) == (
        PHYSICS.dense_gemm_eff,
        PHYSICS.expert_gemm_rel_eff,
    )
