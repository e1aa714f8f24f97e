"""The look shared by every wattflex figure: backend labels, cluster colours, the style.

Every figure made from emulated runs carries a visible "EMULATED" label (``label_backend``)
so an emulated plot can never pass for a measurement.
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from wattflex.labels import backend_label  # noqa: F401 (re-exported: plots draw it)
from wattflex.vocabulary import CLUSTERS

CLUSTER_COLORS = dict(zip(CLUSTERS, ("#1f77b4", "#ff7f0e", "#2ca02c"), strict=True))
CLUSTER_ORDER = list(CLUSTERS)
# label, colour, line style of every policy in wattflex.allocation.policies.REGISTRY
POLICY_LOOK = {
    "equal-weight": ("equal weight", "#555555", "-"),
    "pfi-aware": ("PFI-aware (predicted PFI)", "#1f77b4", "-"),
    "pfi-aware-measured": ("PFI-aware (measured PFI)", "#1f77b4", ":"),
    "moe-ft-weighted": ("MoE-FT-weighted", "#2ca02c", "-"),
    "raw-dcgm": ("raw DCGM", "#9467bd", "-"),
    "curve-aware": ("curve-aware (predicted curves)", "#ff7f0e", "--"),
    "online-learning": ("online learning", "#e377c2", "-"),
    "oracle": ("oracle", "#d62728", "-"),
    "uncapped": ("uncapped", "#bbbbbb", ":"),
}


def label_backend(fig: plt.Figure, backends: Any) -> None:
    text = backend_label(backends)
    color = "#b00020" if "EMULATED" in text else "#333333"
    fig.text(0.995, 0.005, text, ha="right", va="bottom", fontsize=8, color=color, weight="bold")


def tight_layout(fig: plt.Figure, rect: tuple[float, float, float, float] = (0, 0, 1, 1)) -> None:
    """``fig.tight_layout(rect=rect)`` with one measuring pass instead of two.

    Given a rect, Matplotlib measures every Axes' decorations (tick layout and text extents:
    tight_layout was 18-27 % of a figure job's profiled time on 2 cores) twice, on the
    same unchanged geometry: once without the rect, then again to place those margins inside
    it (``_tight_layout.get_tight_layout_figure``, Matplotlib 3.8-3.11). This measures once,
    then does the second pass's arithmetic: the margins shift into the rect, and the gaps
    between rows/columns keep their size in the figure, so wspace/hspace (fractions of the
    now smaller Axes) grow. Same subplot parameters as Matplotlib's, to rounding
    (tests/unit/plots/test_style.py)."""
    fig.tight_layout()
    left, bottom, right, top = rect
    if (left, bottom, right, top) == (0, 0, 1, 1):
        return
    p = fig.subplotpars
    grids = [
        ax.get_subplotspec().get_topmost_subplotspec().get_gridspec()
        for ax in fig.axes
        if ax.get_subplotspec() is not None
    ]
    rows, cols = max((g.nrows for g in grids), default=1), max((g.ncols for g in grids), default=1)
    adjusted = {
        "left": left + p.left,
        "right": right - (1 - p.right),
        "bottom": bottom + p.bottom,
        "top": top - (1 - p.top),
    }
    if cols > 1:
        adjusted["wspace"] = _same_gap(
            p.wspace, p.right - p.left, adjusted["right"] - adjusted["left"], cols
        )
    if rows > 1:
        adjusted["hspace"] = _same_gap(
            p.hspace, p.top - p.bottom, adjusted["top"] - adjusted["bottom"], rows
        )
    fig.subplots_adjust(**adjusted)


def _same_gap(space: float, extent: float, new_extent: float, n: int) -> float:
    """The wspace/hspace that keeps the gap between ``n`` Axes, ``space`` (a fraction of the
    mean Axes) within ``extent`` of the figure, the same size within ``new_extent``."""
    gap = space * extent / (n + space * (n - 1))  # as a fraction of the figure
    return gap / ((new_extent - gap * (n - 1)) / n)


def apply_style(cfg: dict[str, Any]) -> None:
    """The ``figures`` config's style and dpi (the schema's defaults filled in). Figures are laid out at the dpi they are saved
    at (figure.dpi = savefig.dpi), so tight_layout and savefig share one renderer and its
    text-extent cache; the rule scripts save without naming a dpi."""
    plt.style.use(cfg["style"])
    plt.rcParams["figure.dpi"] = plt.rcParams["savefig.dpi"] = int(cfg["dpi"])
