"""Figures of the allocation stage (matplotlib, Agg): the Fig. 8 analog and the
out-of-sample check. Each function returns a Figure; policy labels, colours and line
styles are the policies' own (:func:`wattflex.plots.style.policy_look`).
"""

from __future__ import annotations

import textwrap
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from wattflex.plots.style import label_backend, policy_look, tight_layout
from wattflex.policies import baseline, get, names, optimum, published


def figure_policies() -> dict[str, tuple[str, str, str]]:
    """Label, colour and line style of each allocation policy, in legend order."""
    return {
        name: (look.label, look.color, look.linestyle)
        for name in names(allocation=True)
        for look in [policy_look(name)]
    }


def nothing_to_show(reason: str, backends: Any, title: str | None = None):
    """A one-panel figure that says why a figure has nothing to show."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.text(0.5, 0.5, f"nothing to show: {reason}", ha="center", va="center", wrap=True, fontsize=9)
    ax.axis("off")
    if title:
        fig.suptitle(title)
    label_backend(fig, backends)
    return fig


def fig8_figure(
    summary: pd.DataFrame,
    headline_table: pd.DataFrame,
    backends: Any,
    skipped_mixes: dict[str, str] | None = None,
    headline_reason: str | None = None,
):
    """Fig. 8 analog: per mix, tokens/s per job vs cut (mean; p5-p95 over workloads for equal
    weight and the oracle) and the share of the equal-weight-to-oracle gap closed.
    ``skipped_mixes``: mixes not simulated and why, named under the panels (the only content
    when no mix was); ``headline_reason``: why the headline has no rows."""
    skipped_mixes = skipped_mixes or {}
    notes = [f"{mix} mix not simulated: {why}" for mix, why in skipped_mixes.items()]
    if headline_reason and not any(why in headline_reason for why in skipped_mixes.values()):
        notes.append(f"no headline: {headline_reason}")
    mixes = list(dict.fromkeys(summary["mix"]))
    if not mixes:
        return nothing_to_show(
            "; ".join(notes) or "no mix was simulated",
            backends,
            "Allocation under a cluster power cut (Fig. 8 analog)",
        )
    fig, axes = plt.subplots(
        2, len(mixes), figsize=(5.2 * len(mixes), 7.5), sharex=True, squeeze=False
    )
    for col, mix in enumerate(mixes):
        part = summary[summary["mix"] == mix]
        top, bottom = axes[0, col], axes[1, col]
        ends = (baseline(), optimum())  # the gap closed is counted between these
        for policy, (label, color, style) in figure_policies().items():
            p = part[part["policy"] == policy].sort_values("cut")
            if p.empty:
                continue
            x = 100 * p["cut"]
            top.plot(
                x,
                p["per_job_tokens_per_s_mean"] / 1e3,
                style,
                color=color,
                label=label,
                marker="o",
                ms=3,
            )
            if policy in ends:  # spread over workloads (p5-p95)
                top.fill_between(
                    x,
                    p["per_job_tokens_per_s_p5"] / 1e3,
                    p["per_job_tokens_per_s_p95"] / 1e3,
                    color=color,
                    alpha=0.12,
                    lw=0,
                    label=f"{label}: 5-95 % over workloads",
                )
            if policy not in ends:
                bottom.plot(
                    x, 100 * p["gap_closed"], style, color=color, label=label, marker="o", ms=3
                )
        top.set_title(f"{mix} mix")
        top.set_ylabel("tokens/s per job (x1000)")
        bottom.axhline(0, color="#555555", lw=0.8)
        bottom.axhline(100, color="#d62728", lw=0.8)
        bottom.set_ylabel("% of equal-weight-to-oracle gap closed")
        bottom.set_xlabel("cluster power cut (%)")
        shown = part[~part["policy"].isin(ends)]
        lo = np.nanmin(100 * shown["gap_closed"].to_numpy(float), initial=0.0)
        bottom.set_ylim(max(lo - 5, GAP_FLOOR), 110)
        _off_scale(bottom, shown)
        h = headline_table[
            (headline_table["mix"] == mix) & (headline_table["policy"] == published())
        ]
        if not h.empty:
            r = h.iloc[0]
            bottom.set_title(
                f"{100 * r['cut']:.0f}% cut, PFI-aware: {r['tokens_per_s_per_job_recovered']:+,.0f} "
                f"tokens/s/job, {100 * r['gap_closed']:.0f}% of gap (paper: "
                f"{r['published_tokens_per_s_per_job_recovered']:+,.0f}, "
                f"{100 * r['published_gap_closed']:.0f}%)",
                fontsize=8,
            )
    handles, labels = axes[0, 0].get_legend_handles_labels()
    for ax in axes.flat:  # a policy only another panel draws
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    legend_rows = int(np.ceil(len(labels) / 4))
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7, frameon=False)
    fig.suptitle("Allocation under a cluster power cut (Fig. 8 analog)")
    # the notes under the panels, wrapped to the figure's width (about 17 characters an inch at 7 pt)
    lines = [line for note in notes for line in textwrap.wrap(note, int(17 * fig.get_figwidth()))]
    legend_h = 0.022 * legend_rows + 0.01
    if lines:
        fig.text(0.5, legend_h + 0.01, "\n".join(lines), ha="center", va="bottom", fontsize=7)
    tight_layout(fig, (0, legend_h + 0.02 + 0.02 * len(lines) + (0.01 if lines else 0), 1, 1))
    label_backend(fig, backends)
    return fig


#: The lower panels' floor (% of the gap closed); a policy below it is named off scale.
GAP_FLOOR = -150.0


def _off_scale(ax, shown: pd.DataFrame) -> None:
    """Name each policy whose gap closed falls below ``GAP_FLOOR`` (raw DCGM on a falling
    segment), with its lowest value, along the panel's floor."""
    low = shown[100 * shown["gap_closed"] < GAP_FLOOR]
    looks = figure_policies()
    notes = [
        f"{looks[p][0]} below {GAP_FLOOR:.0f} % (down to {100 * g['gap_closed'].min():,.0f} %)"
        for p, g in low.groupby("policy", sort=False)
        if p in looks
    ]
    if notes:
        ax.text(
            0.02,
            0.02,
            "off scale: " + "; ".join(notes),
            transform=ax.transAxes,
            fontsize=6.5,
            bbox={"fc": "white", "ec": "none", "pad": 1},  # the falling line passes behind it
        )


