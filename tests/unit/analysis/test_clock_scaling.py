"""wattflex.analysis.clock_scaling: the a + b/f fit recovers known parameters, plateau and power-shape
detection on synthetic curves, and the shipped Perseus SM-clock profiles parse and fit."""

import numpy as np
import pandas as pd
import pytest

from wattflex.analysis.clock_scaling import (
    distinct_stages,
    fit_clock_scaling,
    held_clock_max,
    power_shape,
    read_perseus_profile,
    stage_series,
)

CLOCKS = np.arange(855.0, 1410.0 + 1, 15.0)  # the A100 profiles' locked clocks


def test_fit_recovers_a_and_b_from_noisy_synthetic_times():
    a, b = 0.015, 120.0  # s, s*MHz: 15 ms fixed + 120 MHz*s of clocked work
    rng = np.random.default_rng(3)
    t = (a + b / CLOCKS) * (1 + rng.normal(0, 0.002, CLOCKS.size))
    fit = fit_clock_scaling(CLOCKS, t)
    assert fit.a_s == pytest.approx(a, rel=0.1)
    assert fit.b_s_mhz == pytest.approx(b, rel=0.02)
    assert fit.f_ref_mhz == 1410.0
    assert fit.clock_independent_share == pytest.approx(a / (a + b / 1410.0), abs=0.01)
    assert fit.r2 > 0.99 and fit.max_rel_residual < 0.01 and fit.n == CLOCKS.size


def test_exact_data_fits_exactly_and_share_is_evaluated_at_the_reference_clock():
    t = 0.02 + 60.0 / CLOCKS
    fit = fit_clock_scaling(CLOCKS, t, f_ref_mhz=1000.0)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.max_rel_residual < 1e-9
    assert fit.clock_independent_share == pytest.approx(0.02 / (0.02 + 60.0 / 1000.0))


def test_pure_clock_bound_time_has_no_clock_independent_share_and_superlinear_time_goes_negative():
    assert fit_clock_scaling(CLOCKS, 80.0 / CLOCKS).clock_independent_share == pytest.approx(
        0.0, abs=1e-9
    )
    # time growing faster than 1/f is not forced into [0, 1]: the fit says so with a < 0
    assert fit_clock_scaling(CLOCKS, 1e5 / CLOCKS**2).clock_independent_share < 0


def test_fit_needs_three_distinct_clocks():
    with pytest.raises(ValueError, match="3 distinct"):
        fit_clock_scaling([1000.0, 1000.0, 1200.0], [1.0, 1.0, 0.9])


def test_held_clock_max_drops_a_power_plateau_and_keeps_a_rising_top():
    clocks = np.arange(855.0, 1740.0 + 1, 15.0)
    rising = 300.0 * (clocks / 1740.0) ** 2.3
    assert held_clock_max(clocks, rising) == 1740.0
    capped = np.minimum(rising, 0.85 * 300.0)  # a board limit reached at ~0.93 f_max
    top = held_clock_max(clocks, capped)
    assert (
        capped[clocks == top][0] < 0.985 * capped.max()
    )  # the returned clock is below the plateau
    assert top >= clocks[capped < 0.85 * 300.0 * 0.985].max()  # and the highest such clock
    with pytest.raises(ValueError, match="flat"):
        held_clock_max(clocks, np.full(clocks.size, 250.0))


def test_power_shape_recovers_a_power_law():
    clocks = np.arange(345.0, 1980.0 + 1, 15.0)
    p = 600.0 * (clocks / 1980.0) ** 2.5
    shape = power_shape(clocks, p, 1980.0, x_lo=0.61, x_hi=1.0)
    assert shape.exponent_top == pytest.approx(2.5, rel=1e-6)
    assert shape.ratio == pytest.approx(0.61**2.5, rel=2e-3)  # linear interpolation between bins
    with pytest.raises(ValueError, match="covers"):
        power_shape(clocks, p, 1980.0, x_lo=0.1)


def test_stage_series_adds_the_passes_and_takes_energy_over_time():
    prof = pd.DataFrame(
        {
            "stage": [0] * 6,
            "instruction": ["forward", "backward"] * 3,
            "clock_mhz": [1000.0, 1000.0, 1100.0, 1100.0, 1200.0, 1200.0],
            "time_s": [1.0, 2.0, 0.9, 1.8, 0.8, 1.6],
            "energy_j": [100.0, 260.0, 99.0, 252.0, 96.0, 240.0],
        }
    )
    prof["power_w"] = prof["energy_j"] / prof["time_s"]
    s = stage_series(prof, 0, "forward+backward")
    assert s["time_s"].tolist() == pytest.approx([3.0, 2.7, 2.4])
    assert s["power_w"].tolist() == pytest.approx([360 / 3.0, 351 / 2.7, 336 / 2.4])
    assert stage_series(prof, 0, "backward")["time_s"].tolist() == pytest.approx([2.0, 1.8, 1.6])
    with pytest.raises(ValueError, match="lacks"):
        stage_series(prof, 1, "forward")


def test_read_perseus_profile_rejects_a_wrong_name_or_missing_columns(tmp_path):
    bad = tmp_path / "profile.csv"
    bad.write_text("stage,instruction,frequency,time,energy\n0,forward,1410,0.05,24\n")
    with pytest.raises(ValueError, match="not named"):
        read_perseus_profile(bad)
    short = tmp_path / "sm_frequency_profile_m+a100_sxm_bf16.csv"
    short.write_text("stage,instruction,frequency,time\n0,forward,1410,0.05\n")
    with pytest.raises(ValueError, match="energy"):
        read_perseus_profile(short)


@pytest.mark.parametrize(
    "name", ["bloom+a100_sxm", "gpt3-175b+a100_sxm", "bloom+a40", "gpt3-175b+a40"]
)
def test_shipped_perseus_profiles_parse_and_give_a_share_in_0_1(resources, name):
    prof = read_perseus_profile(
        resources / "external" / "perseus-sosp24" / f"sm_frequency_profile_{name}_bf16.csv"
    )
    assert prof["gpu"].iat[0] == ("A100-SXM" if "a100" in name else "A40")
    assert set(prof["instruction"]) == {"forward", "backward"}
    assert distinct_stages(prof) == [
        [0, 1, 2, 3, 4, 5, 6],
        [7],
    ]  # the middle stages repeat one profile
    for stage in (0, 7):
        s = stage_series(prof, stage, "forward+backward")
        top = held_clock_max(s["clock_mhz"], s["power_w"])
        held = s[s["clock_mhz"] <= top]
        fit = fit_clock_scaling(held["clock_mhz"], held["time_s"])
        assert 0.0 <= fit.clock_independent_share <= 1.0
        assert fit.r2 > 0.9
        # power falls as the clock drops (A100 by about half, A40 by about a third, to 0.61 f_max)
        f_max = float(prof["clock_mhz"].max())
        shape = power_shape(s["clock_mhz"], s["power_w"], f_max, 0.61, top / f_max)
        assert 0.3 < shape.ratio < 0.8


def test_a40_profiles_reach_a_power_plateau_below_the_top_clock(resources):
    prof = read_perseus_profile(
        resources / "external" / "perseus-sosp24" / "sm_frequency_profile_bloom+a40_bf16.csv"
    )
    s = stage_series(prof, 0, "forward+backward")
    top = held_clock_max(s["clock_mhz"], s["power_w"])
    assert top < 0.9 * s["clock_mhz"].max()
    assert s.loc[s["clock_mhz"] > top, "power_w"].max() < 300.0  # the A40's 300 W board limit
