"""wattflex.plots.style.figure_problems: no annotation box over plotted data, every series in a
legend; and the figures issue 49 found wanting pass it (curves, Table 8, Fig. 8, power vs
budget), each written as PNG and SVG with the check's result in its document."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from wattflex.plots.allocation import fig8_figure, out_of_sample_figure
from wattflex.plots.analysis import beside_published_scatter
from wattflex.plots.control import power_figure
from wattflex.plots.style import figure_problems, save_figure
from wattflex.plots.sweeps import curves_figure
from wattflex.provenance import artifact_meta, provenance


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def test_a_box_over_a_data_point_and_an_unnamed_series_are_found():
    fig, ax = plt.subplots()
    ax.scatter([0.05, 0.5], [0.95, 0.5], label="groups")
    ax.plot([0, 0.5, 1], [0, 0.3, 1], color="C3")  # a series no legend entry names
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.text(0.02, 0.98, "n = 2\nrho = 1", transform=ax.transAxes, va="top", bbox={"fc": "w"})
    ax.legend()
    problems = figure_problems(fig)
    assert any("the box 'n = 2' covers 1 data points" in p for p in problems)
    assert any("1 of 2 series in no legend" in p for p in problems)


def test_a_clean_figure_passes_a_lone_series_and_reference_lines_need_no_legend():
    fig, (a, b) = plt.subplots(1, 2)
    a.plot([0, 1, 2], [0, 1, 4])  # one series: its axis labels name it
    a.plot([0, 2], [0, 4], ls=":")  # a 2-point reference line
    b.plot([0, 1, 2], [1, 2, 3], label="x")
    b.fill_between([0, 1, 2], [0, 1, 2], [2, 3, 4], label="x: 5-95 %")
    fig.legend()
    fig.text(0.7, 0.9, "beside the data", bbox={"fc": "w"})
    assert figure_problems(fig) == []


def _runs() -> pd.DataFrame:
    rows = []
    for g, (cluster, model, gpu) in enumerate(
        [
            ("dense", "Llama-3.1-70B", "H200"),
            ("dense", "Qwen3-32B", "H200"),
            ("dense", "Qwen3-32B", "H100"),
            ("moe-ft", "gpt-oss-20b", "H200"),
            ("moe-ft", "Qwen3-30B-A3B", "H200"),
        ]
    ):
        for cap in (300, 500, 700):
            rows.append(
                {
                    "group": f"g{g}",
                    "cap_w": cap,
                    "power_w": 8 * cap * (0.9 - 0.02 * g),
                    "tokens_per_s": 1e4 * (cap / 700) ** (0.4 + 0.1 * g),
                    "cluster": cluster,
                    "model": model,
                    "gpu_model": gpu,
                    "sm_clock_mhz": 1980 * cap / 700,
                    "mem_clock_mhz": 3200.0,
                    "gpus": 8,
                    "set": "headline",
                    "backend": "emulated",
                }
            )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("normalized", [True, False])
def test_curves_name_every_group_by_its_model_in_one_legend(normalized):
    fig = curves_figure(_runs(), normalized)
    assert figure_problems(fig) == []
    names = {t.get_text() for leg in fig.legends for t in leg.get_texts()}
    assert {"Llama-3.1-70B", "Qwen3-32B", "gpt-oss-20b", "H100 (dashed)"} <= names


def test_the_statistics_box_of_a_beside_published_scatter_covers_no_point():
    """Table 8's box sat in the upper left, over the highest H100 PFI of a low H200 PFI."""
    table = pd.DataFrame(
        {
            "pfi_h200": [1.1, 1.4, 1.7],
            "pfi_h100": [2.2, 1.5, 1.8],
            "pfi_h200_published": [1.2, 1.45, 1.6],
            "pfi_h100_published": [1.3, 1.5, 1.9],
        }
    )
    text = "\n".join(f"metric_{i}: 0.{i}" for i in range(6))
    fig = beside_published_scatter(
        table, "pfi_h200", "pfi_h100", "H100 vs H200", "H200", "H100", text, ["emulated"]
    )
    assert figure_problems(fig) == []


