"""wattflex.pfi: published definitions against hand arithmetic, diagnostics on pathological
sweeps, the robust PFI and the Monte Carlo CIs."""

import json
import math
import time

import numpy as np
import pandas as pd
import pytest

from wattflex.pfi import (
    OUTPUT_COLUMNS,
    STATUSES,
    grid_sensitivity,
    grid_subset,
    isotonic_fit,
    isotonic_fit_batch,
    pfi_area,
    pfi_elasticity,
    pfi_ratio,
    pfi_table,
)

# A clean sweep, 4 GPUs: caps 200/300/400 W per GPU, job power at the cap, 400 W uncapped.
CAPS = [200, 300, 400]
POWER = [800.0, 1200.0, 1600.0]
THROUGHPUT = [50.0, 70.0, 80.0]


def sweep(caps=CAPS, power=POWER, throughput=THROUGHPUT, group="g", gpus=4, **extra):
    df = pd.DataFrame(
        {"group": group, "cap_w": caps, "power_w": power, "throughput": throughput, "gpus": gpus}
    )
    for k, v in extra.items():
        df[k] = v
    return df


def one(df, **kw):
    kw.setdefault("mc_samples", 0)
    out = pfi_table(df, **kw)
    assert len(out) == 1
    return out.iloc[0]


def per_cap(row):
    return {p["cap_w"]: p for p in json.loads(row.per_cap)}


# --- the three published definitions, by hand ------------------------------------------


def test_ratio_by_hand():
    # terms: (1 - 800/1600) / (1 - 50/80) = 0.5 / 0.375 ; (1 - 1200/1600) / (1 - 70/80) = 0.25 / 0.125
    expected = (0.5 / 0.375 + 0.25 / 0.125) / 2
    assert pfi_ratio(POWER, THROUGHPUT) == pytest.approx(expected)
    assert expected == pytest.approx(5 / 3)


def test_ratio_reference_index_and_exclusion_of_t_equal_tmax():
    # reference passed first; the 1200 W point has T == T_max exactly and is excluded
    assert pfi_ratio([1600, 800, 1200], [80, 50, 80], ref=0) == pytest.approx(0.5 / 0.375)


def test_ratio_is_nan_never_inf_without_terms():
    assert math.isnan(pfi_ratio([800, 1600], [80, 80]))  # the only capped T equals T_max
    assert math.isnan(pfi_ratio([1600], [80]))


def test_area_by_hand_uses_all_points_from_origin():
    # x = P/P_max = 0, .5, .75, 1 ; y = T/T_max = 0, .625, .875, 1 (uncapped point included)
    trapezoids = 0.5 * (0 + 0.625) / 2 + 0.25 * (0.625 + 0.875) / 2 + 0.25 * (0.875 + 1) / 2
    assert pfi_area(POWER, THROUGHPUT) == pytest.approx(trapezoids - 0.5)
    assert trapezoids - 0.5 == pytest.approx(0.078125)
    # sorted by power, not by input order
    assert pfi_area([1200, 800, 1600], [70, 50, 80]) == pytest.approx(0.078125)


def test_elasticity_by_hand_uses_all_points():
    x = [math.log(p) for p in POWER]
    y = [math.log(t) for t in THROUGHPUT]
    mx, my = sum(x) / 3, sum(y) / 3
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
    assert pfi_elasticity(POWER, THROUGHPUT) == pytest.approx(1 - slope)
    # without the uncapped point the fit is different: it really is used
    assert pfi_elasticity(POWER[:2], THROUGHPUT[:2]) != pytest.approx(1 - slope)
    assert math.isnan(pfi_elasticity([800, 800], [50, 60]))


# --- pfi_table on clean and pathological sweeps ----------------------------------------


def test_clean_sweep_table_row():
    row = one(sweep(cluster="dense", model="m"))
    assert list(pfi_table(sweep(), mc_samples=0).columns[:8]) == list(OUTPUT_COLUMNS[:8])
    assert row.status == "ok" and row.robust_status == "ok"
    assert row.n_caps == 3 and row.n_binding == 2
    assert row.pfi_ratio == pytest.approx(5 / 3)
    assert row.pfi_area == pytest.approx(0.078125)
    assert row.pfi_robust == pytest.approx(row.pfi_ratio)  # clean monotone sweep: identical
    assert (row.cluster, row.model, row.gpus) == ("dense", "m", 4)  # metadata carried through
    pts = per_cap(row)
    assert sorted(pts) == [200, 300]  # capped points only
    assert pts[300]["term"] == pytest.approx(2.0) and pts[300]["flags"] == []
    assert pts[200]["power_ratio"] == pytest.approx(0.5)
    assert pts[200]["throughput_ratio"] == pytest.approx(0.625)


