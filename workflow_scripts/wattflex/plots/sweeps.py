"""Figures of the sweep stages (matplotlib, Agg): a run's power and throughput over time,
the power-throughput curves, PFI by cluster, clocks vs cap and PFI beside the published
values. Each function returns a Figure carrying the backend label (``wattflex.plots.style``).
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from wattflex.plots.style import CLUSTER_COLORS, CLUSTER_ORDER, label_backend, tight_layout
from wattflex.telemetry import TRAINING, SummaryProtocol, detect_phases, job_series


def timeseries_figure(
    telemetry: pd.DataFrame,
    steps: pd.DataFrame,
    title: str,
    backend: str,
    *,
    protocol: SummaryProtocol,
) -> plt.Figure:
    """Paper Fig. 2 analog: job power and tokens/s over a run, phases shaded.

    ``protocol``: the one the run's summary used (config ``summary``), so the shaded training
    phase is the one its steady-state numbers come from."""
    series = job_series(telemetry)
    labels = detect_phases(series, protocol)
    t = series["t_s"].to_numpy(float)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    ax1.plot(t / 60, series["power_w"] / 1000, lw=1, color="#c0392b")
    ax1.set_ylabel("job power (kW)")
    dur = np.diff(np.concatenate([[np.nan], steps["t_end_s"].to_numpy(float)]))
    rate = steps["tokens"].to_numpy(float) / dur
    rate[dur > 3 * np.nanmedian(dur)] = np.nan  # a step spanning an eval/checkpoint pause: gap
    ax2.plot(steps["t_end_s"] / 60, rate / 1000, lw=0.8, color="#2c3e50")
    ax2.set_ylabel("tokens/s (thousands)")
    ax2.set_xlabel("time since job start (min)")
    colors = {"warmup": "#f5cba7", "startup": "#fad7a0", "dip": "#d6eaf8"}
    # Eval keeps utilisation above the training threshold, so it is part of the training
    # phase (the top-10% aggregate drops it); shade it as a dip for the reader.
    train_power = series["power_w"].to_numpy(float)[labels == TRAINING]
    if train_power.size:
        low = (labels == TRAINING) & (
            series["power_w"].to_numpy(float) < 0.85 * np.median(train_power)
        )
        labels = np.where(low, "dip", labels)
    for ax in (ax1, ax2):
        for phase, c in colors.items():
            m = labels == phase
            for start, end in _runs_of(m, t):
                ax.axvspan(start / 60, end / 60, color=c, alpha=0.6, lw=0)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, alpha=0.6) for c in colors.values()]
    ax1.legend(handles, ["warmup", "startup", "eval/ckpt dip"], loc="lower right", fontsize=8)
    train = labels == TRAINING
    ax1.set_title(f"{title}\ntraining phase {train.sum() * np.median(np.diff(t)) / 60:.1f} min")
    label_backend(fig, backend)
    tight_layout(fig, (0, 0.02, 1, 1))
    return fig


def _runs_of(mask: np.ndarray, t: np.ndarray) -> list[tuple[float, float]]:
    out, start = [], None
    dt = float(np.median(np.diff(t))) if len(t) > 1 else 1.0
    for ti, m in zip(t, mask):
        if m and start is None:
            start = ti - dt
        elif not m and start is not None:
            out.append((start, ti - dt))
            start = None
    if start is not None:
        out.append((start, t[-1]))
    return out


def curve_points(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (group, cap): repeat-averaged power and tokens/s, and both normalised to uncapped."""
    pts = runs.groupby(["group", "cap_w"], as_index=False).agg(
        power_w=("power_w", "mean"),
        tokens_per_s=("tokens_per_s", "mean"),
        cluster=("cluster", "first"),
        gpu_model=("gpu_model", "first"),
        sm_clock_mhz=("sm_clock_mhz", "mean"),
        mem_clock_mhz=("mem_clock_mhz", "mean"),
        gpus=("gpus", "first"),
        set=("set", "first"),
        **({"model": ("model", "first")} if "model" in runs else {}),
    )
    ref = pts.loc[pts.groupby("group")["cap_w"].idxmax(), ["group", "power_w", "tokens_per_s"]]
    pts = pts.merge(ref, on="group", suffixes=("", "_max"))
    pts["power_norm"] = pts["power_w"] / pts["power_w_max"]
    pts["tokens_norm"] = pts["tokens_per_s"] / pts["tokens_per_s_max"]
    return pts


