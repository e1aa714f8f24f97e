"""wattflex.analysis.paper_tables (Tables 4-5, 8, 9, repeatability, side by side with the published
tables), on constructed sweeps with hand-computed answers (the analysis figures: tests/unit/plots)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from wattflex.analysis import paper_tables as pt


def ratio_sweep(group: str, terms: dict[int, float], t_max: float = 100.0, **meta) -> pd.DataFrame:
    """Runs whose ratio terms (1 - P/Pmax)/(1 - T/Tmax) are ``terms`` per cap (P = cap, 1 GPU)."""
    rows = [{"cap_w": 700.0, "power_w": 700.0, "tokens_per_s": t_max}]
    for cap, r in terms.items():
        rows.append(
            {
                "cap_w": float(cap),
                "power_w": float(cap),
                "tokens_per_s": t_max * (1 - (1 - cap / 700) / r),
            }
        )
    return pd.DataFrame(rows).assign(group=group, gpus=1, repeat=0, **meta)


def test_beside_published_places_columns_and_survives_no_table():
    ours = pd.DataFrame({"group": ["a", "b"], "x": [1.0, 2.0], "y": [3.0, 4.0]})
    pub = pd.DataFrame({"group": ["b", "c"], "x": [2.5, 9.0], "y": [0.0, 0.0]})
    out = pt.beside_published(ours, pub, "group", ["x"])
    assert list(out.columns) == ["group", "x", "x_published", "y"]
    assert out["x_published"].tolist()[1] == 2.5 and np.isnan(out["x_published"].iloc[0])
    assert list(pt.beside_published(ours, None, "group", ["x", "y"]).columns) == [
        "group",
        "x",
        "x_published",
        "y",
        "y_published",
    ]


def test_grid_sensitivity_by_hand():
    pytest.importorskip("wattflex.pfi")
    six = ratio_sweep("six", {200: 1.5, 300: 1.4, 400: 1.3, 500: 1.6, 600: 2.0})
    four = ratio_sweep("four", {200: 1.2, 500: 1.3, 600: 1.4})  # already on the 4-cap grid
    other = ratio_sweep("val", {200: 1.5, 300: 1.4, 400: 1.3, 500: 1.6, 600: 2.0})
    runs = pd.concat([six, four, other], ignore_index=True)
    pfi = pd.DataFrame(
        {
            "group": ["six", "four", "val"],
            "set": ["headline", "headline", "validation"],
            "cluster": ["dense", "moe-ft", "dense"],
        }
    )
    table = pt.grid_sensitivity(runs, pfi)
    assert table["group"].tolist() == ["six"]  # 4-cap groups and other sets are not in Table 9
    row = table.iloc[0]
    assert row["pfi_6caps"] == pytest.approx((1.5 + 1.4 + 1.3 + 1.6 + 2.0) / 5)
    assert row["pfi_4caps"] == pytest.approx((1.5 + 1.6 + 2.0) / 3)
    assert row["delta_pct"] == pytest.approx(100 * (1.7 / 1.56 - 1))
    assert row["cluster"] == "dense"
    assert len(pt.grid_sensitivity(runs, pfi, sets=None)) == 2


def test_grid_summary():
    t9 = pd.DataFrame(
        {
            "pfi_6caps": [1.0, 2.0, 3.0, 4.0],
            "pfi_4caps": [1.1, 2.4, 3.3, 4.4],
            "delta_pct": [10.0, 20.0, 10.0, 10.0],
        }
    )
    s = pt.grid_summary(t9)
    assert (
        s["median_delta_pct"] == 10.0
        and s["max_delta_pct"] == 20.0
        and s["spearman_rho"] == pytest.approx(1.0)
    )


def test_h100_vs_h200_pairs_and_published_join(tmp_path):
    runs = pd.DataFrame(
        {
            "group": ["a", "b", "h-a", "h-b"],
            "model": ["M1", "M2", "M1", "M2"],
            "architecture": ["dense", "moe", "dense", "moe"],
            "task": ["lora", "pt", "lora", "pt"],
            "ep": [1, 8, 1, 8],
            "gpus": 8,
            "gpu_model": ["H200", "H200", "H100", "H100"],
            "matches": ["", "", "a", "b"],
        }
    )
    pfi = pd.DataFrame(
        {
            "group": ["a", "b", "h-a", "h-b"],
            "n_caps": [6, 6, 4, 6],
            "pfi_ratio": [1.2, 1.6, 1.25, 1.5],
        }
    )
    table = pt.h100_vs_h200(pfi, runs)
    assert table[["group_h100", "pfi_h200", "pfi_h100"]].values.tolist() == [
        ["h-a", 1.2, 1.25],
        ["h-b", 1.6, 1.5],
    ]
    assert table["task"].tolist() == ["ft", "pt"]
    pd.DataFrame(
        {
            "architecture": ["dense"],
            "task": ["ft"],
            "model": ["M1"],
            "ep": [1],
            "gpus": [8],
            "n_caps_h100": [4],
            "pfi_h200": [1.22],
            "pfi_h100": [1.19],
        }
    ).to_csv(tmp_path / "table8_h100_vs_h200.csv", index=False)
    both = pt.table8_beside_published(table, str(tmp_path))
    assert both["pfi_h100_published"].iloc[0] == 1.19 and np.isnan(
        both["pfi_h100_published"].iloc[1]
    )
    assert pt.h100_summary(table)["n_pairs"] == 2


def test_repeatability_cv():
    runs = pd.DataFrame(
        {
            "group": ["g"] * 4,
            "cap_w": [700, 700, 700, 400],
            "power_w": [100.0, 102.0, 104.0, 50.0],
            "tokens_per_s": [10.0, 10.0, 10.0, 5.0],
        }
    )
    table = pt.repeatability(runs)
    assert len(table) == 1 and table["n"].iloc[0] == 3
    assert table["cv_power_pct"].iloc[0] == pytest.approx(100 * 2.0 / 102.0)
    assert table["cv_tokens_pct"].iloc[0] == 0.0
    assert pt.repeatability_summary(table)["n_runs"] == 3


def test_compute_accounting_by_hand(tmp_path):
    runs = pd.DataFrame(
        {
            "group": ["a", "a", "a", "b", "h"],
            "gpus": [8, 8, 8, 16, 8],
            "repeat": [0, 0, 1, 0, 0],
            "gpu_model": ["H200", "H200", "H200", "H200", "H100"],
            "set": ["headline"] * 4 + ["h100"],
        }
    )
    table4, table5 = pt.compute_accounting(runs, duration_s=1800, overhead_s=300)
    hours = 2100 / 3600  # 35 min per run
    t4 = table4.set_index("gpus_per_cluster")
    assert t4.loc["8", "runs"] == 2 and t4.loc["8", "gpu_hours"] == pytest.approx(2 * 8 * hours)
    assert t4.loc["total", "gpu_hours"] == pytest.approx((16 + 16) * hours)
    assert t4.loc["total", "mean_wallclock_min"] == pytest.approx(35.0)
    assert table5["runs"].iloc[-1] == 5 and table5["gpu_hours"].iloc[-1] == pytest.approx(
        48 * hours
    )
    # A traced span (phase columns) replaces the configured duration.
    phased = runs.assign(warmup_s=100.0, startup_s=50.0, training_s=1500.0, dip_s=50.0)
    assert pt.run_wallclock_s(phased, 9999, 300).tolist() == [2000.0] * 5
    pd.DataFrame(
        {
            "gpus_per_cluster": ["8", "16", "total"],
            "runs": [120, 19, 139],
            "mean_wallclock_min": [34.9, 36.8, 35],
            "gpu_hours": [558, 186, 744],
        }
    ).to_csv(tmp_path / "table4_compute.csv", index=False)
    both = pt.table4_beside_published(table4, str(tmp_path)).set_index("gpus_per_cluster")
    assert (
        both.loc["16", "runs_published"] == 19 and both.loc["total", "gpu_hours_published"] == 744
    )


def test_summary_rows_carry_the_papers_scalars():
    rows = pd.DataFrame(
        pt.summary_rows("repeatability", {"median_cv_power_pct": 0.2, "other": 1.0})
    )
    assert rows["published"].iloc[0] == 0.4 and np.isnan(rows["published"].iloc[1])
