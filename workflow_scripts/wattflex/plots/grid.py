"""Figures of grid-facing operation (matplotlib, Agg): a flexibility offer (kW sheddable vs
the throughput it costs, per job and in total) and one event's M&V (load, target, the two
baselines, the deadline)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from wattflex.plots.style import CLUSTER_COLORS, label_backend, tight_layout


def offer_figure(
    jobs: Sequence[str],
    losses: np.ndarray,
    shed_w: np.ndarray,
    levels: Sequence[float],
    backend: Any,
    hours: float,
    clusters: Sequence[str] | None = None,
):
    """Per job (thin) and total (thick, right axis) kW sheddable at each throughput loss;
    the offer's loss levels marked. Given each job's cluster (``clusters``), a job is drawn
    in its cluster's colour and the legend names the clusters; otherwise the jobs themselves
    (up to 12; more are drawn in one colour, named once)."""
    fig, (ax, tx) = plt.subplots(1, 2, figsize=(11.5, 4.6))
    x = 100 * np.asarray(losses)
    if clusters is not None:
        count = Counter(clusters)
        names = [f"{c} ({count[c]} jobs)" for c in clusters]
        colors = [CLUSTER_COLORS.get(c, "#7f7f7f") for c in clusters]
    elif len(jobs) <= 12:
        names, colors = [str(name) for name in jobs], [f"C{j % 10}" for j in range(len(jobs))]
    else:
        names, colors = [f"one job ({len(jobs)} jobs)"] * len(jobs), ["#1f77b4"] * len(jobs)
    for j, (name, color) in enumerate(zip(names, colors, strict=True)):
        first = name not in names[:j]
        ax.plot(x, shed_w[j] / 1e3, lw=0.9, color=color, label=name if first else "_" + name)
    total = shed_w.sum(0) / 1e3
    tx.plot(x, total, color="black", lw=2.0, label="total")
    marks = ", ".join(f"{100 * lv:g}" for lv in levels)
    for i, lv in enumerate(levels):
        for a in (ax, tx):
            name = f"the offer's loss levels ({marks} %)" if i == 0 and a is tx else None
            a.axvline(100 * lv, color="grey", lw=0.6, ls=":", label=name)
        k = int(np.argmin(np.abs(np.asarray(losses) - lv)))
        tx.annotate(
            f"{total[k]:.1f} kW",
            (100 * lv, total[k]),
            textcoords="offset points",
            xytext=(4, -12),
            fontsize=8,
        )
    ax.set_xlabel("throughput loss allowed per job (%)")
    ax.set_ylabel("sheddable power (kW)")
    ax.set_title("per job (curve behind the offer)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    tx.set_xlabel("throughput loss allowed per job (%)")
    tx.set_ylabel("sheddable power, all jobs (kW)")
    tx.set_title(f"offer: kW held for {hours:g} h at each loss level", fontsize=10)
    tx.legend(fontsize=7, loc="upper left")
    tight_layout(fig, (0, 0.03, 1, 1))
    label_backend(fig, backend)
    return fig


def mv_figure(
    t_s: np.ndarray,
    loads_w: Mapping[str, np.ndarray],
    budget_w: np.ndarray,
    rec: Mapping[str, Any],
    baseline_curves_w: np.ndarray | None,
    backend: Any,
    title: str,
    styles: Mapping[str, tuple] = {},
):
    """One event: each controller's load vs the target it followed (ramps included), the
    pre-event and curve baselines, start / deadline / end marked; zoomed on the start."""
    fig, (ax, zx) = plt.subplots(1, 2, figsize=(12.5, 4.4), gridspec_kw={"width_ratios": [3, 2]})
    t = np.asarray(t_s, float)
    start, end = rec["start_s"], rec["end_s"]
    span = (t >= start - 0.1 * (end - start)) & (t <= end + 0.2 * (end - start))
    deadline = rec.get("deadline_s")
    near = (t >= start - 30) & (t <= start + 3 * (deadline or 30) + 30)
    for a, m in ((ax, span), (zx, near)):
        for name, p in loads_w.items():
            color, style = styles.get(name, (None, "-"))
            a.plot(t[m], np.asarray(p)[m] / 1e3, style, color=color, lw=0.9, label=name)
        a.plot(
            t[m],
            np.where(np.isfinite(budget_w), budget_w, np.nan)[m] / 1e3,
            color="black",
            lw=1.4,
            label="target (ramped)",
        )
        a.axhline(
            rec["baseline_pre_event_w"] / 1e3,
            color="#2ca02c",
            lw=0.8,
            ls="--",
            label="baseline: pre-event load",
        )
        if baseline_curves_w is not None:
            a.plot(
                t[m],
                np.asarray(baseline_curves_w)[m] / 1e3,
                color="#999999",
                lw=0.8,
                ls="-.",
                label="baseline: curves (uncapped)",
            )
        for x in (start, end):
            a.axvline(x, color="grey", lw=0.6)
        if deadline is not None:
            a.axvline(start + deadline, color="red", lw=0.8, ls=":", label="deadline")
        a.set_xlabel("time (s)")
        a.set_ylabel("power (kW)")
    ax.set_title(f"{title}: event {rec['event_id']}", fontsize=10)
    if near.any():  # a short run's samples, not the full window
        zx.set_xlim(t[near].min(), t[near].max())
    zx.set_title("response to the start", fontsize=9)
    fig.legend(*zx.get_legend_handles_labels(), fontsize=7, loc="upper right")  # both panels'
    tight_layout(fig, (0, 0.03, 0.84, 1))
    label_backend(fig, backend)
    return fig


def statement_figure(
    shed: Any,
    calendar: Any,
    baselines: Any,
    backend: Any,
    headline_depth: float,
    knobs: Any = None,
):
    """The flexibility statement on one page: kW shed and throughput lost against depth (5-95 %
    bands; where power caps alone stop), tokens lost a year per curtailment calendar, each
    meter baseline's error on simulated event days, and, given the deep events' table
    (``knobs``), the tokens each strategy loses per event past the caps' floor."""
    fig, ((ax, cx), (bx, kx)) = plt.subplots(2, 2, figsize=(12.5, 8.6))
    d = 100 * shed["depth"].to_numpy(float)
    ok = shed["caps_feasible_share"].to_numpy(float) >= 0.95
    ax.plot(d, shed["shed_kw"], color="black", lw=1.6, label="power shed (median site)")
    ax.fill_between(
        d,
        shed["shed_kw_p5"],
        shed["shed_kw_p95"],
        color="black",
        alpha=0.12,
        label="power shed: 5-95 % over draws",
    )
    lx = ax.twinx()
    loss = 100 * shed["throughput_loss"].to_numpy(float)
    lx.plot(
        d[ok], loss[ok], color="#d62728", lw=1.6, marker="o", ms=3, label="throughput lost (caps)"
    )
    lx.fill_between(
        d,
        100 * shed["throughput_loss_p5"],
        100 * shed["throughput_loss_p95"],
        color="#d62728",
        alpha=0.15,
        label="throughput lost: 5-95 % over draws",
    )
    deepest = shed.loc[ok, "depth"].max() if ok.any() else None
    if deepest is not None and not ok.all():
        ax.axvline(100 * deepest, color="grey", ls="--", lw=0.9)
        ax.annotate(
            "power caps alone\nstop here (95 % of draws)",
            (100 * deepest, ax.get_ylim()[1] * 0.9),
            fontsize=7,
            ha="right",
            xytext=(-4, 0),
            textcoords="offset points",
        )
    ax.set_xlabel("depth: share of the site's uncapped power shed (%)")
    ax.set_ylabel("power shed (kW)")
    lx.set_ylabel("training throughput lost (%)", color="#d62728")
    lines = ax.get_legend_handles_labels()
    more = lx.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")
    ax.set_title("how much, and at what cost (5-95 % bands)", fontsize=10)
    at = calendar[
        np.isclose(
            calendar["depth"], shed.iloc[(shed["depth"] - headline_depth).abs().argmin()]["depth"]
        )
    ]
    x = np.arange(len(at))
    year = at[["tokens_lost_per_year", "tokens_lost_per_year_p5", "tokens_lost_per_year_p95"]] / 1e9
    cx.bar(x, year["tokens_lost_per_year"], color="#1f77b4", alpha=0.8, label="median")
    cx.errorbar(
        x,
        year["tokens_lost_per_year"],
        yerr=[
            year["tokens_lost_per_year"] - year["tokens_lost_per_year_p5"],
            year["tokens_lost_per_year_p95"] - year["tokens_lost_per_year"],
        ],
        fmt="none",
        color="black",
        capsize=3,
        label="5-95 % over draws",
    )
    cx.legend(fontsize=7, loc="upper left")
    cx.set_xticks(
        x,
        [
            f"{100 * r:g} % of the year\n{n:.0f} events x {h:g} h"
            for r, n, h in zip(at["curtailment_rate"], at["events_per_year"], at["event_hours"])
        ],
        fontsize=8,
    )
    cx.set_ylabel("tokens lost per year (billions)")
    cx.set_title(
        f"how often: curtailment calendars at {100 * headline_depth:.0f} % depth", fontsize=10
    )
    cols = [c for c in baselines.columns if c.endswith("_error_pct")]
    bx.boxplot(
        [baselines[c].dropna() for c in cols],
        tick_labels=[c[: -len("_error_pct")].replace("_", " ") for c in cols],
    )
    bx.axhline(0, color="grey", lw=0.6)
    bx.axhline(
        100 * headline_depth,
        color="#d62728",
        lw=0.8,
        ls=":",
        label=f"the shed at {100 * headline_depth:.0f} %",
    )
    bx.axhline(-100 * headline_depth, color="#d62728", lw=0.8, ls=":")
    bx.set_ylabel("baseline error on event days (% of load)")
    bx.set_title("meter baselines against the true load", fontsize=10)
    bx.tick_params(axis="x", labelsize=8)
    bx.set_ylim(-135 * headline_depth, 135 * headline_depth)  # room for the legend above the line
    bx.legend(fontsize=7, loc="upper right")
    if knobs is not None and len(knobs):
        knob_panel(kx, knobs)
    else:
        kx.set_axis_off()
        kx.text(0.5, 0.5, "no deep events (no resource plan)", ha="center", va="center")
    tight_layout(fig, (0, 0.03, 1, 1))
    label_backend(fig, backend)
    return fig


