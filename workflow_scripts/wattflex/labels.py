"""What every artifact says about where its numbers came from: emulated, measured or mixed.

Light (numpy only): tables carry the label in their sidecars, figures (``plots.style``)
draw it, and neither should import the other's dependencies to do so.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def backend_label(backends: Any) -> str:
    """The label of data from ``backends`` (one name or many, e.g. a column's values)."""
    vals = sorted({str(b) for b in np.atleast_1d(backends) if b is not None and str(b) != "nan"})
    if vals == ["emulated"]:
        return "EMULATED (virtual GPU model, not a measurement)"
    if "emulated" in vals:
        return "MIXED: includes EMULATED runs"
    return "measured (" + ", ".join(vals) + ")"
