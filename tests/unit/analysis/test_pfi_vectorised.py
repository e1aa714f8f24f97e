"""The point estimates computed across groups (``pfi._Size``: closed-form least
squares, a vectorised isotonic fit, every flag on (groups, n) arrays) agree with the
per-group code they replace. ``tests/data/pfi_mixed_*expected.csv`` were written by that code
(branch h27 at 4a4bc73, ``pfi_table(mixed_table(), mc_samples=0, ...)``) on the table of
``pfi_mixed.py``, which takes every branch (statuses and robust statuses of all kinds)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wattflex.pfi import pfi_table

from .pfi_mixed import KWARGS, mixed_table

DATA = Path(__file__).resolve().parents[2] / "data"
NUMBERS = [
    "n_caps",
    "pfi_ratio",
    "pfi_area",
    "pfi_elasticity",
    "pfi_robust",
    "n_binding",
    "uncapped_cap_w",
    "uncapped_power_w",
    "uncapped_throughput",
]
TEXT = ["group", "status", "robust_status", "notes"]


def assert_same_points(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert got["group"].astype(str).tolist() == want["group"].astype(str).tolist()
    for c in TEXT:
        assert got[c].fillna("").astype(str).tolist() == want[c].fillna("").astype(str).tolist(), c
    for c in NUMBERS:
        np.testing.assert_allclose(
            got[c].to_numpy(float), want[c].to_numpy(float), rtol=1e-12, err_msg=c
        )
    for g, a, b in zip(got["group"], got["per_cap"], want["per_cap"]):
        a, b = json.loads(a), json.loads(b)
        assert [sorted(x) for x in a] == [sorted(x) for x in b], g
        for x, y in zip(a, b):
            for key, v in x.items():
                if isinstance(v, float) and y[key] is not None:
                    assert v == pytest.approx(y[key], rel=1e-12), (g, key)
                else:
                    assert v == y[key], (g, key)


@pytest.mark.parametrize(
    "sems,expected", [(True, "pfi_mixed_expected.csv"), (False, "pfi_mixed_nosem_expected.csv")]
)
def test_vectorised_points_agree_with_the_per_group_code(sems, expected):
    kwargs = KWARGS if sems else {"uncapped_cap_w": KWARGS["uncapped_cap_w"]}
    got = pfi_table(mixed_table(), mc_samples=0, **kwargs)
    want = pd.read_csv(DATA / expected)
    # the CSV round trip the campaign's pfi.csv also takes
    assert_same_points(got, want)
    assert set(want["status"]) >= {
        "ok",
        "capped_faster",
        "nonbinding_cap",
        "non_monotone",
        "missing_uncapped",
        "too_few_caps",
        "ill_conditioned",
        "invalid_values",
    }
