"""Figures of the control stage (matplotlib, Agg): cluster power against the budget signal
and the tokens each policy loses to the cut. Each function returns a Figure; policy colours
and line styles are the policies' own (:func:`wattflex.plots.style.policy_look`).
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from wattflex.plots.style import label_backend, policy_look, tight_layout
from wattflex.policies import names as policy_names
from wattflex.policies import optimum, unlimited


def policy_styles() -> dict[str, tuple[str, str]]:
    """Colour and line style of every row a cluster simulation can have: the controllers,
    then the references."""
    rows = policy_names(control=True) + policy_names(cluster_reference=True)
    return {name: (policy_look(name).color, policy_look(name).linestyle) for name in rows}


def power_figure(ts: pd.DataFrame, scenario: str, backend: Any, zoom_s: float = 240.0):
    """Cluster power vs the budget over the scenario, one small panel per policy (so no policy
    hides another), and all of them zoomed on the first cut."""
    names = [c.split(":", 1)[1] for c in ts.columns if c.startswith("power_w:")]
    t = ts["t_s"].to_numpy(float)
    cols = min(4, max(1, len(names)))
    rows = int(np.ceil(len(names) / cols))
    fig = plt.figure(figsize=(12, 2.3 * rows + 3.6))
    grid = fig.add_gridspec(rows + 1, cols, height_ratios=[1.0] * rows + [1.7])
    budget = ts["budget_w"].to_numpy(float)
    required = ts["required_w"].to_numpy(float)
    cut = np.flatnonzero(np.isfinite(budget))
    t0 = t[cut[0]] if len(cut) else t[0]
    every = max(1, len(t) // 4000)
    near = (t >= t0 - zoom_s / 4) & (t <= t0 + zoom_s)
    zx = fig.add_subplot(grid[rows, :])
    first = None
    for i, name in enumerate(names):
        ax = fig.add_subplot(grid[i // cols, i % cols], sharex=first, sharey=first)
        first = first or ax
        look = policy_look(name)
        color, style = look.color, look.linestyle
        p = ts[f"power_w:{name}"].to_numpy(float) / 1e3
        ax.plot(t[::every] / 3600, p[::every], style, color=color, lw=0.7, label=name)
        _budget_lines(ax, t[::every] / 3600, budget[::every], required[::every])
        ax.set_title(name, fontsize=8)
        ax.tick_params(labelsize=7)
        if i % cols == 0:
            ax.set_ylabel("power (kW)", fontsize=8)
        if i // cols == rows - 1:
            ax.set_xlabel("time (h)", fontsize=8)
        zx.plot(t[near] - t0, p[near], style, color=color, lw=1.0, label=name)
    _budget_lines(zx, t[near] - t0, budget[near], required[near])
    zx.set_xlabel("seconds since the first cut")
    zx.set_ylabel("cluster GPU power (kW)")
    zx.set_title("every policy's response to the first cut", fontsize=9)
    handles, labels = [], []
    for h, lab in zip(*zx.get_legend_handles_labels()):
        if lab not in labels:
            handles.append(h)
            labels.append(lab)
    fig.legend(handles, labels, fontsize=7, loc="lower left", ncol=5, frameon=False)
    fig.suptitle(f"{scenario}: cluster power under the budget signal, per policy")
    tight_layout(fig, (0, 0.035 + 0.018 * int(np.ceil(len(labels) / 5)), 1, 1))
    label_backend(fig, backend)
    return fig


def _budget_lines(ax, x: np.ndarray, budget: np.ndarray, required: np.ndarray) -> None:
    """The budget and the required power (the budget with the response time applied)."""
    ax.plot(x, budget / 1e3, color="black", lw=1.2, label="budget")
    ax.plot(
        x, required / 1e3, color="black", lw=0.8, ls=":", label="required (response time applied)"
    )


def tokens_figure(summary: pd.DataFrame, scenario: str, backend: Any):
    """Tokens lost to the cut per policy (vs running uncapped), the oracle's loss marked, and
    each policy's budget tracking."""
    s = summary[summary["policy"] != unlimited()].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    lost = 100 * s["tokens_lost_vs_uncapped"].to_numpy(float)
    colors = [policy_look(p).color for p in s["policy"]]
    bars = ax.bar(s["policy"], lost, color=colors)
    orc = s.loc[s["policy"] == optimum(), "tokens_lost_vs_uncapped"]
    if len(orc):
        ax.axhline(100 * float(orc.iloc[0]), color=policy_look(optimum()).color, lw=0.8, ls="--")
    for b, (_, r) in zip(bars, s.iterrows()):
        ax.text(
            b.get_x() + b.get_width() / 2,
            b.get_height(),
            f"{100 * r['tokens_vs_oracle']:.1f}% of oracle\nover budget: {r['seconds_above_budget']:.0f} s,\n"
            f"worst +{r['worst_overshoot_w'] / 1e3:.2f} kW",
            ha="center",
            va="bottom",
            fontsize=6.5,
        )
    ax.set_ylabel("tokens lost vs uncapped (%)")
    ax.set_ylim(0, max(lost.max() * 1.3, 1.0))
    ax.set_title(f"{scenario}: tokens lost to the cut, per policy")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    tight_layout(fig, (0, 0.03, 1, 1))
    label_backend(fig, backend)
    return fig
