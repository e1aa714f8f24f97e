"""Figures of the analysis stages: PFI vs telemetry (Fig. 5/14 analog), predicted vs
measured PFI (Fig. 7 analog) and this campaign's pairs beside the published ones (Tables
8-9). Each function takes the stage's tables as DataFrames and returns a Figure carrying
the backend label.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from wattflex.plots.style import CLUSTER_COLORS, CLUSTER_ORDER, label_backend, tight_layout

# marker of each group set (training groups, validation groups, H100 groups)
SET_MARKERS = {"headline": "o", "validation": "s", "h100": "^"}


def _identity(ax, values) -> None:
    vals = pd.Series(np.asarray(values, dtype=float)).dropna()
    lo, hi = (vals.min() * 0.95, vals.max() * 1.05) if len(vals) else (0.0, 1.0)
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8, ls=":", label="y = x")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)


def telemetry_grid(groups: pd.DataFrame, correlations: pd.DataFrame, backend) -> plt.Figure:
    """PFI vs each telemetry metric of the uncapped run, one panel per metric (Fig. 5/14)."""
    tested = correlations[correlations["spearman_rho"].notna()]
    ncols = 4
    nrows = max(1, math.ceil(len(tested) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 2.8 * nrows), squeeze=False)
    for ax, row in zip(axes.flat, tested.itertuples()):
        for cl in CLUSTER_ORDER:
            sub = groups[groups["cluster"] == cl]
            ax.scatter(sub[row.metric], sub["pfi"], s=18, color=CLUSTER_COLORS[cl], label=cl)
        x = groups[row.metric].astype(float)
        xs = np.linspace(x.min(), x.max(), 2)
        ax.plot(xs, row.ols_intercept + row.ols_slope * xs, color="0.3", lw=0.8)
        star = "*" if row.bh_q < 0.05 else ""
        q = "q<0.001" if row.bh_q < 0.001 else f"q={row.bh_q:.2g}"
        ax.set_title(f"{row.metric}\nrho={row.spearman_rho:+.2f}, {q}{star}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_ylabel("PFI", fontsize=7)
    for ax in list(axes.flat)[len(tested) :]:
        ax.axis("off")
    fig.legend(*axes.flat[0].get_legend_handles_labels(), loc="lower left", ncol=3, fontsize=8)
    fig.suptitle("PFI vs uncapped-run telemetry (Spearman rho, BH-FDR q; * q < 0.05)", fontsize=10)
    label_backend(fig, backend)
    tight_layout(fig, (0, 0.05, 1, 0.97))
    return fig


def predicted_vs_measured(
    predictions: pd.DataFrame,
    holdout: pd.DataFrame,
    features,
    backend,
    not_fitted: str | None = None,
) -> plt.Figure:
    """Measured vs predicted PFI: training groups (LOO), validation and H100 groups (Fig. 7).
    ``not_fitted``: why there is no model (the figure says so instead of showing predictions)."""
    fig, ax = plt.subplots(figsize=(5.8, 5.4))
    for set_name, marker in SET_MARKERS.items():
        sub = predictions[(predictions["set"] == set_name) & predictions["pfi"].notna()]
        pred = sub["pfi_pred_loo"].where(sub["pfi_pred_loo"].notna(), sub["pfi_pred"])
        for cl in CLUSTER_ORDER:
            m = sub["cluster"] == cl
            ax.scatter(
                sub.loc[m, "pfi"],
                pred[m],
                marker=marker,
                s=36,
                color=CLUSTER_COLORS[cl],
                edgecolor="k" if set_name != "headline" else "none",
                zorder=3,
            )
    for set_name, marker in SET_MARKERS.items():
        row = holdout[holdout["set"] == set_name]
        if len(row):
            r = row.iloc[0]
            ax.scatter(
                [],
                [],
                marker=marker,
                color="0.5",
                label=f"{set_name} ({r['prediction']}): n={r['n']}, R²={r['r2']:.2f}, rho={r['spearman']:.2f}",
            )
    for cl in CLUSTER_ORDER:
        ax.scatter([], [], color=CLUSTER_COLORS[cl], label=cl)
    _identity(ax, pd.concat([predictions["pfi"], predictions["pfi_pred"]]))
    ax.set_xlabel("measured PFI")
    ax.set_ylabel("predicted PFI")
    ax.set_title(
        f"PFI predictor not fitted: {not_fitted}"
        if not_fitted
        else f"PFI predicted from {'+'.join(features)}",
        wrap=True,
    )
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    label_backend(fig, backend)
    tight_layout(fig, (0, 0.03, 1, 1))
    return fig


def beside_published_scatter(
    table: pd.DataFrame,
    x: str,
    y: str,
    title: str,
    xlabel: str,
    ylabel: str,
    stats_text: str,
    backend,
) -> plt.Figure:
    """This campaign's (x, y) pairs (filled) and the published ones (open), with y = x; the
    statistics in a box beside the axes, where it can cover no point."""
    fig, ax = plt.subplots(figsize=(8.0, 5.0))
    ax.scatter(table[x], table[y], s=40, color="#b00020", label="this campaign", zorder=3)
    if f"{x}_published" in table:
        ax.scatter(
            table[f"{x}_published"],
            table[f"{y}_published"],
            s=40,
            facecolor="none",
            edgecolor="k",
            label="published",
            zorder=3,
        )
        for row in table.itertuples():
            ax.plot(
                [getattr(row, x), getattr(row, f"{x}_published")],
                [getattr(row, y), getattr(row, f"{y}_published")],
                color="0.7",
                lw=0.6,
            )
    cols = [c for c in (x, y, f"{x}_published", f"{y}_published") if c in table]
    _identity(ax, pd.concat([table[c] for c in cols]) if cols else [])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    label_backend(fig, backend)
    tight_layout(fig, (0, 0.03, 0.66, 1))
    fig.text(
        0.68,
        0.92,
        stats_text,
        va="top",
        fontsize=8,
        bbox=dict(boxstyle="round", fc="white", ec="0.7"),
    )
    return fig


def summary_text(summary: pd.DataFrame, table: str) -> str:
    """The ``table`` rows of the paper-tables summary as "metric: value (published p)" lines."""
    rows = summary[summary["table"] == table]
    return "\n".join(
        f"{r.metric}: {r.value:.3g}"
        + (f" (published {r.published:.3g})" if pd.notna(r.published) else "")
        for r in rows.itertuples()
        if isinstance(r.value, (int, float))
    )
