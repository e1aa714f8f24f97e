"""Figures of grid-facing operation (matplotlib, Agg): a flexibility offer (kW sheddable vs
the throughput it costs, per job and in total) and one event's M&V (load, target, the two
baselines, the deadline)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from wattflex.plots.style import label_backend, tight_layout


def offer_figure(jobs: Sequence[str], losses: np.ndarray, shed_w: np.ndarray, levels: Sequence[float],
                 backend: Any, hours: float):
    """Per job (thin) and total (thick, right axis) kW sheddable at each throughput loss;
    the offer's loss levels marked."""
    fig, (ax, tx) = plt.subplots(1, 2, figsize=(11.5, 4.6))
    x = 100 * np.asarray(losses)
    for j, name in enumerate(jobs):
        ax.plot(x, shed_w[j] / 1e3, lw=0.9, label=str(name))
    total = shed_w.sum(0) / 1e3
    tx.plot(x, total, color="black", lw=2.0, label="total")
    for lv in levels:
        for a in (ax, tx):
            a.axvline(100 * lv, color="grey", lw=0.6, ls=":")
        k = int(np.argmin(np.abs(np.asarray(losses) - lv)))
        tx.annotate(f"{total[k]:.1f} kW", (100 * lv, total[k]), textcoords="offset points", xytext=(4, -12), fontsize=8)
    ax.set_xlabel("throughput loss allowed per job (%)")
    ax.set_ylabel("sheddable power (kW)")
    ax.set_title("per job (curve behind the offer)", fontsize=10)
    if len(jobs) <= 12:
        ax.legend(fontsize=6)
    tx.set_xlabel("throughput loss allowed per job (%)")
    tx.set_ylabel("sheddable power, all jobs (kW)")
    tx.set_title(f"offer: kW held for {hours:g} h at each loss level", fontsize=10)
    tight_layout(fig, (0, 0.03, 1, 1))
    label_backend(fig, backend)
    return fig


def mv_figure(t_s: np.ndarray, loads_w: Mapping[str, np.ndarray], budget_w: np.ndarray, rec: Mapping[str, Any],
              baseline_curves_w: np.ndarray | None, backend: Any, title: str, styles: Mapping[str, tuple] = {}):
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
        a.plot(t[m], np.where(np.isfinite(budget_w), budget_w, np.nan)[m] / 1e3, color="black", lw=1.4,
               label="target (ramped)")
        a.axhline(rec["baseline_pre_event_w"] / 1e3, color="#2ca02c", lw=0.8, ls="--", label="baseline: pre-event load")
        if baseline_curves_w is not None:
            a.plot(t[m], np.asarray(baseline_curves_w)[m] / 1e3, color="#999999", lw=0.8, ls="-.",
                   label="baseline: curves (uncapped)")
        for x in (start, end):
            a.axvline(x, color="grey", lw=0.6)
        if deadline is not None:
            a.axvline(start + deadline, color="red", lw=0.8, ls=":", label="deadline")
        a.set_xlabel("time (s)")
        a.set_ylabel("power (kW)")
    ax.set_title(f"{title}: event {rec['event_id']}", fontsize=10)
    if near.any():                      # a short run's samples, not the full window
        zx.set_xlim(t[near].min(), t[near].max())
    zx.set_title("response to the start", fontsize=9)
    zx.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    tight_layout(fig, (0, 0.03, 1, 1))
    label_backend(fig, backend)
    return fig
