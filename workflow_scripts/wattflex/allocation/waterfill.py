"""The weighted policies' split of a cut (:func:`water_fill`), on its own so that the nested
limits (:mod:`wattflex.allocation.nested`) and the allocator both build on it."""

from __future__ import annotations

import numpy as np


def water_fill(cut_w: np.ndarray, headroom_w: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Split ``cut_w`` (...) over jobs (..., n) in proportion to ``weights``, no job giving
    more than its ``headroom_w``; what saturated jobs cannot give goes to the others in the
    same proportions (``C_i = min(lambda * w_i, h_i)``, ``sum C_i = cut``). Zero/NaN-weight
    jobs are cut last, in proportion to their headroom. If the cut exceeds the total
    headroom every job gives all of it (the caller reports infeasibility)."""
    cut = np.maximum(np.asarray(cut_w, float), 0.0)
    h = np.maximum(np.asarray(headroom_w, float), 0.0)
    w = np.asarray(weights, float)
    if h.shape[-1] == 0:  # no job (a rack whose units are all silent): nothing to split
        return np.zeros(np.broadcast_shapes(cut.shape + (0,), h.shape))
    w = np.where(np.isfinite(w) & (w > 0) & (h > 0), w, 0.0)
    ratio = np.divide(h, w, out=np.full_like(h, np.inf), where=w > 0)
    order = np.argsort(ratio, axis=-1, kind="stable")
    r = np.take_along_axis(ratio, order, -1)
    hs = np.take_along_axis(h, order, -1)
    ws = np.take_along_axis(w, order, -1)
    h_before = np.cumsum(hs, -1) - hs
    w_from = np.cumsum(ws[..., ::-1], -1)[..., ::-1]
    with np.errstate(invalid="ignore"):
        reach = np.where(np.isfinite(r), h_before + r * w_from, np.inf)
    m = np.argmax(reach >= cut[..., None], axis=-1)[..., None]
    w_rest = np.take_along_axis(w_from, m, -1)[..., 0]
    lam = np.divide(
        cut - np.take_along_axis(h_before, m, -1)[..., 0],
        w_rest,
        out=np.full_like(cut, np.inf),
        where=w_rest > 0,
    )
    with np.errstate(invalid="ignore"):  # inf * 0 where a job has no weight
        c = np.where(w > 0, np.minimum(lam[..., None] * w, h), 0.0)
    rest = np.maximum(cut - c.sum(-1), 0.0)
    h_left = h - c
    share = np.divide(rest, h_left.sum(-1), out=np.zeros_like(rest), where=h_left.sum(-1) > 0)
    return c + h_left * np.minimum(share, 1.0)[..., None]
