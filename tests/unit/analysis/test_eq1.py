"""Paper Eq. 1 has one home (wattflex.pfi.pfi_ratio_curves, its term eq1_term, its edge rule
eq1_counts): the same curves fed to every caller give the same PFI, the edge cases included
(a point exactly at T_max left out, one a hair below it kept, none left: NaN, never 0 or inf)."""

import numpy as np
import pandas as pd
import pytest

from wattflex import pfi
from wattflex.analysis import calibration, fidelity
from wattflex.ops.adapters.slurm import group_curves
from wattflex.ops.controller import curve_pfi
from wattflex.runs.sweep import algorithm

CAPS = np.array([200.0, 300.0, 400.0, 500.0, 600.0, 700.0])
POWER = 0.97 * CAPS
T_MAX = 1000.0
CURVES = {  # name: throughput at CAPS (the uncapped reference last)
    "power_law": T_MAX * (POWER / POWER[-1]) ** (1 / 1.4),
    "one_at_t_max": np.array([600.0, 700.0, 800.0, 900.0, T_MAX, T_MAX]),
    "one_a_hair_below": np.array([600.0, 700.0, 800.0, 900.0, T_MAX * (1 - 1e-12), T_MAX]),
    "capped_faster": np.array([600.0, 700.0, 800.0, 900.0, 1010.0, T_MAX]),
    "none_lost": np.full(6, T_MAX),
}


def by_hand(t: np.ndarray) -> float:
    """Eq. 1 as the paper writes it, over the points with T_i != T_max; NaN if none."""
    terms = [(1 - POWER[i] / POWER[-1]) / (1 - t[i] / t[-1]) for i in range(5) if t[i] != t[-1]]
    return float(np.mean(terms)) if terms else float("nan")


def runs_table() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "group": name,
                "cap_w": cap,
                "gpus": 1,
                "power_w": p,
                "tokens_per_s": tput,
                "throughput": tput,
            }
            for name, t in CURVES.items()
            for cap, p, tput in zip(CAPS, POWER, t)
        ]
    )


def every_caller() -> dict[str, dict[str, float]]:
    names = list(CURVES)
    stacked = np.stack([CURVES[n] for n in names])
    runs = runs_table()
    table = pfi.pfi_table(runs, gpus_col=None, mc_samples=50).set_index("group")
    slurm = group_curves(runs)
    return {
        "pfi_ratio": {n: pfi.pfi_ratio(POWER, CURVES[n]) for n in names},
        "pfi_ratio_curves": dict(zip(names, pfi.pfi_ratio_curves(POWER, stacked))),
        "pfi_table": table["pfi_ratio"].to_dict(),
        "controller.curve_pfi": dict(zip(names, curve_pfi(np.tile(POWER, (5, 1)), stacked))),
        "calibration.measured_facts": calibration.measured_facts(runs).to_dict(),
        "grid.slurm.group_curves": dict(zip(slurm.groups, slurm.pfi)),
        "sweep.pfi_with_ci": {
            n: algorithm.pfi_with_ci(
                runs[runs["group"] == n].assign(power_se_w=np.nan, tokens_per_s_se=np.nan),
                mc_samples=50,
            )[0]
            for n in names
        },
    }


@pytest.mark.parametrize("name", list(CURVES))
def test_every_caller_of_eq1_gives_the_same_pfi_for_the_same_curve(name):
    expected = by_hand(CURVES[name])
    got = {caller: values[name] for caller, values in every_caller().items()}
    for caller, value in got.items():
        if np.isnan(expected):
            assert np.isnan(value), (caller, got)
        else:
            assert value == pytest.approx(expected, rel=1e-12), (caller, got)


def test_the_edge_rule_is_exact_equality_and_no_term_is_nan():
    assert not pfi.eq1_counts(np.array([T_MAX]), np.array([T_MAX])).any()
    assert pfi.eq1_counts(np.array([T_MAX * (1 - 1e-12)]), np.array([T_MAX])).all()
    assert np.isnan(pfi.pfi_ratio_curves(POWER, CURVES["none_lost"]))
    # a zero reference power makes every term infinite: NaN, never inf
    assert np.isnan(pfi.pfi_ratio_curves(np.r_[POWER[:-1], 0.0], CURVES["power_law"]))


def test_the_callers_that_take_no_curve_use_the_one_function():
    """fidelity and the sweep's variance shares compute Eq. 1 on the curves they make
    themselves: they call pfi_ratio, which is pfi_ratio_curves on one curve."""
    assert fidelity.pfi_ratio is pfi.pfi_ratio and algorithm.pfi_ratio is pfi.pfi_ratio
