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
from wattflex.plots.fidelity import test_set_panel as draw_test_sets  # not a test
from wattflex.plots.grid import mv_figure, offer_figure
from wattflex.plots.style import figure_problems, label_backend, save_figure
from wattflex.plots.sweeps import curves_figure, pfi_by_cluster_figure
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
    fig.text(0.02, 0.02, "beside the data", bbox={"fc": "w"})
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


def test_a_label_with_a_line_through_it_is_found():
    """A label struck by a grid line or by a neighbour's line reads badly; on an opaque box,
    or beside the lines, it does not."""
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [0, 1, 2], label="data")
    ax.hlines(1.5, 0.7, 2.0, color="k")  # a neighbour's median bar
    ax.set_xlim(0, 2)
    ax.set_ylim(0, 2)
    ax.grid(axis="y")
    fig.draw_without_rendering()
    ax.text(0.6, 1.5, "median 1.70", va="center")  # across the grid line at 1.5 and the bar
    ax.text(0.1, 1.625, "quiet", va="center")  # between grid lines, off the data
    ax.text(0.1, 1.0, "on white", va="center", bbox={"fc": "w", "ec": "none"})
    ax.legend(loc="lower right")
    problems = figure_problems(fig)
    assert [p for p in problems if "label" in p] == [
        "axes 0: the label 'median 1.70' is struck by a grid line and a line"
    ]


def test_box_plots_error_bar_caps_and_a_twin_legend_are_not_unnamed_series():
    fig, (a, b) = plt.subplots(1, 2)
    a.boxplot([[1, 2, 3, 9], [2, 3, 4, -5], [1, 1, 2, 2]])  # boxes, whiskers, fliers
    a.bar([1, 2, 3], [2, 3, 1])
    a.errorbar([1, 2, 3], [2, 3, 1], yerr=0.5, fmt="none", capsize=3)  # caps: 3-point lines
    b.plot([0, 1, 2], [0, 1, 4], label="left axis")
    b.fill_between([0, 1, 2], [0, 0, 3], [1, 2, 5], alpha=0.2, label="left: band")
    twin = b.twinx()
    twin.plot([0, 1, 2], [3, 2, 1], color="C3", label="right axis")
    twin.fill_between([0, 1, 2], [2, 1, 0], [4, 3, 2], color="C3", alpha=0.2, label="right band")
    handles = [h for x in (b, twin) for h in x.get_legend_handles_labels()[0]]
    b.legend(handles, [h.get_label() for h in handles])  # one legend for both axes
    assert figure_problems(fig) == []
    twin.fill_between([0, 1, 2], [0, 0, 0], [1, 1, 1], color="C4", alpha=0.2)  # unnamed
    assert figure_problems(fig) == ["axes 2: 1 of 3 series in no legend"]


def test_pfi_by_cluster_writes_no_median_into_a_line():
    """The default campaign's headline PFIs (medians 1.55 / 1.70 / 1.74): the '1.70' label
    ran into moe-ft's median bar and the grid line at 1.75."""
    pfi = pd.DataFrame(
        {
            "cluster": ["dense"] * 14 + ["moe-pt"] * 7 + ["moe-ft"] * 4,
            "pfi_ratio": [1.85, 1.48, 1.46, 1.68, 1.71, 1.46, 1.69, 1.63, 1.54, 1.51, 1.59]
            + [1.57, 1.45, 1.44, 1.43, 1.77, 1.63, 1.70, 1.71, 1.58, 1.97, 1.83, 2.18, 1.66]
            + [1.55],
        }
    )
    pfi["ci95_low"], pfi["ci95_high"] = pfi["pfi_ratio"] - 0.05, pfi["pfi_ratio"] + 0.05
    fig = pfi_by_cluster_figure(pfi, ["emulated"])
    assert figure_problems(fig) == []
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks[1] == "moe-pt\nmedian 1.70 (black bar)\n7 groups"