def curves_figure(runs: pd.DataFrame, normalized: bool) -> plt.Figure:
    """Power-throughput curves, a panel per cluster; each group coloured by its model (one
    colour per model across panels, named in the figure's legend), H100 groups dashed."""
    pts = curve_points(runs)
    clusters = [c for c in CLUSTER_ORDER if c in set(pts["cluster"])] or sorted(
        pts["cluster"].unique()
    )
    key = "model" if "model" in pts else "group"
    colors = dict(zip(sorted(pts[key].astype(str).unique()), _palette()))
    fig, axes = plt.subplots(1, len(clusters), figsize=(4.6 * len(clusters), 4.6), squeeze=False)
    for ax, cl in zip(axes[0], clusters):
        sub = pts[pts["cluster"] == cl]
        for _, g in sub.groupby("group"):
            g = g.sort_values("power_w")
            x, y = (
                (g["power_norm"], g["tokens_norm"])
                if normalized
                else (g["power_w"] / 1000, g["tokens_per_s"] / 1000)
            )
            name = str(g[key].iloc[0])
            ax.plot(
                x,
                y,
                marker="o",
                ms=3,
                lw=1,
                alpha=0.8,
                color=colors[name],
                label=name,
                ls="--" if g["gpu_model"].iloc[0] == "H100" else "-",
            )
        if normalized:
            ax.plot([0, 1], [0, 1], color="k", lw=0.8, ls=":", label="linear (PFI = 1)")
            ax.set_xlim(0.2, 1.02)
            ax.set_ylim(0.2, 1.05)
            ax.set_xlabel("P / P_max")
            ax.set_ylabel("T / T_max")
        else:
            ax.set_xlabel("job power (kW)")
            ax.set_ylabel("tokens/s (thousands)")
        ax.set_title(f"{cl} ({sub['group'].nunique()} groups)")
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=c, marker="o", ms=3, lw=1, label=m) for m, c in colors.items()]
    if (pts["gpu_model"] == "H100").any():
        handles.append(Line2D([], [], color="#555555", lw=1, ls="--", label="H100 (dashed)"))
    if normalized:
        handles.append(Line2D([], [], color="k", lw=0.8, ls=":", label="linear (PFI = 1)"))
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=min(len(handles), 5),
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(0.5, 0.02),
    )
    fig.suptitle(
        "Power-throughput curves" + (", normalised to the uncapped run" if normalized else "")
    )
    label_backend(fig, runs["backend"].unique())
    rows = math.ceil(len(handles) / 5)
    tight_layout(fig, (0, 0.06 + 0.045 * rows, 1, 1))
    return fig


def _palette() -> list[str]:
    """Ten distinct colours (matplotlib's tab10), then tab20's lighter ones."""
    tab10 = list(plt.get_cmap("tab10").colors)
    return tab10 + list(plt.get_cmap("tab20").colors)[1::2]