def knob_panel(ax: Any, knobs: Any) -> None:
    """Tokens lost per event by each strategy at each deep depth (``knobs.csv``); a strategy
    that cannot reach the depth is marked ``infeasible`` at the bottom of its slot."""
    strategies = list(dict.fromkeys(knobs["strategy"]))
    depths = sorted(knobs["depth"].unique())
    width = 0.8 / len(strategies)
    colors = plt.get_cmap("tab10")
    for k, name in enumerate(strategies):
        rows = knobs[knobs["strategy"] == name].set_index("depth").reindex(depths)
        x = np.arange(len(depths)) + (k - (len(strategies) - 1) / 2) * width
        lost = rows["tokens_lost"].to_numpy(float) / 1e9
        ax.bar(x, np.nan_to_num(lost), width, color=colors(k), label=name)
        for xi, v in zip(x, lost):
            if not np.isfinite(v):
                ax.text(xi, 0, " infeasible", rotation=90, ha="center", va="bottom", fontsize=8)
    kw = knobs.drop_duplicates("depth").set_index("depth")["shed_kw"]
    ax.set_xticks(
        np.arange(len(depths)), [f"{100 * d:.0f} % ({kw[d]:.0f} kW)" for d in depths], fontsize=8
    )
    ax.set_xlabel("depth of the event (one drawn site)")
    ax.set_ylabel("tokens lost per event (billions)")
    ax.set_title("deeper than the caps' floor: tokens lost by knob strategy", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
