"""Figures of the control stage (matplotlib, Agg): cluster power against the budget signal
and the tokens each policy loses to the cut. Each function returns a Figure; policy colours
and line styles come from :data:`wattflex.plots.style.POLICY_LOOK`.
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from wattflex.allocation.policies import CLUSTER_REFERENCES, CONTROL_POLICIES
from wattflex.plots.style import POLICY_LOOK, label_backend, tight_layout

# colour, line style of every row of a cluster simulation: the controllers, then the references
POLICY_STYLE = {name: POLICY_LOOK[name][1:] for name in CONTROL_POLICIES + CLUSTER_REFERENCES}


def power_figure(ts: pd.DataFrame, scenario: str, backend: Any, zoom_s: float = 240.0):
    """Cluster power vs the budget over the scenario, and zoomed on the first cut."""
    names = [c.split(":", 1)[1] for c in ts.columns if c.startswith("power_w:")]
    t = ts["t_s"].to_numpy(float)
    fig, (ax, zx) = plt.subplots(2, 1, figsize=(11.5, 7.5), gridspec_kw={"height_ratios": [3, 2]})
    budget = ts["budget_w"].to_numpy(float)
    required = ts["required_w"].to_numpy(float)
    cut = np.flatnonzero(np.isfinite(budget))
    t0 = t[cut[0]] if len(cut) else t[0]
    every = max(1, len(t) // 4000)
    for name in names:
        color, style = POLICY_STYLE.get(name, ("#000000", "-"))
        p = ts[f"power_w:{name}"].to_numpy(float) / 1e3
        ax.plot(t[::every] / 3600, p[::every], style, color=color, lw=0.7, label=name)
        z = (t >= t0 - zoom_s / 4) & (t <= t0 + zoom_s)
        zx.plot(t[z] - t0, p[z], style, color=color, lw=1.0, label=name)
    for a, x, scale in ((ax, t / 3600, every), (zx, t - t0, 1)):
        m = np.ones_like(t, bool) if a is ax else (t >= t0 - zoom_s / 4) & (t <= t0 + zoom_s)
        a.plot(
            x[m][::scale],
            np.where(np.isfinite(budget), budget, np.nan)[m][::scale] / 1e3,
            color="black",
            lw=1.4,
            label="budget",
        )
        a.plot(
            x[m][::scale],
            np.where(np.isfinite(required), required, np.nan)[m][::scale] / 1e3,
            color="black",
            lw=0.8,
            ls=":",
            label="required (response time applied)",
        )
    ax.set_xlabel("time (h)")
    ax.set_ylabel("cluster GPU power (kW)")
    ax.set_title(f"{scenario}: cluster power under the budget signal, per policy")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    zx.set_xlabel("seconds since the first cut")
    zx.set_ylabel("cluster GPU power (kW)")
    zx.set_title("response to the first cut", fontsize=9)
    tight_layout(fig, (0, 0.02, 1, 1))
    label_backend(fig, backend)
    return fig


def tokens_figure(summary: pd.DataFrame, scenario: str, backend: Any):
    """Tokens lost to the cut per policy (vs running uncapped), the oracle's loss marked, and
    each policy's budget tracking."""
    s = summary[summary["policy"] != "uncapped"].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(9, 4.8))
    lost = 100 * s["tokens_lost_vs_uncapped"].to_numpy(float)
    colors = [POLICY_STYLE.get(p, ("#000000", "-"))[0] for p in s["policy"]]
    bars = ax.bar(s["policy"], lost, color=colors)
    orc = s.loc[s["policy"] == "oracle", "tokens_lost_vs_uncapped"]
    if len(orc):
        ax.axhline(100 * float(orc.iloc[0]), color=POLICY_STYLE["oracle"][0], lw=0.8, ls="--")
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