def _allocation_summary() -> tuple[pd.DataFrame, pd.DataFrame]:
    rows = []
    for mix in ("random", "production"):
        for policy, gap in (
            ("equal-weight", 0.0),
            ("pfi-aware", 0.7),
            ("raw-dcgm", -4.0),
            ("oracle", 1.0),
        ):
            for cut in (0.0, 0.1, 0.2, 0.3):
                mean = 50 - 30 * cut * (1 - 0.3 * gap if gap > -1 else 2)
                rows.append(
                    {
                        "mix": mix,
                        "policy": policy,
                        "cut": cut,
                        "per_job_tokens_per_s_mean": 1e3 * mean,
                        "per_job_tokens_per_s_p5": 1e3 * (mean - 5),
                        "per_job_tokens_per_s_p95": 1e3 * (mean + 5),
                        "gap_closed": gap,
                    }
                )
    headline = pd.DataFrame(
        {
            "mix": ["production"],
            "cut": [0.3],
            "policy": ["pfi-aware"],
            "tokens_per_s_per_job_recovered": [4421.0],
            "gap_closed": [0.7],
            "published_tokens_per_s_per_job_recovered": [1500.0],
            "published_gap_closed": [0.63],
        }
    )
    return pd.DataFrame(rows), headline


def test_fig8_names_its_bands_and_says_which_policy_is_off_scale():
    summary, headline = _allocation_summary()
    fig = fig8_figure(summary, headline, ["emulated"])
    assert figure_problems(fig) == []
    names = {t.get_text() for leg in fig.legends for t in leg.get_texts()}
    assert "oracle: 5-95 % over workloads" in names and "raw DCGM" in names
    floor = [t.get_text() for ax in fig.axes for t in ax.texts if "off scale" in t.get_text()]
    assert len(floor) == 2 and "raw DCGM below -150 % (down to -400 %)" in floor[0]


def test_out_of_sample_bands_are_named():
    oos = pd.DataFrame(
        [
            {
                "mix": "random",
                "cut": cut,
                "policy": policy,
                "variant": variant,
                "gap_closed_mean": 0.6,
                "gap_closed_p5": 0.5,
                "gap_closed_p95": 0.7,
            }
            for cut in (0.1, 0.2, 0.3)
            for policy in ("pfi-aware", "curve-aware")
            for variant in ("in-sample", "out-of-sample")
        ]
    )
    assert figure_problems(out_of_sample_figure(oos, ["emulated"])) == []


def test_power_vs_budget_gives_each_policy_its_own_panel(tmp_path):
    t = np.arange(0.0, 3600.0, 10.0)
    budget = np.where(t > 600, 120e3, np.nan)
    ts = pd.DataFrame({"t_s": t, "budget_w": budget, "required_w": budget})
    for i, name in enumerate(("equal-weight", "pfi-aware", "oracle", "uncapped")):
        ts[f"power_w:{name}"] = np.where(t > 600, 118e3 - 500 * i, 160e3)
    fig = power_figure(ts, "step", "emulated")
    assert figure_problems(fig) == []
    assert {"equal-weight", "pfi-aware", "oracle", "uncapped"} <= {
        ax.get_title() for ax in fig.axes
    }
    # saved as PNG and SVG, the check's (empty) result in the document
    save_figure(fig, tmp_path / "power.png", provenance(params={}, backend="emulated"))
    for suffix in (".png", ".svg"):
        assert artifact_meta(tmp_path / f"power{suffix}")["figure_check"] == []


def test_pfi_by_cluster_names_its_clusters_in_a_legend():
    from wattflex.plots.sweeps import pfi_by_cluster_figure

    pfi = pd.DataFrame(
        {
            "cluster": ["dense", "dense", "moe-pt", "moe-ft"],
            "pfi_ratio": [1.2, 1.3, 1.6, 2.1],
            "ci95_low": [1.1, 1.2, 1.5, 1.9],
            "ci95_high": [1.3, 1.4, 1.7, 2.3],
        }
    )
    fig = pfi_by_cluster_figure(pfi, ["emulated"])
    assert figure_problems(fig) == []
    assert {"dense", "moe-pt", "moe-ft"} <= {
        t.get_text() for t in fig.axes[0].get_legend().get_texts()
    }


def test_the_clocks_figure_names_its_series_for_both_panels():
    from wattflex.plots.sweeps import clocks_figure

    fig = clocks_figure(_runs())
    assert figure_problems(fig) == [] and len(fig.legends) == 1
