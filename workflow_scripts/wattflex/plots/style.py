"""The look shared by every wattflex figure: backend labels, cluster colours, the style.

Every figure made from emulated runs carries a visible "EMULATED" label (``label_backend``)
so an emulated plot can never pass for a measurement.
"""

from __future__ import annotations

import logging
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.collections import PathCollection
from matplotlib.offsetbox import AnchoredOffsetbox, AnnotationBbox

from wattflex.labels import backend_label  # noqa: F401 (re-exported: plots draw it)
from wattflex.policies import REGISTRY, Look
from wattflex.provenance import save_png
from wattflex.vocabulary import CLUSTERS

_log = logging.getLogger(__name__)

CLUSTER_COLORS = dict(zip(CLUSTERS, ("#1f77b4", "#ff7f0e", "#2ca02c"), strict=True))
CLUSTER_ORDER = list(CLUSTERS)
# a name the registry does not know (e.g. a real controller's M&V record): drawn in black
UNKNOWN_POLICY_LOOK = Look("unknown policy", "#000000")


def policy_look(name: str) -> Look:
    """The label, colour and line style of policy ``name``: its own (the registry's,
    :class:`wattflex.policies.Look`), or black for a name it does not know."""
    policy = REGISTRY.get(name)
    return UNKNOWN_POLICY_LOOK if policy is None else policy.look


def label_backend(fig: plt.Figure, backends: Any) -> None:
    """Write the backend label (red "EMULATED ..." for emulated runs) in the figure's corner."""
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


def _boxes(fig: plt.Figure, ax: plt.Axes | None) -> list[tuple[str, Any]]:
    """(text, display bbox) of every annotation box: a text drawn in a box (``bbox=``), an
    anchored text or offset box. Legends are not annotations (``loc="best"`` places them)."""
    out = []
    texts = ax.texts if ax is not None else fig.texts
    for t in texts:
        patch = t.get_bbox_patch()
        if patch is not None and t.get_visible() and t.get_text().strip():
            out.append((t.get_text().strip().splitlines()[0][:40], patch.get_window_extent()))
    for artist in ax.artists if ax is not None else ():
        if isinstance(artist, (AnchoredOffsetbox, AnnotationBbox)) and artist.get_visible():
            out.append((type(artist).__name__, artist.get_window_extent()))
    return out


def _points(ax: plt.Axes) -> np.ndarray:
    """Display coordinates of every plotted data point of ``ax`` inside its area."""
    pts = []
    for line in ax.lines:
        xy = np.asarray(line.get_xydata(), dtype=float)
        if len(xy):
            pts.append(ax.transData.transform(xy))
    for coll in ax.collections:
        offsets = np.asarray(coll.get_offsets(), dtype=float)
        if isinstance(coll, PathCollection) and len(offsets):
            pts.append(coll.get_offset_transform().transform(offsets))
    if not pts:
        return np.empty((0, 2))
    xy = np.concatenate(pts)
    xy = xy[np.isfinite(xy).all(axis=1)]
    box = ax.get_window_extent()
    inside = (
        (xy[:, 0] >= box.x0) & (xy[:, 0] <= box.x1) & (xy[:, 1] >= box.y0) & (xy[:, 1] <= box.y1)
    )
    return xy[inside]


def _series(ax: plt.Axes) -> list[Any]:
    """The data series of ``ax`` a legend should name: lines of 3 or more points, scatters,
    shaded bands (reference lines of 2 points, such as y = x or a budget, are not series)."""
    out = [line for line in ax.lines if len(line.get_xydata()) >= 3]
    out += [
        c
        for c in ax.collections
        if (isinstance(c, PathCollection) and len(c.get_offsets()))
        or type(c).__name__ in ("PolyCollection", "FillBetweenPolyCollection")
    ]
    return out


def _colours(artists: Any) -> set[tuple[float, ...]]:
    """The colours (RGBA, rounded) ``artists`` are drawn in: a line's colour, a scatter's or a
    band's face and edge colours (one colour each: a colormapped scatter names none)."""
    out: set[tuple[float, ...]] = set()
    for a in artists:
        if a is None:
            continue
        if hasattr(a, "get_color") and not hasattr(a, "get_facecolor"):
            cols = [matplotlib.colors.to_rgba(a.get_color())]
        else:
            cols = [
                c
                for getter in ("get_facecolor", "get_edgecolor")
                if hasattr(a, getter)
                for c in np.atleast_2d(getattr(a, getter)())
                if len(c) == 4 and c[3] > 0
            ]
            if len({tuple(np.round(c, 3)) for c in cols}) > 2:
                cols = []
        out.update(tuple(np.round(np.asarray(c, float), 3)) for c in cols)
    return out


def figure_problems(fig: plt.Figure) -> list[str]:
    """What a reader would trip on, found on the laid-out figure: an annotation box over a
    plotted data point, and (on an Axes with more than one series) a series no legend of the
    Axes or the figure names. Empty when the figure is clean."""
    fig.draw_without_rendering()
    problems = []
    named = {t.get_text() for leg in fig.legends for t in leg.get_texts()}
    colours = _colours([h for leg in fig.legends for h in leg.legend_handles])
    for i, ax in enumerate(fig.axes):
        where = ax.get_title() or f"axes {i}"
        pts = _points(ax)
        for text, box in _boxes(fig, ax) + _boxes(fig, None):
            hit = (
                (pts[:, 0] >= box.x0)
                & (pts[:, 0] <= box.x1)
                & (pts[:, 1] >= box.y0)
                & (pts[:, 1] <= box.y1)
            )
            if hit.any():
                problems.append(f"{where}: the box {text!r} covers {int(hit.sum())} data points")
        series = _series(ax)
        if len(series) < 2:
            continue
        legend = ax.get_legend()
        here = named | ({t.get_text() for t in legend.get_texts()} if legend else set())
        keys = colours | (_colours(legend.legend_handles) if legend else set())
        unnamed = [
            s
            for s in series
            if (s.get_label().startswith("_") or s.get_label() not in here)
            and not (_colours([s]) & keys)  # drawn in a colour a legend entry names (a proxy)
        ]
        if unnamed:
            problems.append(f"{where}: {len(unnamed)} of {len(series)} series in no legend")
    return problems


def save_figure(
    fig: plt.Figure, path: Any, prov: dict[str, Any] | None = None, **meta: Any
) -> list[str]:
    """``save_png`` (PNG and SVG) after :func:`figure_problems`: the problems found are stored
    in the figure's document (``figure_check``, empty when clean) and logged; returns them."""
    problems = figure_problems(fig)
    for problem in problems:
        _log.warning("%s: %s", path, problem)
    save_png(fig, path, prov, figure_check=problems, **meta)
    return problems
