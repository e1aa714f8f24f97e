"""The figure of an ingested campaign's report: robust vs ratio PFI per group, coloured by
what the ratio's status says (``wattflex.ingest.summary`` buckets). Returns a Figure
carrying the backend label.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from wattflex.ingest.summary import status_bucket
from wattflex.plots.style import label_backend, tight_layout

# colour of each status bucket (wattflex.ingest.summary.STATUS_BUCKETS), in legend order
BUCKET_COLORS = {
    "ok": "#2ca02c",
    "non-binding cap": "#1f77b4",
    "ill-conditioned ratio": "#d62728",
    "other": "#7f7f7f",
}


def robust_vs_ratio_figure(pfi: pd.DataFrame, title: str) -> plt.Figure:
    """Scatter of robust vs ratio PFI per group (symlog axes, linear within +-4: the ratio
    of noisy sweeps spans +-100)."""
    fig, ax = plt.subplots(figsize=(8.4, 5.6))
    bucket = pfi["status"].map(status_bucket)
    x, y = pfi["pfi_ratio"].to_numpy(float), pfi["pfi_robust"].to_numpy(float)
    finite = np.isfinite(x) & np.isfinite(y)
    for b, c in BUCKET_COLORS.items():
        m = (bucket == b).to_numpy()
        ax.scatter(
            x[m & finite],
            y[m & finite],
            s=18,
            color=c,
            alpha=0.75,
            label=f"{b} ({int(m.sum())})",
            zorder=3,
        )
    nan_robust = np.isfinite(x) & ~np.isfinite(y)
    if nan_robust.any():  # robust PFI undefined: show where their ratio sits, on the bottom axis
        ax.plot(
            x[nan_robust],
            np.full(nan_robust.sum(), 0.0),
            "|",
            color="k",
            ms=12,
            alpha=0.6,
            label=f"robust PFI undefined ({int(nan_robust.sum())}), at y = 0",
        )
    vals = np.concatenate([x[np.isfinite(x)], y[np.isfinite(y)], [0.0, 3.0]])
    lo, hi = float(vals.min()) - 0.5, float(vals.max()) * 1.3
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8, ls=":", label="y = x")
    ax.axhline(1, color="grey", lw=0.6, ls="--")
    ax.axvline(1, color="grey", lw=0.6, ls="--")
    ticks = [
        t for t in (-1000, -100, -30, -10, -3, -1, 0, 1, 2, 3, 10, 30, 100, 1000) if lo <= t <= hi
    ]
    ax.set_xscale("symlog", linthresh=4.0)
    ax.set_yscale("symlog", linthresh=4.0)
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_xlim(lo, hi)
    ax.set_ylim(min(-0.5, float(np.nanmin(y)) - 0.5) if np.isfinite(y).any() else -0.5, hi)
    ax.set_xlabel("ratio PFI (paper Eq. 1), symlog")
    ax.set_ylabel("robust PFI (isotonic, binding caps), symlog")
    ax.set_title(title, fontsize=10)
    ax.legend(
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        title="status of the ratio",
        title_fontsize=7,
    )
    ax.grid(alpha=0.3)
    label_backend(fig, ["ingest"])
    tight_layout(fig, (0, 0.03, 1, 1))
    return fig
