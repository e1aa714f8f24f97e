"""Values that overflow the sums of an allocation are refused naming the line, and
a budget above the uncapped power caps nothing (not "-4.8e305 % below uncapped")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from wattflex.allocation.allocator import allocate_table


def _points(override: dict | None = None) -> pd.DataFrame:
    df = pd.DataFrame(
        {
            "job": ["j1"] * 3 + ["j2"] * 3,
            "power_w": [300.0, 400, 500] * 2,
            "throughput": [80.0, 95, 100, 50, 70, 90],
        }
    )
    for (row, col), value in (override or {}).items():
        df.loc[row, col] = value
    return df


@pytest.mark.parametrize(
    "col,value,words",
    [
        (
            "power_w",
            1e308,
            "c.csv:4: job 'j1': power_w 1e+308 is above 1e+09 (not watts: check the units)",
        ),
        ("throughput", 1e308, "c.csv:4: job 'j1': throughput 1e+308 is above"),
    ],
)
def test_values_whose_sums_overflow_are_refused(col, value, words):
    with pytest.raises(ValueError) as err:
        allocate_table(_points({(2, col): value}), "oracle", cut=0.3, source="c.csv")
    assert str(err.value).startswith(words), str(err.value)


def test_a_budget_above_the_uncapped_power_caps_nothing():
    notes = []
    out, totals = allocate_table(_points(), "equal-weight", budget_w=1e308, log=notes.append)
    assert totals["cut"] == 0.0 and totals["budget_w"] == totals["uncapped_power_w"] == 1000.0
    assert np.allclose(out["power_w"], [500.0, 500.0]) and totals["total_throughput"] == 190.0
    assert any("above the jobs' uncapped power 1000.0 W: no job is capped" in n for n in notes), (
        notes
    )


def test_a_30_percent_cut_is_applied_with_large_but_finite_values():
    df = _points()
    df["throughput"] *= 1e300  # large, yet their sum is finite
    out, totals = allocate_table(df, "oracle", cut=0.3)
    assert totals["total_power_w"] <= 700.0 + 1e-6 and np.isfinite(totals["total_throughput"])