def test_duplicated_caps_are_averaged_with_sems_combined():
    df = sweep(
        caps=[200, 300, 300, 400],
        power=[800, 1100, 1300, 1600],
        throughput=[50, 68, 72, 80],
        power_w_sem=[1.0, 2.0, 2.0, 1.0],
        throughput_sem=[0.1, 0.3, 0.4, 0.1],
        repeat=[0, 0, 1, 0],
    )
    row = one(df, power_sem_col="power_w_sem", throughput_sem_col="throughput_sem")
    assert row.n_caps == 3
    assert row.pfi_ratio == pytest.approx(5 / 3)  # same means as the clean sweep
    pts = per_cap(row)
    assert pts[300]["n_rows"] == 2
    assert pts[300]["power_w_sem"] == pytest.approx(math.sqrt(2.0**2 + 2.0**2) / 2)
    assert pts[300]["throughput_sem"] == pytest.approx(math.sqrt(0.3**2 + 0.4**2) / 2)
    assert "averaged repeats at cap_w 300 (n=2)" in row.notes
    assert "repeat" not in row.index  # varies within the group: not carried


def test_capped_faster_reports_published_value_and_robust_pools():
    row = one(sweep(throughput=[50, 82, 80]))
    assert row.status == "capped_faster"
    # published Eq. 1 unchanged: (0.5 / (1 - 50/80) + 0.25 / (1 - 82/80)) / 2
    assert row.pfi_ratio == pytest.approx((0.5 / 0.375 + 0.25 / -0.025) / 2)
    # isotonic pools 82 and 80 into 81, which becomes T_max; the 300 W point drops out
    assert row.robust_status == "ok" and row.n_binding == 2
    assert row.pfi_robust == pytest.approx(0.5 / (1 - 50 / 81))
    assert "pooled_with_uncapped" in per_cap(row)[300]["flags"]
    assert "capped_faster at cap_w 300" in row.notes


def test_a_capped_point_as_fast_as_uncapped_is_excluded_not_capped_faster():
    """T_i == T_max is Eq. 1's own exclusion; only T_i > T_max is faster."""
    row = one(sweep(caps=[200, 300, 400], power=[800, 1200, 1600], throughput=[50, 80, 80]))
    assert row.status != "capped_faster" and "capped_faster" not in row.notes
    assert "capped_faster" not in per_cap(row)[300]["flags"]
    assert row.pfi_ratio == pytest.approx(0.5 / (1 - 50 / 80))  # the 300 W point has no term
    assert "pfi_ratio: Eq. 1 excludes cap_w 300 (T == T_max)" in row.notes


def test_capped_more_power():
    row = one(sweep(power=[800, 1700, 1600]))
    assert row.status == "capped_more_power"
    assert "capped_more_power" in per_cap(row)[300]["flags"]


def test_nonbinding_cap():
    # 300 W cap, realised 225 W per GPU (well below) and throughput within noise of T_max
    row = one(sweep(power=[800, 900, 1600], throughput=[50, 79.5, 80]))
    assert row.status == "nonbinding_cap"
    assert {"nonbinding_cap", "ill_conditioned"} <= set(per_cap(row)[300]["flags"])
    assert not per_cap(row)[300]["binding"]
    assert "ill_conditioned at cap_w 300" in row.notes  # every applicable status is in notes


def test_nonbinding_detection_uses_per_gpu_power():
    # same numbers read as single-GPU power: 900 W is far above a 300 W cap, so it binds
    row = one(sweep(power=[800, 900, 1600], throughput=[50, 79.5, 80], gpus=1))
    assert "nonbinding_cap" not in per_cap(row)[300]["flags"]
    assert row.status == "ill_conditioned"


def test_flat_curve_caps_never_bind():
    # power and throughput flat (within 2 %) while the caps sit far above the realised power
    row = one(
        sweep(
            caps=[200, 250, 300], power=[89.5, 89.8, 90.0], throughput=[99.6, 99.8, 100.0], gpus=1
        )
    )
    assert row.status == "nonbinding_cap"
    assert np.isfinite(row.pfi_ratio)  # the published value is still reported
    assert math.isnan(row.pfi_robust) and row.robust_status == "too_few_binding"
    assert row.n_binding == 0


def test_flat_throughput_with_binding_power_is_unbounded_not_inf():
    row = one(
        sweep(
            caps=[400, 500, 600, 700],
            power=[390, 480, 590, 650],
            throughput=[100, 100, 100, 100],
            gpus=1,
        )
    )
    assert math.isnan(row.pfi_ratio)  # every term excluded (T == T_max): NaN, never inf
    assert row.status == "no_throughput_loss"  # Eq. 1's exclusion, not faster
    assert row.robust_status == "no_throughput_loss" and math.isnan(row.pfi_robust)
    assert "no term left" in row.notes


