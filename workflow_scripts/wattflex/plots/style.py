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
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.offsetbox import AnchoredOffsetbox, AnnotationBbox
from matplotlib.text import Text

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
    """The data series of ``ax`` a legend should name: lines over 3 or more distinct x
    positions, scatters, shaded bands. Not series: reference lines of 2 points (y = x, a
    budget), the parts of a box plot (a box spans 2 x positions, its fliers 1) and an error
    bar's caps (both name their categories on the axis, not in a legend)."""
    caps = {id(c) for box in ax.containers if hasattr(box, "has_yerr") for c in box[1]}
    out = [
        line
        for line in ax.lines
        if id(line) not in caps and len(np.unique(np.asarray(line.get_xydata())[:, 0])) >= 3
    ]
    out += [
        c
        for c in ax.collections
        if (isinstance(c, PathCollection) and len(c.get_offsets()))
        or type(c).__name__ in ("PolyCollection", "FillBetweenPolyCollection")
    ]
    return out


def _strokes(ax: plt.Axes) -> list[tuple[str, Any]]:
    """(what, display path) of every stroke drawn in ``ax``: its lines (reference lines
    included), the visible grid lines, and line collections (``hlines``, ``vlines``, error
    bars)."""
    out = []
    grid = [(line, "a grid line") for line in ax.get_xgridlines() + ax.get_ygridlines()]
    for line, what in [(line, "a line") for line in ax.lines] + grid:
        if line.get_visible() and line.get_linestyle() not in ("None", "", " "):
            out.append((what, line.get_transform().transform_path(line.get_path())))
    for coll in ax.collections:
        if isinstance(coll, LineCollection) and coll.get_visible():
            transform = coll.get_transform()
            out += [("a line", transform.transform_path(path)) for path in coll.get_paths()]
    return out


def _bare_labels(ax: plt.Axes) -> list[tuple[str, Any]]:
    """(text, display bbox, less a pixel each side) of every label written in the area of
    ``ax`` on no opaque background: a line drawn through such a label strikes it out."""
    out = []
    area = ax.get_window_extent()
    for t in ax.texts:
        patch = t.get_bbox_patch()
        if not t.get_visible() or not t.get_text().strip():
            continue
        if patch is not None and patch.get_facecolor()[3] >= 0.8:
            continue  # written on an opaque box: the box check below applies
        box = Text.get_window_extent(t)  # the text alone, not an annotation's arrow
        if box.overlaps(area):
            out.append((t.get_text().strip().splitlines()[0][:40], box.padded(-1)))
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
    plotted data point, a label with a line (data, reference or grid) drawn through it,
    (on an Axes with more than one series) a series no legend of the Axes, its twin or the
    figure names, a legend cut by the figure's edge or over the backend label. Empty when the
    figure is clean."""
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
        twins = [a for a in fig.axes if a.bbox.bounds == ax.bbox.bounds]  # ax, and a twinx
        strokes = [stroke for a in twins for stroke in _strokes(a)]
        for text, box in _bare_labels(ax):
            struck = sorted({what for what, path in strokes if path.intersects_bbox(box, False)})
            if struck:
                problems.append(f"{where}: the label {text!r} is struck by {' and '.join(struck)}")
        series = _series(ax)
        if len(series) < 2:
            continue
        legends = [a.get_legend() for a in twins if a.get_legend() is not None]
        here = named | {t.get_text() for leg in legends for t in leg.get_texts()}
        keys = colours | _colours([h for leg in legends for h in leg.legend_handles])
        unnamed = [
            s
            for s in series
            if (s.get_label().startswith("_") or s.get_label() not in here)
            and not (_colours([s]) & keys)  # drawn in a colour a legend entry names (a proxy)
        ]
        if unnamed:
            problems.append(f"{where}: {len(unnamed)} of {len(series)} series in no legend")
    return problems + _off_the_page(fig)


def _off_the_page(fig: plt.Figure) -> list[str]:
    """A legend cut by the figure's edge, and a figure label (the backend's) under a legend:
    its frame, or without one its entries' text."""
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    page = fig.bbox.padded(1)
    out = []
    for leg in legends:
        box = leg.get_window_extent()
        if not (page.containsx(box.x0) and page.containsx(box.x1)) or not (
            page.containsy(box.y0) and page.containsy(box.y1)
        ):
            out.append(f"a legend runs off the figure ({len(leg.get_texts())} entries)")
        drawn = [box] if leg.get_frame_on() else [x.get_window_extent() for x in leg.get_texts()]
        for t in fig.texts:
            over = t.get_visible() and t.get_text().strip()
            if over and any(t.get_window_extent().overlaps(b) for b in drawn):
                out.append(f"the label {t.get_text().strip()[:40]!r} is under a legend")
    return out


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
