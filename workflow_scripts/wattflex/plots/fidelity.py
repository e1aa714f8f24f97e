"""The fidelity figure: emulated PFI per group against the published value, with y = x
(tables/fidelity.csv of ``wattflex.analysis.fidelity``)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullLocator

from wattflex.plots.analysis import SET_MARKERS
from wattflex.plots.style import CLUSTER_COLORS, label_backend, tight_layout


def emulated_vs_published(
    groups: pd.DataFrame, stats_text: str, backend, test_sets: pd.DataFrame | None = None
) -> plt.Figure:
    """Per group with a published value: the noise-free model (open), this campaign (filled)
    and the noise-seed 5-95 % band (bar), coloured by cluster, marker by set; the groups the
    emulator's anchor was fitted on (``calibration`` in-sample) ringed in black; y = x dotted.
    ``test_sets`` (fidelity_test_sets.csv): below, each scored test set's out-of-sample PFI error
    side by side (:func:`test_set_panel`)."""
    have = groups[np.isfinite(groups["pfi_published"].astype(float))]
    if test_sets is None:
        fig, ax = plt.subplots(figsize=(9.6, 5.4))
    else:
        fig, (ax, low) = plt.subplots(
            2, 1, figsize=(11.0, 9.6), gridspec_kw={"height_ratios": [5.4, 3.0]}
        )
        test_set_panel(low, test_sets)
    for row in have.itertuples():
        color = CLUSTER_COLORS.get(row.cluster, "0.4")
        marker = SET_MARKERS.get(row.set, "o")
        ax.plot(
            [row.pfi_published] * 2,
            [row.pfi_seed_p05, row.pfi_seed_p95],
            color=color,
            lw=1.2,
            alpha=0.5,
        )
        ax.scatter(row.pfi_published, row.pfi_campaign, color=color, marker=marker, s=32, zorder=3)
        ax.scatter(
            row.pfi_published,
            row.pfi_noise_free,
            facecolor="none",
            edgecolor=color,
            marker=marker,
            s=32,
            zorder=3,
        )
        if getattr(row, "calibration", "") == "in-sample":
            ax.scatter(
                row.pfi_published,
                row.pfi_campaign,
                facecolor="none",
                edgecolor="k",
                marker="o",
                s=110,
                lw=0.9,
                zorder=4,
            )
    values = pd.concat(
        [have[c] for c in ("pfi_published", "pfi_campaign", "pfi_noise_free", "pfi_seed_p95")]
    ).dropna()
    lo, hi = (values.min() * 0.95, values.max() * 1.05) if len(values) else (1.0, 3.0)
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8, ls=":")
    # Log axes: Eq. 1 explodes where a cap barely binds, and a linear scale would squeeze
    # every other group into a corner.
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ticks = [t for t in (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0) if lo <= t <= hi]
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_major_formatter(FormatStrFormatter("%g"))
        axis.set_minor_locator(NullLocator())
    for cluster, color in CLUSTER_COLORS.items():
        if (have["cluster"] == cluster).any():
            ax.scatter([], [], color=color, s=32, label=cluster)
    ax.scatter([], [], color="0.4", s=32, label="this campaign")
    ax.scatter([], [], facecolor="none", edgecolor="0.4", s=32, label="noise-free model")
    ax.plot([], [], color="0.4", lw=1.2, alpha=0.5, label="noise seeds 5-95 %")
    for name, marker in SET_MARKERS.items():
        if (have["set"] == name).any():
            ax.scatter([], [], color="0.4", marker=marker, s=32, label=f"set {name}")
    if "calibration" in have and (have["calibration"] == "in-sample").any():
        ax.scatter(
            [],
            [],
            facecolor="none",
            edgecolor="k",
            s=110,
            lw=0.9,
            label="in the anchor's fit (in sample)",
        )
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(1.02, 0.0), framealpha=0.8)
    # beside the axes, never over a point
    ax.text(
        1.03,
        1.0,
        stats_text,
        transform=ax.transAxes,
        va="top",
        ha="left",
        fontsize=8,
        bbox=dict(boxstyle="round", fc="white", alpha=0.8),
    )
    ax.set_xlabel("published PFI (Tables 6-8), log scale")
    ax.set_ylabel("emulated PFI, log scale")
    ax.set_title("Emulated vs published PFI per group")
    ax.grid(alpha=0.3)
    label_backend(fig, backend)
    tight_layout(fig, (0, 0.03, 1, 1))
    return fig


def test_set_panel(ax: plt.Axes, test_sets: pd.DataFrame) -> None:
    """Mean |PFI error| of every test set that has one (Table 6, each leave-one-table-out
    refit, each public sweep), one bar each, the Spearman with Table 6 beside the bar where
    defined; the rows scored otherwise (clock profiles) or not at all listed below the bars."""
    scored = test_sets[np.isfinite(test_sets["pfi_mae"].astype(float))].reset_index(drop=True)
    y = np.arange(len(scored))[::-1]
    colors = [
        "#1f77b4"
        if str(t).startswith("Table 6")
        else "#7f7f7f"
        if str(t).startswith("leave one")
        else "#d62728"
        for t in scored["test_set"]
    ]
    ax.barh(y, scored["pfi_mae"].astype(float), color=colors, alpha=0.8)
    for yi, r in zip(y, scored.itertuples()):
        rho = f", Spearman {r.spearman:.2f}" if np.isfinite(float(r.spearman)) else ""
        ax.text(
            float(r.pfi_mae),
            yi,
            f" {float(r.pfi_mae):.3f}{rho} (n={r.n:g})",
            va="center",
            fontsize=7,
            bbox={"fc": "white", "ec": "none", "pad": 0.5},  # the grid lines pass behind it
        )
    ax.set_yticks(y)
    ax.set_yticklabels([str(t) for t in scored["test_set"]], fontsize=7)
    ax.set_xlim(0, max(0.1, 1.8 * float(scored["pfi_mae"].max()) if len(scored) else 0.1))
    ax.set_xlabel("mean |emulated - measured or published| PFI, out of sample")
    ax.set_title(
        "Every test set side by side (fidelity_test_sets.csv: what each was and was not fitted to)",
        fontsize=9,
    )
    other = test_sets[~np.isfinite(test_sets["pfi_mae"].astype(float))]
    lines = []
    for r in other.itertuples():
        if np.isfinite(float(r.clock_share_error_pp)):
            lines.append(
                f"{r.test_set}: clock-independent share {float(r.clock_share_error_pp):+.1f} pp, power "
                f"exponent {float(r.power_exponent_error):+.2f} (emulated - measured)"
            )
    unscored = [
        str(t) for t, n in zip(other["test_set"], other["note"]) if str(n).startswith("not scored")
    ]
    if unscored:
        lines.append(f"not scored (no model of the GPU): {len(unscored)} sweeps")
    if lines:
        # under the axis label, never over a bar
        ax.text(
            0.0,
            -0.3,
            "\n".join(lines),
            transform=ax.transAxes,
            va="top",
            ha="left",
            fontsize=7,
            bbox=dict(boxstyle="round", fc="white", alpha=0.8),
        )
    ax.grid(axis="x", alpha=0.3)
