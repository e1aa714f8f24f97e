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


def mv_figure(t_s: np.ndarray, power_w: np.ndarray, budget_w: np.ndarray, rec: Mapping[str, Any],
              baseline_curves_w: np.ndarray | None, backend: Any, title: str):
    """One event: load vs the target the controller followed, the pre-event and curve
    baselines, start / deadline / end marked."""
    fig, ax = plt.subplots(figsize=(9.5, 4.2))
    t = np.asarray(t_s, float)
    ax.plot(t, np.asarray(power_w) / 1e3, color="#1f77b4", lw=1.0, label="measured load")
    ax.plot(t, np.where(np.isfinite(budget_w), budget_w, np.nan) / 1e3, color="black", lw=1.3, label="target (ramped)")
    ax.axhline(rec["baseline_pre_event_w"] / 1e3, color="#2ca02c", lw=0.8, ls="--", label="baseline: pre-event load")
    if baseline_curves_w is not None:
        ax.plot(t, np.asarray(baseline_curves_w) / 1e3, color="#ff7f0e", lw=0.8, ls="-.", label="baseline: curves")
    for x, what in ((rec["start_s"], "start"), (rec["end_s"], "end")):
        ax.axvline(x, color="grey", lw=0.6)
    if rec.get("deadline_s") is not None:
        ax.axvline(rec["start_s"] + rec["deadline_s"], color="red", lw=0.8, ls=":", label="deadline")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("power (kW)")
    ax.set_title(f"{title}: event {rec['event_id']}, {rec['seconds_above_target_after_deadline']:g} s above target "
                 f"after the deadline", fontsize=10)
    ax.legend(fontsize=7, loc="lower left")
    tight_layout(fig, (0, 0.03, 1, 1))
    label_backend(fig, backend)
    return fig