def out_of_sample_figure(oos: pd.DataFrame, backends: Any):
    """Gap closed by PFI-aware and curve-aware with the predictor fitted in-sample vs on the
    other half of the groups (mean and p5-p95 over splits)."""
    mixes = list(dict.fromkeys(oos["mix"]))
    if not mixes:  # allocation.out_of_sample.splits: 0 (or no split could be drawn)
        fig, ax = plt.subplots(figsize=(5.2, 4))
        ax.text(
            0.5,
            0.5,
            "no out-of-sample splits\n(allocation.out_of_sample.splits: 0)",
            ha="center",
            va="center",
        )
        ax.axis("off")
        label_backend(fig, backends)
        return fig
    rows = 8 // len(mixes)  # legend rows: 8 entries, a column per panel
    height = 3.6 + 0.17 * rows
    fig, axes = plt.subplots(1, len(mixes), figsize=(5.2 * len(mixes), height), squeeze=False)
    for ax, mix in zip(axes[0], mixes):
        # the studied policies that read the PFI (the predictor's split changes only them)
        for policy in (p for p in names(out_of_sample=True) if get(p).feature == "pfi"):
            color = policy_look(policy).color
            for variant, style in (("in-sample", "-"), ("out-of-sample", "--")):
                p = oos[
                    (oos["mix"] == mix) & (oos["policy"] == policy) & (oos["variant"] == variant)
                ].sort_values("cut")
                p = p[p["cut"] > 0]
                ax.plot(
                    100 * p["cut"],
                    100 * p["gap_closed_mean"],
                    style,
                    color=color,
                    marker="o",
                    ms=3,
                    label=f"{policy}, {variant}",
                )
                ax.fill_between(
                    100 * p["cut"],
                    100 * p["gap_closed_p5"],
                    100 * p["gap_closed_p95"],
                    color=color,
                    alpha=0.08,
                    lw=0,
                    label=f"{policy}, {variant}: 5-95 % over splits",
                )
        ax.set_title(f"{mix} mix: workloads from held-out groups")
        ax.set_xlabel("cluster power cut (%)")
        ax.set_ylabel("% of equal-weight-to-oracle gap closed")
        ax.axhline(100, color="#d62728", lw=0.8)
    fig.legend(
        *axes[0, 0].get_legend_handles_labels(),
        loc="lower center",
        bbox_to_anchor=(0.5, 0.2 / height),  # above the backend label
        ncol=len(mixes),
        fontsize=7,
    )
    tight_layout(fig, (0, (0.35 + 0.17 * rows) / height, 1, 1))
    label_backend(fig, backends)
    return fig