def test_non_monotone_interior_point():
    power, thr = [800, 1200, 1600, 2000], [50, 75, 70, 80]
    row = one(sweep(caps=[200, 300, 400, 500], power=power, throughput=thr))
    assert row.status == "non_monotone"
    # published: terms 0.6/0.375, 0.4/0.0625, 0.2/0.125
    assert row.pfi_ratio == pytest.approx((1.6 + 6.4 + 1.6) / 3)
    # robust: 75 and 70 pooled to 72.5
    assert row.pfi_robust == pytest.approx(
        (0.6 / 0.375 + 0.4 / (1 - 72.5 / 80) + 0.2 / (1 - 72.5 / 80)) / 3
    )
    assert per_cap(row)[300]["robust_throughput"] == pytest.approx(72.5)


def test_single_binding_point():
    row = one(sweep(caps=[400, 500], power=[395, 480], throughput=[90, 100], gpus=1))
    assert row.pfi_ratio == pytest.approx((1 - 395 / 480) / (1 - 90 / 100))
    assert row.n_binding == 1 and row.robust_status == "too_few_binding"
    assert row.status == "too_few_binding" and math.isnan(row.pfi_robust)


def test_loss_within_noise_is_not_a_robust_term():
    # 375 W point: cap binds in power but T fell 0.5 % (< rel_tol 2 %): term would be ~10
    row = one(
        sweep(
            caps=[200, 300, 375, 400], power=[800, 1200, 1500, 1600], throughput=[50, 70, 79.6, 80]
        )
    )
    assert row.status == "ill_conditioned"
    assert row.pfi_robust == pytest.approx(5 / 3)
    assert "loss_within_noise" in per_cap(row)[375]["flags"]


def test_missing_uncapped_point():
    row = one(sweep(caps=[200, 300, 400], power=POWER, throughput=THROUGHPUT), uncapped_cap_w=700)
    assert row.status == "missing_uncapped"
    assert row.pfi_ratio == pytest.approx(5 / 3)  # computed relative to the highest cap
    # the uncapped row present but invalid: same status, the row is reported dropped
    df = sweep(
        caps=[200, 300, 400, 700], power=POWER + [float("nan")], throughput=THROUGHPUT + [90]
    )
    row = one(df)
    assert row.status == "missing_uncapped"
    assert "invalid_values: dropped 1 row" in row.notes


def test_only_one_point():
    row = one(sweep(caps=[700], power=[5000], throughput=[100]))
    assert row.status == "too_few_caps" and row.robust_status == "too_few_caps"
    assert row.n_caps == 1
    assert all(
        math.isnan(row[c]) for c in ("pfi_ratio", "pfi_area", "pfi_elasticity", "pfi_robust")
    )


def test_invalid_values_dropped_and_reported():
    df = sweep(caps=[200, 250, 300, 400], power=[800, -5, 1200, 1600], throughput=[50, 60, 70, 80])
    row = one(df)
    assert row.status == "invalid_values" and row.n_caps == 3
    assert row.pfi_ratio == pytest.approx(5 / 3)
    assert "cap_w: 250" in row.notes


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="throughput"):
        pfi_table(sweep().drop(columns="throughput"))
    with pytest.raises(ValueError, match="no group"):
        pfi_table(sweep(group=None))
    with pytest.raises(ValueError, match="both"):
        pfi_table(sweep(power_w_sem=1.0), power_sem_col="power_w_sem")


def test_random_sweeps_never_inf_and_nan_always_explained():
    rng = np.random.default_rng(3)
    parts = []
    for g in range(150):
        n = int(rng.integers(1, 7))
        parts.append(
            sweep(
                caps=list(range(100, 100 * n + 1, 100)),
                group=f"g{g}",
                gpus=1,
                power=rng.uniform(50, 600, n),
                throughput=rng.uniform(0.5, 1.5, n),
                power_w_sem=rng.uniform(0, 5, n),
                throughput_sem=rng.uniform(0, 0.05, n),
            )
        )
    out = pfi_table(
        pd.concat(parts),
        power_sem_col="power_w_sem",
        throughput_sem_col="throughput_sem",
        mc_samples=200,
    )
    numeric = out.select_dtypes("number")
    assert not np.isinf(numeric.to_numpy()).any()
    assert set(out.status) <= set(STATUSES)
    assert (out.loc[out.pfi_ratio.isna(), "status"] != "ok").all()
    assert (out.loc[out.pfi_robust.isna(), "robust_status"] != "ok").all()
    assert (out.loc[out.pfi_robust.isna(), "status"] != "ok").all()
    assert out.loc[out.status != "ok", "notes"].str.len().gt(0).all()


