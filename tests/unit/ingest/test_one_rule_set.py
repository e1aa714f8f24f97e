"""`wattflex pfi` (commands.pfi.dropped_rows) and ingest (reader._row_checks)
apply one function, ``value_problems``, to a run's numbers: the same rows, the same words."""

import pandas as pd

from wattflex.commands.pfi import dropped_rows
from wattflex.ingest.reader import validate_sweep


def test_pfi_and_ingest_give_each_bad_row_the_same_reason():
    table = pd.DataFrame(
        {
            "group": ["g"] * 6,
            "cap_w": [200.0, 0.4, 400.0, 500.0, 600.0, 700.0],  # 0.4: a cap in kW
            "power_w": [1500.0, 3000.0, -3.0, 4000.0, 4500.0, 5400.0],
            "throughput": [60.0, 80.0, 85.0, float("inf"), 95.0, 100.0],
            "power_w_sem": [1.0, 1.0, 1.0, 1.0, -2.0, 1.0],
            "throughput_sem": [0.1] * 6,
            "gpus": 8,
            "_where": [f"t.csv line {i + 2}" for i in range(6)],
        }
    )
    pfi = {d["where"]: d["reason"] for d in dropped_rows(table, ["power_w_sem", "throughput_sem"])}
    ingest = dict(validate_sweep(table).rejected.itertuples(index=False))
    assert set(pfi) == {"t.csv line 3", "t.csv line 4", "t.csv line 5", "t.csv line 6"}
    assert (
        pfi["t.csv line 3"] == "cap_w = 0.4 is outside 10-2000 W per GPU (caps are per GPU, in W)"
    )
    assert pfi["t.csv line 4"] == "power_w -3 is not a finite positive number"
    assert pfi["t.csv line 5"] == "throughput inf is not a finite positive number"
    assert pfi["t.csv line 6"] == "power_w_sem -2 is negative"
    for where, reason in pfi.items():  # ingest may add its own (e.g. power over 1.5x a 0.4 W cap)
        assert ingest[where].startswith(reason), (where, ingest[where])
    assert "t.csv line 2" not in ingest and "t.csv line 7" not in ingest
