"""Rule script: figures of the analysis stages (Fig. 5/14 and Fig. 7 analogs, Tables 8-9).

Plot functions take the CSV/parquet artifacts as DataFrames and return a Figure; the
bottom block runs them under Snakemake. Every figure carries the backend label.
"""
import math

from wattflex.plots.core import CLUSTER_COLORS, CLUSTER_ORDER, apply_style, label_backend

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

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
        ax.set_title(f"{row.metric}\nrho={row.spearman_rho:+.2f}, q={row.bh_q:.2g}{star}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_ylabel("PFI", fontsize=7)
    for ax in list(axes.flat)[len(tested):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.suptitle("PFI vs uncapped-run telemetry (Spearman rho, BH-FDR q; * q < 0.05)", fontsize=10)
    label_backend(fig, backend)
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    return fig


def predicted_vs_measured(predictions: pd.DataFrame, holdout: pd.DataFrame, features, backend) -> plt.Figure:
    """Measured vs predicted PFI: training groups (LOO), validation and H100 groups (Fig. 7)."""
    fig, ax = plt.subplots(figsize=(5.8, 5.4))
    for set_name, marker in SET_MARKERS.items():
        sub = predictions[(predictions["set"] == set_name) & predictions["pfi"].notna()]
        pred = sub["pfi_pred_loo"].where(sub["pfi_pred_loo"].notna(), sub["pfi_pred"])
        for cl in CLUSTER_ORDER:
            m = sub["cluster"] == cl
            ax.scatter(sub.loc[m, "pfi"], pred[m], marker=marker, s=36, color=CLUSTER_COLORS[cl],
                       edgecolor="k" if set_name != "headline" else "none", zorder=3)
    for set_name, marker in SET_MARKERS.items():
        row = holdout[holdout["set"] == set_name]
        if len(row):
            r = row.iloc[0]
            ax.scatter([], [], marker=marker, color="0.5",
                       label=f"{set_name} ({r['prediction']}): n={r['n']}, R²={r['r2']:.2f}, rho={r['spearman']:.2f}")
    for cl in CLUSTER_ORDER:
        ax.scatter([], [], color=CLUSTER_COLORS[cl], label=cl)
    _identity(ax, pd.concat([predictions["pfi"], predictions["pfi_pred"]]))
    ax.set_xlabel("measured PFI")
    ax.set_ylabel("predicted PFI")
    ax.set_title(f"PFI predicted from {'+'.join(features)}")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    label_backend(fig, backend)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def beside_published_scatter(table: pd.DataFrame, x: str, y: str, title: str, xlabel: str, ylabel: str,
                             stats_text: str, backend) -> plt.Figure:
    """This campaign's (x, y) pairs (filled) and the published ones (open), with y = x."""
    fig, ax = plt.subplots(figsize=(5.4, 5.0))
    ax.scatter(table[x], table[y], s=40, color="#b00020", label="this campaign", zorder=3)
    if f"{x}_published" in table:
        ax.scatter(table[f"{x}_published"], table[f"{y}_published"], s=40, facecolor="none",
                   edgecolor="k", label="published", zorder=3)
        for row in table.itertuples():
            ax.plot([getattr(row, x), getattr(row, f"{x}_published")], [getattr(row, y), getattr(row, f"{y}_published")],
                    color="0.7", lw=0.6)
    cols = [c for c in (x, y, f"{x}_published", f"{y}_published") if c in table]
    _identity(ax, pd.concat([table[c] for c in cols]) if cols else [])
    ax.text(0.03, 0.97, stats_text, transform=ax.transAxes, va="top", fontsize=8,
            bbox=dict(boxstyle="round", fc="white", alpha=0.8))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    label_backend(fig, backend)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def _summary_text(summary: pd.DataFrame, table: str) -> str:
    rows = summary[summary["table"] == table]
    return "\n".join(f"{r.metric}: {r.value:.3g}" + (f" (published {r.published:.3g})" if pd.notna(r.published) else "")
                     for r in rows.itertuples() if isinstance(r.value, (int, float)))


if "snakemake" in globals():
    from pathlib import Path

    from wattflex.provenance import provenance, read_json, read_parquet, stamp_png
    from wattflex.smk import rule_logger

    smk = snakemake  # noqa: F821
    log = rule_logger(smk)
    apply_style(smk.params.figures)
    dpi = int(smk.params.figures.get("dpi", 110))
    out = {Path(p).stem: p for p in smk.output}
    groups = pd.read_csv(smk.input.groups)
    backend = groups["backend"].unique() if "backend" in groups else ["unknown"]
    summary = pd.read_csv(smk.input.summary)
    telemetry_grid(groups, pd.read_csv(smk.input.correlations), backend).savefig(out["telemetry_vs_pfi"], dpi=dpi)
    predicted_vs_measured(read_parquet(smk.input.predictions), pd.read_csv(smk.input.holdout),
                          read_json(smk.input.model)["features"], backend).savefig(out["predicted_vs_measured"], dpi=dpi)
    beside_published_scatter(pd.read_csv(smk.input.table8), "pfi_h200", "pfi_h100", "H100 vs H200 PFI (Table 8)",
                             "PFI on H200", "PFI on H100", _summary_text(summary, "h100_vs_h200"), backend
                             ).savefig(out["table8_h100_vs_h200"], dpi=dpi)
    beside_published_scatter(pd.read_csv(smk.input.table9), "pfi_6caps", "pfi_4caps",
                             "Sweep-grid sensitivity (Table 9)", "PFI, 6-cap grid", "PFI, 4-cap grid",
                             _summary_text(summary, "grid_sensitivity"), backend).savefig(out["table9_grid_sensitivity"], dpi=dpi)
    prov = provenance(params=smk.params.figures, inputs=list(smk.input))
    for png in smk.output:
        stamp_png(png, prov)
    log.info("wrote %s", ", ".join(out))