# --- monotone fit ------------------------------------------------------------------------


def test_vectorised_isotonic_matches_scikit_learn():
    rng = np.random.default_rng(0)
    p = rng.uniform(100, 700, (50, 7))
    t = rng.uniform(0, 1, (50, 7))
    w = rng.uniform(0.2, 3, 7)
    batch = isotonic_fit_batch(p, t, w)
    for i in range(50):
        assert batch[i] == pytest.approx(isotonic_fit(p[i], t[i], w))


# --- Monte Carlo CIs ----------------------------------------------------------------------


def sem_sweep(power_sem, throughput_sem, throughput=THROUGHPUT):
    return sweep(throughput=throughput, power_w_sem=power_sem, throughput_sem=throughput_sem)


SEM_COLS = dict(power_sem_col="power_w_sem", throughput_sem_col="throughput_sem")


def test_ci_contains_estimate_and_narrows_with_smaller_sem():
    wide = one(sem_sweep(8.0, 0.4), mc_samples=10_000, **SEM_COLS)
    narrow = one(sem_sweep(2.0, 0.1), mc_samples=10_000, **SEM_COLS)
    for row in (wide, narrow):
        assert row.ci95_low < row.pfi_ratio < row.ci95_high
        assert row.pfi_robust_ci95_low < row.pfi_robust < row.pfi_robust_ci95_high
    assert narrow.ci95_high - narrow.ci95_low < 0.5 * (wide.ci95_high - wide.ci95_low)
    assert narrow.pfi_robust_ci95_high - narrow.pfi_robust_ci95_low < 0.5 * (
        wide.pfi_robust_ci95_high - wide.pfi_robust_ci95_low
    )


def test_ci_deterministic_per_seed_and_independent_of_other_groups():
    df = sem_sweep(8.0, 0.4)
    a = one(df, mc_samples=2000, seed=1, **SEM_COLS)
    b = one(df, mc_samples=2000, seed=1, **SEM_COLS)
    c = one(df, mc_samples=2000, seed=2, **SEM_COLS)
    assert (a.ci95_low, a.ci95_high) == (b.ci95_low, b.ci95_high)
    assert a.ci95_low != c.ci95_low
    both = pfi_table(
        pd.concat([df, sem_sweep(8.0, 0.4).assign(group="h")]), mc_samples=2000, seed=1, **SEM_COLS
    )
    assert both.iloc[0].ci95_low == a.ci95_low


def test_no_sem_no_ci_with_reason():
    row = one(sweep(), mc_samples=1000)
    assert math.isnan(row.ci95_low) and math.isnan(row.pfi_robust_ci95_high)
    assert "no CI: no SEM columns given" in row.notes
    row = one(sem_sweep([1.0, float("nan"), 1.0], 0.1), mc_samples=1000, **SEM_COLS)
    assert math.isnan(row.ci95_low) and "no CI: SEM missing at cap_w 300" in row.notes


def test_monte_carlo_is_fast_for_35_groups():
    rng = np.random.default_rng(0)
    caps = [200, 300, 400, 500, 600, 700]
    parts = []
    for g in range(35):
        k = rng.uniform(1.1, 2.5)
        power = np.array([8 * c * 0.97 for c in caps[:-1]] + [8 * 690.0])
        thr = 1000 * (1 - (1 - power / power[-1]) / k)
        parts.append(
            sweep(
                caps=caps,
                group=f"g{g}",
                gpus=8,
                power=power,
                throughput=thr,
                power_w_sem=2.0,
                throughput_sem=1.0,
            )
        )
    df = pd.concat(parts)
    pfi_table(df.head(6), mc_samples=100, **SEM_COLS)  # warm the imports
    start = time.perf_counter()
    out = pfi_table(df, mc_samples=10_000, **SEM_COLS)
    elapsed = time.perf_counter() - start
    assert out.ci95_low.notna().all() and out.pfi_robust_ci95_low.notna().all()
    assert elapsed < 3.0, f"{elapsed:.2f} s for 35 groups x 10k resamples"  # ~0.4 s on 2 cores


# --- cap-grid sensitivity (Table 9) -------------------------------------------------------


