"""The figures (wattflex.plots): each module draws from tiny tables and every figure says
where its data came from (EMULATED for emulated runs); matplotlib stays inside plots/."""

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from wattflex.analysis.stats import telemetry_correlations
from wattflex.plots import analysis, ingest, sweeps
from wattflex.telemetry import SummaryProtocol

LIB = Path(__file__).resolve().parents[3] / "workflow_scripts" / "wattflex"


def texts(fig) -> str:
    return " ".join(t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text")))


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def tiny_runs(backend: str) -> pd.DataFrame:
    rows = []
    for g, (cluster, gpu) in enumerate([("dense", "H200"), ("moe-pt", "H200"), ("moe-ft", "H100")]):
        for cap in (300, 500, 700):
            rows.append(
                {
                    "group": f"g{g}",
                    "cap_w": cap,
                    "power_w": 8 * cap * 0.9,
                    "tokens_per_s": 1e4 * (cap / 700) ** 0.5,
                    "cluster": cluster,
                    "gpu_model": gpu,
                    "sm_clock_mhz": 1980 * cap / 700,
                    "mem_clock_mhz": 3200.0,
                    "gpus": 8,
                    "set": "headline",
                    "backend": backend,
                }
            )
    return pd.DataFrame(rows)


def test_sweep_figures_render_and_say_emulated(tmp_path):
    t = np.arange(0.0, 120.0, 1.0)
    busy = t >= 10
    telemetry = pd.concat(
        [
            pd.DataFrame(
                {
                    "t_s": t,
                    "node": "node0",
                    "gpu": gpu,
                    "power_w": np.where(busy, 650.0, 90.0),
                    "gpu_util": np.where(busy, 97.0, 0.0),
                    "fb_used_gib": np.where(t >= 5, 60.0, 0.5),
                }
            )
            for gpu in (0, 1)
        ],
        ignore_index=True,
    )
    steps = pd.DataFrame(
        {
            "step": np.arange(1, 101),
            "t_end_s": np.linspace(12, 119, 100),
            "tokens": 4096,
            "loss": np.nan,
        }
    )
    runs = tiny_runs("emulated")
    pfi = pd.DataFrame(
        {
            "cluster": ["dense", "moe-pt", "moe-ft"],
            "pfi_ratio": [1.2, 1.5, 2.0],
            "ci95_low": [1.1, 1.3, 1.8],
            "ci95_high": [1.3, 1.7, 2.2],
        }
    )
    table = pd.DataFrame(
        {"cluster": ["dense", "moe-pt"], "pfi_published": [1.2, 1.5], "pfi": [1.25, 1.4]}
    )
    figures = [
        sweeps.timeseries_figure(
            telemetry, steps, "g0 at 700 W", "emulated", protocol=SummaryProtocol()
        ),
        sweeps.curves_figure(runs, normalized=True),
        sweeps.curves_figure(runs, normalized=False),
        sweeps.pfi_by_cluster_figure(pfi, ["emulated"]),
        sweeps.clocks_figure(runs),
        sweeps.comparison_figure(
            table, "pfi_published", "pfi", "t", ["emulated"], "published", "ours", "n: 2"
        ),
    ]
    for fig in figures:
        assert "EMULATED" in texts(fig)
    figures[0].savefig(tmp_path / "timeseries.png")
    assert (tmp_path / "timeseries.png").stat().st_size > 1000
    assert "EMULATED" not in texts(sweeps.curves_figure(tiny_runs("nvml"), normalized=True))


def test_analysis_figures_render_and_say_emulated(tmp_path):
    rng = np.random.default_rng(0)
    groups = pd.DataFrame(
        {
            "cluster": ["dense", "moe-pt", "moe-ft"] * 4,
            "dram_active": rng.uniform(0, 1, 12),
            "temp_c": rng.uniform(60, 80, 12),
        }
    )
    groups["pfi"] = 1 + groups["dram_active"]
    fig = analysis.telemetry_grid(
        groups, telemetry_correlations(groups, ["dram_active", "temp_c"]), ["emulated"]
    )
    assert "EMULATED" in texts(fig) and "dram_active" in texts(fig)
    fig.savefig(tmp_path / "grid.png")
    preds = pd.DataFrame(
        {
            "set": ["headline"] * 3 + ["h100"],
            "cluster": ["dense", "moe-pt", "moe-ft", "dense"],
            "pfi": [1.2, 1.5, 2.0, 1.3],
            "pfi_pred": [1.3, 1.4, 1.9, 1.25],
            "pfi_pred_loo": [1.35, 1.4, 1.8, np.nan],
        }
    )
    holdout = pd.DataFrame(
        {
            "set": ["headline", "h100"],
            "n": [3, 1],
            "prediction": ["loo", "model"],
            "r2": [0.8, np.nan],
            "spearman": [1.0, np.nan],
        }
    )
    fig = analysis.predicted_vs_measured(preds, holdout, ["dram_copy_product"], ["emulated"])
    assert "EMULATED" in texts(fig)
    table = pd.DataFrame(
        {
            "pfi_6caps": [1.2, 1.5],
            "pfi_4caps": [1.3, 1.7],
            "pfi_6caps_published": [1.1, np.nan],
            "pfi_4caps_published": [1.2, np.nan],
        }
    )
    fig = analysis.beside_published_scatter(
        table, "pfi_6caps", "pfi_4caps", "t", "x", "y", "rho: 1", ["cuda"]
    )
    assert "EMULATED" not in texts(fig) and "measured" in texts(fig)
    fig.savefig(tmp_path / "t9.png")
    assert (tmp_path / "t9.png").stat().st_size > 1000
    summary = pd.DataFrame(
        {
            "table": ["grid_sensitivity", "grid_sensitivity", "other"],
            "metric": ["rho", "n", "x"],
            "value": [0.91, 2, 1.0],
            "published": [0.95, np.nan, np.nan],
        }
    )
    assert analysis.summary_text(summary, "grid_sensitivity") == "rho: 0.91 (published 0.95)\nn: 2"


def test_ingest_figure_says_measured():
    pfi = pd.DataFrame(
        {
            "status": ["ok", "capped_faster", "nonbinding_cap", "too_few_caps"],
            "pfi_ratio": [1.3, -4.0, 25.0, np.nan],
            "pfi_robust": [1.25, 1.8, np.nan, np.nan],
        }
    )
    fig = ingest.robust_vs_ratio_figure(pfi, "campaign: robust vs ratio PFI")
    assert "measured (ingest)" in texts(fig) and "EMULATED" not in texts(fig)
    assert "robust PFI undefined (1)" in texts(fig)
