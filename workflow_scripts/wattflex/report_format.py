"""Numbers and tables as the report shows them to people (wattflex.report renders with it).

One precision per column, chosen from the column's typical magnitude (1,234 · 12.3 · 1.23 ·
0.123), thousands separators, float noise (``3.4e-13`` beside values of order 1) shown as 0,
p-values as ``<0.001`` below a thousandth, ranges and lists inside text cells rounded the same
way. No cell is ever written in scientific notation: a column whose values span more than
what fixed notation can show names its unit instead (the CSV keeps every digit).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

#: Columns holding p- or q-values: shown with 3 significant digits, ``<0.001`` below.
#: (A bare ``p`` is not one: the predictor ablation's ``p`` counts predictors.)
_P_COLUMN = re.compile(r"(_p|^pvalue|_pvalue|p_value|p_raw|p_holm|q_bh|p_adjusted)($|\[|_holm)")
#: A float literal with more digits than anyone reads (``1.1351313887696182``, ``2e-05``).
_LONG_FLOAT = re.compile(r"-?\d+\.\d{4,}(?:[eE][-+]?\d+)?|-?\d+(?:\.\d+)?[eE][-+]?\d+")
#: Below this share of a column's typical magnitude a value is float noise, shown as 0.
_NOISE = 1e-9


def is_p_column(name: Any) -> bool:
    """A column of p- or q-values (``kruskal_p``, ``p_holm``, ``q_bh``, ``dunn_p_holm[...]``)."""
    return bool(_P_COLUMN.search(str(name)))


def _number(v: Any) -> float | None:
    if isinstance(v, (bool, np.bool_)) or v is None:
        return None
    if isinstance(v, (int, float, np.integer, np.floating)):
        return float(v)
    return None


def decimals_for(values: Any) -> int:
    """Decimal places for a column: enough for 3 significant digits of its typical
    (median non-zero) magnitude, none from 1,000 up."""
    arr = np.asarray([x for x in (_number(v) for v in values) if x is not None], dtype=float)
    arr = np.abs(arr[np.isfinite(arr)])
    arr = arr[arr > 0]
    if arr.size == 0:
        return 0
    if np.all(arr == np.round(arr)):
        return 0
    typical = float(np.median(arr))
    return int(min(6, max(0, 2 - math.floor(math.log10(typical)))))


def format_p(v: Any) -> str:
    """A p- or q-value: 3 significant digits, ``<0.001`` below a thousandth."""
    x = _number(v)
    if x is None or math.isnan(x):
        return format_value(v)
    if x < 0.001:
        return "<0.001"
    return f"{x:.3g}" if x < 1 else f"{x:.2f}"


def format_value(v: Any, decimals: int | None = None) -> str:
    """One value for people: ``—`` for missing, ``yes``/``no``, thousands separators,
    ``decimals`` places (default: 3 significant digits), never scientific notation."""
    if v is None:
        return "—"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    x = _number(v)
    if x is None:
        return format_text(str(v))
    if math.isnan(x):
        return "—"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if decimals is None:
        decimals = 0 if x == round(x) else decimals_for([x])
    text = f"{x:,.{decimals}f}"
    if float(text.replace(",", "")) == 0:  # -0.000 and float noise alike
        return "0"
    return text.replace("-", "−")


def format_text(text: str) -> str:
    """A text cell with the long floats inside it rounded (``[1.1351313887696182, 2.56]``
    becomes ``[1.14, 2.56]``); ``nan`` shown as ``—``."""
    if text.strip().lower() == "nan":
        return "—"
    return _LONG_FLOAT.sub(lambda m: format_value(float(m.group(0))), text)


def column_formatter(series: pd.Series, name: Any = None) -> Callable[[Any], str]:
    """The formatter of one column: p-values, integers, or one precision for the whole column
    (values below ``_NOISE`` x its typical magnitude shown as 0)."""
    name = series.name if name is None else name
    if is_p_column(name):
        return format_p
    nums = pd.to_numeric(series, errors="coerce")
    if series.dtype == object and nums.notna().sum() < series.notna().sum():
        return format_value  # mixed text: each cell on its own
    decimals = decimals_for(series.tolist())
    finite = nums[np.isfinite(nums.astype(float))].abs()
    scale = float(finite[finite > 0].median()) if (finite > 0).any() else 0.0

    def fmt(v: Any) -> str:
        x = _number(v)
        if x is None or not math.isfinite(x):
            return format_value(v)
        if abs(x) < _NOISE * scale:
            return "0"
        if x == round(x):
            return format_value(v, 0)
        # a small value in a column of large ones keeps 2 significant digits (-0.06 among -102)
        return format_value(v, max(decimals, min(6, 1 - math.floor(math.log10(abs(x))))))

    return fmt


def format_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Every cell of ``df`` as the text the report shows (per-column precision)."""
    out = {}
    for i, col in enumerate(df.columns):
        fmt = column_formatter(df.iloc[:, i], col)
        out[i] = [fmt(v) for v in df.iloc[:, i].tolist()]
    frame = pd.DataFrame(out, index=df.index)
    frame.columns = df.columns
    return frame