def test_grid_subset_and_sensitivity_by_hand():
    caps = [200, 300, 400, 500, 600, 700]
    power = [1600, 2400, 3200, 4000, 4800, 5600]
    thr = [40, 70, 80, 90, 96, 100]
    df = sweep(caps=caps, power=power, throughput=thr, gpus=8)
    sub = grid_subset(df, [200, 500, 600, 700])
    assert sorted(sub.cap_w) == [200, 500, 600, 700]
    x = [p / 5600 for p in power]
    y = [t / 100 for t in thr]
    full = sum((1 - a) / (1 - b) for a, b in zip(x[:-1], y[:-1])) / 5
    subset = sum((1 - x[i]) / (1 - y[i]) for i in (0, 3, 4)) / 3
    sens = grid_sensitivity(df, [200, 500, 600, 700])
    assert sens.loc[0, "pfi_full"] == pytest.approx(full)
    assert sens.loc[0, "pfi_subset"] == pytest.approx(subset)
    assert sens.loc[0, "delta_pct"] == pytest.approx(100 * (subset - full) / full)


def test_grid_sensitivity_without_a_finer_swept_group_is_empty():
    four_caps = pd.DataFrame(
        {
            "group": ["g"] * 4,
            "cap_w": [200.0, 500.0, 600.0, 700.0],
            "power_w": [2.0, 3.0, 3.5, 4.0],
            "throughput": [2.5, 3.4, 3.8, 4.0],
        }
    )
    sens = grid_sensitivity(four_caps, [200, 500, 600, 700])
    assert sens.empty and list(sens.columns) == [
        "group",
        "pfi_full",
        "pfi_subset",
        "delta",
        "delta_pct",
    ]


# ---- the point estimate's isotonic fit, and progress on long tables ---------------------------


@pytest.mark.parametrize("case", ["monotone", "dip", "weighted dip", "tie in power"])
def test_isotonic_fit_equals_scikit_learns_estimator(case):
    from sklearn.isotonic import IsotonicRegression

    from wattflex.pfi import isotonic_fit

    p = (
        np.array([900.0, 300, 500, 700])
        if case != "tie in power"
        else np.array([900.0, 300, 500, 500])
    )
    t = np.array([100.0, 60, 80, 95]) if case == "monotone" else np.array([100.0, 60, 90, 85])
    w = np.array([1.0, 4.0, 1.0, 9.0]) if case == "weighted dip" else None
    expected = IsotonicRegression(increasing=True).fit_transform(p, t, sample_weight=w)
    assert np.allclose(isotonic_fit(p, t, w), expected, rtol=1e-13, atol=0)


def test_long_tables_report_progress(monkeypatch):
    import wattflex.pfi as pfi

    monkeypatch.setattr(pfi, "PROGRESS_EVERY_S", 0.0)
    # groups are analysed by number of caps: a line after each size
    df = pd.concat(
        [sweep().assign(group=f"g{i}") for i in range(3)]
        + [sweep().iloc[1:].assign(group="short")],
        ignore_index=True,
    )
    lines = []
    out = pfi.pfi_table(df, mc_samples=0, progress=lines.append)
    assert len(out) == 4 and [line.split("] ", 1)[1] for line in lines] == [
        "PFI of 1 of 4 groups",
        "PFI of 4 of 4 groups",
    ]


def test_monte_carlo_across_groups_equals_each_group_alone(monkeypatch):
    """The CIs run on groups stacked by size, in batches; a group's row (CIs and
    their notes included) is the one it gets alone, across batch boundaries and sizes."""
    import wattflex.pfi as pfi

    monkeypatch.setattr(pfi, "_MC_ROWS_PER_BATCH", 1000)  # 2 groups a batch at 500 resamples
    rng = np.random.default_rng(5)
    parts = []
    for g in range(7):
        caps = CAPS if g % 2 else [200, 300, 400, 500, 600, 700]
        thr = 100 * (1 - rng.uniform(0.2, 0.9) * (1 - np.asarray(caps) / 700) ** 1.5)
        thr[1] *= 1.04 if g % 3 == 0 else 1.0  # a dip: the isotonic refit pools points
        parts.append(
            sweep(
                caps=caps,
                power=8 * np.asarray(caps) * 0.95,
                throughput=thr,
                gpus=8,
                group=f"g{g}",
                power_w_sem=20.0,
                throughput_sem=rng.uniform(0.2, 3.0),
            )
        )
    table = pfi.pfi_table(pd.concat(parts, ignore_index=True), mc_samples=500, **SEM_COLS)
    assert table.pfi_robust_ci95_low.notna().sum() >= 5
    for part, (_, row) in zip(parts, table.iterrows()):
        alone = pfi.pfi_table(part, mc_samples=500, **SEM_COLS).iloc[0]
        assert row.equals(alone), row.group