def pfi_by_cluster_figure(
    pfi: pd.DataFrame, backend: Any, value_col: str = "pfi_ratio"
) -> plt.Figure:
    """PFI per cluster: each group a dot (jittered, with its 95 % CI where the table has one), each
    cluster's median a line and its n; the backend labelled on the figure (emulated ones as
    emulated). Returns the figure.
    """
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    rng = np.random.default_rng(0)
    ticks = list(CLUSTER_ORDER)
    for i, cl in enumerate(CLUSTER_ORDER):
        sub = pfi[(pfi["cluster"] == cl) & np.isfinite(pfi[value_col])]
        if sub.empty:
            continue
        x = i + rng.uniform(-0.12, 0.12, len(sub))
        ax.scatter(x, sub[value_col], color=CLUSTER_COLORS[cl], s=28, zorder=3, label=cl)
        if {"ci95_low", "ci95_high"} <= set(sub):
            ax.vlines(
                x, sub["ci95_low"], sub["ci95_high"], color=CLUSTER_COLORS[cl], lw=1, alpha=0.6
            )
        med = float(sub[value_col].median())
        ax.hlines(med, i - 0.3, i + 0.3, color="k", lw=2, zorder=4)
        # under the axis, where no line or neighbour's label can run into it
        ticks[i] = f"{cl}\nmedian {med:.2f} (black bar)\n{len(sub)} groups"
    ax.axhline(1.0, color="grey", ls=":", lw=1)
    ax.set_xticks(range(len(CLUSTER_ORDER)), ticks)
    ax.set_xlim(-0.5, len(CLUSTER_ORDER) - 0.5)
    ax.set_ylabel(f"PFI ({value_col})")
    ax.set_title("PFI by cluster (headline H200 groups, 95% CI)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(title="group (95 % CI)", fontsize=8, title_fontsize=8, loc="lower right")
    label_backend(fig, backend)
    tight_layout(fig, (0, 0.03, 1, 1))
    return fig


def clocks_figure(runs: pd.DataFrame) -> plt.Figure:
    """Steady-state SM and memory clock vs cap: the cap lowers the SM clock only."""
    pts = curve_points(runs)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    for gpu, marker in (("H200", "o"), ("H100", "s")):
        sub = pts[pts["gpu_model"] == gpu]
        if sub.empty:
            continue
        for cl in CLUSTER_ORDER:
            s = (
                sub[sub["cluster"] == cl]
                .groupby("cap_w")[["sm_clock_mhz", "mem_clock_mhz"]]
                .agg(["mean", "min", "max"])
            )
            if s.empty:
                continue
            for ax, col in zip(axes, ("sm_clock_mhz", "mem_clock_mhz")):
                ax.errorbar(
                    s.index,
                    s[(col, "mean")],
                    yerr=[s[(col, "mean")] - s[(col, "min")], s[(col, "max")] - s[(col, "mean")]],
                    marker=marker,
                    ms=4,
                    capsize=2,
                    lw=1,
                    color=CLUSTER_COLORS[cl],
                    label=f"{gpu} {cl}",
                    ls="-" if gpu == "H200" else "--",
                )
    axes[0].set_ylabel("steady-state SM clock (MHz)")
    axes[1].set_ylabel("steady-state memory clock (MHz)")
    for ax in axes:
        ax.set_xlabel("per-GPU power cap (W)")
        ax.grid(alpha=0.3)
    axes[1].set_ylim(0, max(3500, float(np.nanmax(pts["mem_clock_mhz"])) * 1.1))
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, ncol=6, loc="lower left", frameon=False)
    fig.suptitle("Caps are enforced through the SM clock; the memory clock does not move")
    label_backend(fig, runs["backend"].unique())
    tight_layout(fig, (0, 0.05 + 0.035 * math.ceil(len(labels) / 6), 1, 1))
    return fig


def comparison_figure(
    table: pd.DataFrame,
    x: str,
    y: str,
    title: str,
    backend: Any,
    xlabel: str,
    ylabel: str,
    stat_text: str = "",
) -> plt.Figure:
    """Reproduced vs published values, one point per group, with y = x."""
    fig, ax = plt.subplots(figsize=(8.4, 5.2) if stat_text else (5.6, 5.2))
    for cl in CLUSTER_ORDER:
        sub = (
            table[table.get("cluster", pd.Series(dtype=str)) == cl] if "cluster" in table else table
        )
        ax.scatter(sub[x], sub[y], color=CLUSTER_COLORS.get(cl, "k"), label=cl, s=30, zorder=3)
    vals = pd.concat([table[x], table[y]]).astype(float)
    vals = vals[np.isfinite(vals)]
    lo, hi = (float(vals.min()) * 0.9, float(vals.max()) * 1.1) if len(vals) else (0, 1)
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8, ls=":", label="y = x")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if stat_text:
        # beside the axes, never over a point
        ax.text(
            1.03,
            1.0,
            stat_text,
            transform=ax.transAxes,
            va="top",
            ha="left",
            fontsize=8,
            bbox=dict(boxstyle="round", fc="white", alpha=0.8),
        )
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    label_backend(fig, backend)
    tight_layout(fig, (0, 0.03, 1, 1))
    return fig
