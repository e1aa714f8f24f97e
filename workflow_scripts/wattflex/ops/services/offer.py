"""Flexibility offers from PFI curves: how many kW the jobs can shed at which throughput cost.

A job's curve is its measured (power, throughput) points, throughput non-decreasing in
power (``Curves``). Shedding at most a fraction ``loss`` of its throughput, a job can go
down to the lowest power on its curve whose throughput is still ``(1 - loss) * T_max``
(never below its floor, the lowest measured power): ``shed = P_max - that power``. A
training job holds a cap for as long as it runs, so an offer held for ``hours`` costs
``loss * T_max * 3600 * hours`` tokens and sheds ``shed * hours`` kWh. The total offer at
a loss level is the sum over jobs each held to that loss (a per-job service level, the
form a programme enrolment takes: "X kW for H hours"). A job measured at one cap only (or
one power) has no curve: it cannot shed and costs nothing, and its rows say so (``note``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from wattflex.allocation.curves import Curves

LOSSES = (0.10, 0.25, 0.50)  # the levels: kW available at <= 10 / 25 / 50 % throughput loss
GRID = 512  # points per curve on which the lowest power is searched
NO_CURVE = "one cap: no curve, cannot shed"


def without_curve(curves: Curves) -> np.ndarray:
    """(J,) jobs measured at a single cap (or, caps unknown, a single power): their repeats'
    spread in power is noise, not a curve to shed along."""
    levels = curves.power_w if curves.cap_w is None else curves.cap_w
    return np.ptp(np.asarray(levels, float), axis=-1) == 0


def sheddable_w(curves: Curves, losses: Sequence[float]) -> np.ndarray:
    """(J, L) W each job can shed keeping at least ``1 - loss`` of its uncapped throughput."""
    P, T = np.asarray(curves.power_w, float), np.asarray(curves.throughput, float)
    u = np.linspace(0.0, 1.0, GRID)
    grid = P[:, :1] + u[None, :] * (P[:, -1:] - P[:, :1])  # (J, GRID)
    t = np.maximum.accumulate(
        np.stack([np.interp(g, p, y) for g, p, y in zip(grid, P, T)]), axis=-1
    )
    t_max = t[:, -1:]
    out = np.zeros((len(P), len(losses)))
    for k, loss in enumerate(losses):
        ok = t >= (1.0 - loss) * t_max - 1e-9 * np.abs(t_max)
        lowest = grid[np.arange(len(P)), np.argmax(ok, axis=-1)]
        out[:, k] = P[:, -1] - lowest
    out[without_curve(curves)] = 0.0
    return np.maximum(out, 0.0)


def offer_table(
    jobs: Sequence[str], curves: Curves, losses: Sequence[float] = LOSSES, hours: float = 4.0
) -> pd.DataFrame:
    """One row per job and loss level, plus the ``TOTAL`` rows."""
    shed = sheddable_w(curves, losses)
    p_max = np.asarray(curves.power_w, float)[:, -1]
    t_max = np.asarray(curves.throughput, float)[:, -1]
    flat = without_curve(curves)
    rows = []
    for j, job in enumerate(jobs):
        for k, loss in enumerate(losses):
            rows.append(
                {
                    "job": str(job),
                    "max_throughput_loss": loss,
                    "uncapped_kw": p_max[j] / 1e3,
                    "shed_kw": shed[j, k] / 1e3,
                    "shed_fraction": shed[j, k] / p_max[j],
                    "hours": hours,
                    "energy_kwh": shed[j, k] / 1e3 * hours,
                    "tokens_lost": 0.0 if flat[j] else loss * t_max[j] * 3600.0 * hours,
                    "note": NO_CURVE if flat[j] else "",
                }
            )
    df = pd.DataFrame(rows)
    tot = df.groupby("max_throughput_loss", as_index=False)[
        ["uncapped_kw", "shed_kw", "energy_kwh", "tokens_lost"]
    ].sum()
    tot["job"], tot["hours"] = "TOTAL", hours
    tot["note"] = f"{flat.sum()} job(s) with one cap: 0 kW, 0 tokens" if flat.any() else ""
    tot["shed_fraction"] = tot["shed_kw"] / tot["uncapped_kw"]
    return pd.concat([df, tot[df.columns]], ignore_index=True)


def offer_curve(curves: Curves, losses: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(losses, shed_w (J, L))`` on a fine grid of loss levels, the curve behind an offer."""
    losses = np.linspace(0.0, 0.6, 61) if losses is None else np.asarray(losses, float)
    return losses, sheddable_w(curves, losses)
