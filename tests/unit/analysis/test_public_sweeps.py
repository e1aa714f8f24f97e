"""The test-set rows of the fidelity section: the shipped public sweeps, scored by the emulator."""

import numpy as np
import pandas as pd
import pytest

from wattflex.analysis import public_sweeps as ps


@pytest.fixture(scope="module")
def perseus():
    return ps.perseus_a100_rows(
        ps.PERSEUS / "power_limit_sweeps_A100.csv",
        sorted(ps.PERSEUS.glob("sm_frequency_profile_*.csv")),
    )


def test_perseus_sweeps_score_each_job_with_the_anchor_fitted_on_the_other(perseus):
    from wattflex.analysis import calibration as cal

    groups, measured, _ = ps.cal.perseus_a100_calibration(
        ps.PERSEUS / "power_limit_sweeps_A100.csv"
    )
    errs = []
    for held in groups:
        other = [g for g in groups if g.id != held.id]
        c = cal.calibrate(other, measured.reindex([g.id for g in other]), "x", cross_validate=False)
        errs.append(abs(cal.noise_free_pfi([held], c.physics())[held.id] - measured[held.id]))
    sweeps = next(r for r in perseus if r["test_set"].startswith("Perseus A100 power-limit"))
    assert sweeps["pfi_mae"] == pytest.approx(np.mean(errs), abs=1e-9)
    assert sweeps["n"] == 2 and "scored job's PFI" in sweeps["not_fitted_to"]


def test_perseus_profiles_row_is_the_emulated_minus_the_measured_clock_shape(perseus):
    prof = next(r for r in perseus if "SM-clock" in r["test_set"])
    assert prof["n"] == 4  # BLOOM and GPT-3 175B, stages 0-6 and 7, forward+backward
    assert "0.606-0.957" in prof["data"]  # the window every pass of every A100 profile held
    assert np.isfinite(prof["clock_share_error_pp"]) and np.isfinite(prof["power_exponent_error"])
    assert "any clock profile" in prof["not_fitted_to"]


def test_sweeps_on_gpus_without_a_model_are_rows_that_say_so():
    files = sorted(ps.ZEUS.glob("summary_power_*.csv")) + sorted(
        ps.PERSEUS.glob("power_limit_sweeps_*.csv")
    )
    rows = ps.unscored_rows(files)
    names = {r["test_set"] for r in rows}
    assert (
        "Zeus NSDI'23 V100 power-limit sweeps" in names
        and "Perseus SOSP'24 A40 power-limit sweeps" in names
    )
    assert not any("A100" in n for n in names)
    assert all(np.isnan(r["pfi_mae"]) and "no " in r["note"] for r in rows)


def test_scored_sets_table_puts_table6_the_refits_and_the_sweeps_side_by_side(perseus):
    loto = pd.DataFrame(
        [
            {
                "fit_set": "tables7-8-dense",
                "default": True,
                "n_facts": 5,
                "mae_out_of_sample_table6": 0.2,
                "mae_out_of_sample_other": 0.1,
                "spearman_table6": 0.6,
            },
            {
                "fit_set": "table7",
                "default": False,
                "n_facts": 0,
                "mae_out_of_sample_table6": np.nan,
                "mae_out_of_sample_other": np.nan,
                "spearman_table6": np.nan,
            },
            {
                "fit_set": "(published)",
                "default": np.nan,
                "n_facts": np.nan,
                "mae_out_of_sample_table6": np.nan,
                "mae_out_of_sample_other": np.nan,
                "spearman_table6": 1.0,
            },
        ]
    )
    t = ps.scored_sets_table(
        {"mae_out_of_sample_table6": 0.21, "spearman_table6": 0.62},
        ["a", "b"],
        "tables7-8-dense",
        24,
        loto,
        perseus,
    )
    assert list(t.columns) == list(ps.COLUMNS)
    assert t["test_set"].str.startswith("Table 6").sum() == 1
    assert (
        t.loc[0, "pfi_mae"] == 0.21
        and t.loc[0, "spearman"] == 0.62
        and t.loc[0, "not_fitted_to"] == "Table 6"
    )
    assert "anchor_clock_mhz" in t.loc[0, "fitted_to"] and "dense_gemm_eff" in t.loc[0, "fitted_to"]
    refits = t[t["test_set"].str.startswith("leave one table out")]
    assert list(refits["pfi_mae"].fillna(-1)) == [0.2, -1]  # (published) is no test set
    assert "no group of this set" in refits.iloc[1]["note"]
    assert t["test_set"].str.startswith("Perseus").sum() == 2