def test_the_offer_names_its_35_jobs_by_cluster_and_its_loss_levels():
    rng = np.random.default_rng(1)
    losses = np.linspace(0, 0.6, 13)
    shed = np.cumsum(rng.uniform(0, 500, (35, 13)), axis=1)
    jobs = [f"g{j}" for j in range(35)]
    clusters = ["dense"] * 19 + ["moe-pt"] * 10 + ["moe-ft"] * 6
    fig = offer_figure(jobs, losses, shed, (0.1, 0.25, 0.5), "emulated", 4.0, clusters)
    assert figure_problems(fig) == []
    names = {t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().texts}
    assert {"dense (19 jobs)", "moe-pt (10 jobs)", "moe-ft (6 jobs)"} <= names
    assert "the offer's loss levels (10, 25, 50 %)" in names
    assert figure_problems(offer_figure(jobs, losses, shed, (0.1,), "emulated", 4.0)) == []


def test_the_mv_figure_names_every_controller_for_both_panels():
    t = np.arange(0.0, 1200.0, 5.0)
    budget = np.where((t >= 600) & (t < 1100), 120e3, np.nan)
    loads = {
        name: np.where(np.isfinite(budget), 118e3 - 1e3 * i, 160e3) + 50 * np.sin(t)
        for i, name in enumerate(("equal-weight", "pfi-aware", "oracle"))
    }
    rec = {"event_id": "e1", "start_s": 600.0, "end_s": 1100.0, "deadline_s": 30.0}
    rec["baseline_pre_event_w"] = 160e3
    fig = mv_figure(t, loads, budget, rec, np.full_like(t, 165e3), "emulated", "step")
    assert figure_problems(fig) == []
    assert set(loads) <= {t.get_text() for t in fig.legends[0].get_texts()}


def test_the_test_set_bars_labels_are_not_struck_by_the_grid():
    """fidelity_vs_published's bar labels ran across the grid lines at 0.4 and 0.5."""
    sets = pd.DataFrame(
        {
            "test_set": ["Table 6 out of sample", "leave one table out: anchor on table7"]
            + ["Perseus A100 power-limit sweeps"],
            "pfi_mae": [0.315, 0.301, 0.035],
            "spearman": [0.51, 0.49, np.nan],
            "n": [25, 25, 2],
            "note": ["", "", ""],
            "clock_share_error_pp": [np.nan] * 3,
            "power_exponent_error": [np.nan] * 3,
        }
    )
    fig, ax = plt.subplots(figsize=(8, 3))
    draw_test_sets(ax, sets)
    assert figure_problems(fig) == []


def test_a_legend_off_the_page_or_over_the_backend_label_is_found():
    """allocation_out_of_sample.png's 8-entry legend, 4 to a row, ran past both edges of a
    10.4-inch figure and over the EMULATED label."""
    fig, ax = plt.subplots(figsize=(4, 3))
    for i in range(8):
        ax.plot([0, 1, 2], [i, i + 1, i], label=f"a rather long policy name, variant {i}")
    fig.legend(loc="lower center", ncol=4, fontsize=7)
    label_backend(fig, ["emulated"])
    problems = figure_problems(fig)
    assert "a legend runs off the figure (8 entries)" in problems
    assert any("is under a legend" in p and "EMULATED" in p for p in problems)


def test_the_out_of_sample_legend_stays_on_the_page():
    oos = pd.DataFrame(
        [
            {
                "mix": mix,
                "cut": cut,
                "policy": policy,
                "variant": variant,
                "gap_closed_mean": 0.6,
                "gap_closed_p5": 0.5,
                "gap_closed_p95": 0.7,
            }
            for mix in ("random", "production")
            for cut in (0.1, 0.2, 0.3)
            for policy in ("pfi-aware", "curve-aware")
            for variant in ("in-sample", "out-of-sample")
        ]
    )
    assert figure_problems(out_of_sample_figure(oos, ["emulated"])) == []


def test_fig8s_off_scale_note_is_not_struck_by_the_falling_line():
    """On the tiny campaign raw DCGM fell through the floor across the 'off scale' note."""
    summary, headline = _allocation_summary()
    raw = summary["policy"] == "raw-dcgm"
    summary.loc[raw, "gap_closed"] = summary.loc[raw, "cut"].map(
        {0.0: 0.0, 0.1: -0.5, 0.2: -4.0, 0.3: -4.0}
    )
    fig = fig8_figure(summary, headline, ["emulated"])
    assert figure_problems(fig) == []
    assert any("off scale" in t.get_text() for ax in fig.axes for t in ax.texts)
