"""wattflex.plots.style.tight_layout: Matplotlib's tight layout into a rect, measured once."""

import matplotlib.pyplot as plt
import pytest

from wattflex.plots.style import tight_layout

PARAMS = ("left", "right", "bottom", "top", "wspace", "hspace")


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def grid(rows: int, cols: int, suptitle: bool, long_labels: bool) -> plt.Figure:
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.plot([0, 1e4 * (i + 1)], [0, 1])
        ax.set_title(f"panel {i}\nsecond line" if i % 2 else f"panel {i}", fontsize=8)
        ax.set_xlabel("tokens per second of the whole job" if long_labels else "x")
        ax.set_ylabel("PFI" if i % 2 else "normalised throughput")
    if suptitle:
        fig.suptitle("a suptitle of some length", fontsize=10)
    fig.text(0.995, 0.005, "EMULATED", ha="right", va="bottom", fontsize=8)
    return fig


@pytest.mark.parametrize("shape", [(1, 1), (1, 3), (2, 1), (3, 4)])
@pytest.mark.parametrize("rect", [(0, 0.03, 1, 1), (0, 0.03, 1, 0.97), (0.05, 0.02, 0.9, 0.95)])
def test_one_pass_gives_matplotlibs_two_pass_subplot_params(shape, rect):
    params = []
    for layout in (lambda f: f.tight_layout(rect=rect), lambda f: tight_layout(f, rect)):
        fig = grid(*shape, suptitle=shape[0] > 1, long_labels=shape[1] > 1)
        layout(fig)
        params.append({k: getattr(fig.subplotpars, k) for k in PARAMS})
    assert params[1] == pytest.approx(params[0], rel=1e-9, abs=1e-12)


def test_without_a_rect_it_is_matplotlibs_tight_layout():
    a, b = grid(2, 2, True, True), grid(2, 2, True, True)
    a.tight_layout()
    tight_layout(b)
    assert {k: getattr(b.subplotpars, k) for k in PARAMS} == {
        k: getattr(a.subplotpars, k) for k in PARAMS
    }
