"""The PFI vectorised across groups (one shared random stream per group size, the isotonic
shortcut): point estimates equal to the per-group code's, and CIs that still cover."""

import numpy as np
import pandas as pd
import pytest
from sklearn.isotonic import isotonic_regression

import wattflex.pfi as pfi

SEM_COLS = dict(power_sem_col="power_w_sem", throughput_sem_col="throughput_sem")
POINT_COLUMNS = [
    "group",
    "n_caps",
    "pfi_ratio",
    "pfi_area",
    "pfi_elasticity",
    "status",
    "pfi_robust",
    "robust_status",
    "n_binding",
    "uncapped_cap_w",
    "uncapped_power_w",
    "uncapped_throughput",
    "per_cap",
]
CI_COLUMNS = ["ci95_low", "ci95_high", "pfi_robust_ci95_low", "pfi_robust_ci95_high"]


def table(n_groups=40, seed=3, caps=(200.0, 400.0, 600.0, 700.0), noise=0.005, t_sem=0.3):
    rng = np.random.default_rng(seed)
    caps = np.asarray(caps)
    k = np.repeat(rng.uniform(0.3, 1.0, n_groups), caps.size)
    cap = np.tile(caps, n_groups)
    true = 100 * (1 - k * (1 - cap / caps.max()) ** 1.5)
    return pd.DataFrame(
        {
            "group": np.repeat([f"g/{i}" for i in range(n_groups)], caps.size),
            "cap_w": cap,
            "power_w": 8 * cap * 0.95,
            "throughput": true * rng.normal(1, noise, cap.size),
            "power_w_sem": 5.0,
            "throughput_sem": t_sem,
            "gpus": 8,
            "true_throughput": true,
        }
    )


@pytest.mark.parametrize("seed", range(5))
def test_the_isotonic_shortcut_is_bit_for_bit_scikit_learns_pava(seed):
    rng = np.random.default_rng(seed)
    p = rng.permutation(np.arange(1.0, 7.0)) * 100
    t = np.sort(rng.uniform(50, 100, 6))[np.argsort(np.argsort(p))]  # non-decreasing in power
    w = rng.uniform(0.5, 2.0, 6)
    order = np.argsort(p)
    expected = np.empty(6)
    expected[order] = isotonic_regression(t[order], sample_weight=w[order])
    assert np.array_equal(pfi.isotonic_fit(p, t, w), expected)


def test_point_estimates_do_not_depend_on_the_monte_carlo_or_the_other_groups():
    df = table()
    df.loc[df.cap_w == 600, "throughput"] *= np.where(
        np.arange(40) % 3 == 0, 1.06, 1.0
    )  # dips: isotonic pools
    with_ci = pfi.pfi_table(df.drop(columns="true_throughput"), mc_samples=3000, **SEM_COLS)
    without = pfi.pfi_table(df.drop(columns="true_throughput"), mc_samples=0, **SEM_COLS)
    assert with_ci.notes.str.contains("non_monotone").sum() > 0
    assert with_ci[POINT_COLUMNS].equals(without[POINT_COLUMNS])
    half = pfi.pfi_table(
        df[df.group.isin([f"g/{i}" for i in range(0, 40, 2)])].drop(columns="true_throughput"),
        mc_samples=3000,
        **SEM_COLS,
    )
    assert half.set_index("group")[POINT_COLUMNS[1:] + CI_COLUMNS].equals(
        with_ci.set_index("group").loc[half.group, POINT_COLUMNS[1:] + CI_COLUMNS]
    )


def test_cis_are_deterministic_per_seed_and_change_with_it():
    df = table(10).drop(columns="true_throughput")
    a, b = (pfi.pfi_table(df, mc_samples=2000, seed=7, **SEM_COLS) for _ in range(2))
    c = pfi.pfi_table(df, mc_samples=2000, seed=8, **SEM_COLS)
    assert a[CI_COLUMNS].equals(b[CI_COLUMNS]) and not a[CI_COLUMNS].equals(c[CI_COLUMNS])


def test_the_ratio_ci_covers_the_true_pfi_about_95_percent_of_the_time():
    """400 groups measured with noise equal to their SEMs: the share of 95 % intervals that
    contain the PFI of the noise-free curve is near 0.95 (binomial sd ~0.011 at 400)."""
    df = table(400, seed=11, noise=0.0, t_sem=0.8)
    rng = np.random.default_rng(12)
    df["throughput"] = df.true_throughput + rng.normal(0, 0.8, len(df))
    df["power_w"] = df.power_w + rng.normal(0, 5.0, len(df))
    out = pfi.pfi_table(df.drop(columns="true_throughput"), mc_samples=4000, **SEM_COLS).set_index(
        "group"
    )
    truth = pd.Series(
        {
            g: pfi.pfi_ratio(8 * part.cap_w * 0.95, part.true_throughput)
            for g, part in df.groupby("group", sort=False)
        }
    )
    covered = ((out.ci95_low <= truth) & (truth <= out.ci95_high)).mean()
    assert 0.90 <= covered <= 0.99, covered


def test_groups_of_different_sizes_use_their_own_stream():
    four = table(5).drop(columns="true_throughput")
    six = table(5, seed=4, caps=(200.0, 300.0, 400.0, 500.0, 600.0, 700.0)).drop(
        columns="true_throughput"
    )
    six["group"] = "six-" + six.group
    both = pfi.pfi_table(
        pd.concat([four, six], ignore_index=True), mc_samples=1000, **SEM_COLS
    ).set_index("group")
    alone = pfi.pfi_table(six, mc_samples=1000, **SEM_COLS).set_index("group")
    assert both.loc[alone.index, CI_COLUMNS].equals(alone[CI_COLUMNS])
    assert both[CI_COLUMNS].notna().all().all()
