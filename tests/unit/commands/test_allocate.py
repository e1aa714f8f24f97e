"""``wattflex allocate`` on a hand-made CSV."""

import json

import numpy as np
import pandas as pd
import pytest

from wattflex.cli import main

# Two 8-GPU jobs measured at caps 200/400/700 W. "moe" is the more flexible in relative
# terms (higher PFI) but makes far more tokens per watt, so the throughput-maximising
# oracle takes the cut from "dense" (1.4 then 2.9 tokens/s per W) before "moe" (8.7).
CURVES = """job,power_w,throughput,cap_w,gpus,pfi,cluster
dense,1600,3000,200,8,1.2,dense
dense,3000,7000,400,8,1.2,dense
dense,5500,10500,700,8,1.2,dense
moe,1550,60000,200,8,2.2,moe-ft
moe,3100,130000,400,8,2.2,moe-ft
moe,5400,150000,700,8,2.2,moe-ft
"""


@pytest.fixture
def curves_csv(tmp_path):
    path = tmp_path / "curves.csv"
    path.write_text(CURVES)
    return path


def test_oracle_allocation_meets_the_budget_and_reports_caps(curves_csv, tmp_path, capsys):
    out = tmp_path / "out.csv"
    assert (
        main(["allocate", str(curves_csv), "--cut", "0.3", "--policy", "oracle", "-o", str(out)])
        == 0
    )
    df = pd.read_csv(out)
    assert list(df.columns) == ["job", "power_w", "throughput", "cap_w"]
    budget = 0.7 * (5500 + 5400)
    assert df["power_w"].sum() <= budget + 1e-6
    got = df.set_index("job")
    # the 3270 W cut: dense gives its top segment (2500 W) and 770 W of the next one
    assert got.loc["moe", "power_w"] == pytest.approx(5400.0)
    assert got.loc["dense", "power_w"] == pytest.approx(budget - 5400.0) == pytest.approx(2230.0)
    assert got.loc["moe", "cap_w"] == pytest.approx(700.0)
    assert got.loc["dense", "cap_w"] == pytest.approx(200 + 200 * (2230 - 1600) / 1400)
    assert got.loc["dense", "throughput"] == pytest.approx(
        np.interp(2230, [1600, 3000, 5500], [3000, 7000, 10500])
    )
    totals = json.loads((tmp_path / "out.csv.totals.json").read_text())["totals"]
    assert totals["total_throughput"] == pytest.approx(df["throughput"].sum())
    assert totals["oracle_throughput"] == pytest.approx(totals["total_throughput"])
    assert totals["oracle_method"] == "hull-certified" and 0.0 <= totals["oracle_gap_rel"] <= 1e-6
    assert totals["cut"] == pytest.approx(0.3)
    assert "keeps" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["equal-weight", "pfi-aware", "moe-ft-weighted", "curve-aware"])
def test_heuristic_policies_stay_below_the_oracle(curves_csv, tmp_path, policy):
    out = tmp_path / f"{policy}.csv"
    assert (
        main(["allocate", str(curves_csv), "--cut", "0.3", "--policy", policy, "-o", str(out)]) == 0
    )
    totals = json.loads((tmp_path / f"{policy}.csv.totals.json").read_text())["totals"]
    assert totals["total_throughput"] <= totals["oracle_throughput"] + 1e-6
    assert totals["total_power_w"] <= totals["budget_w"] + 1e-6


def test_budget_below_the_floors_is_an_error(curves_csv, capsys):
    # floors 1600 + 1550 = 3150 W of 10900 W uncapped: a 75 % cut cannot be met
    assert main(["allocate", str(curves_csv), "--cut", "0.75"]) == 2
    err = capsys.readouterr().err
    assert "below the jobs' floors 3150.0 W" in err and "deepest feasible cut is 71.1%" in err


def test_sla_tier_raises_the_floor_and_can_make_the_cut_infeasible(tmp_path, capsys):
    path = tmp_path / "sla.csv"
    path.write_text(
        CURVES.replace(
            "job,power_w,throughput,cap_w,gpus,pfi,cluster",
            "job,power_w,throughput,cap_w,gpus,pfi,cluster,max_slowdown",
        )
        .replace("dense\n", "dense,\n")
        .replace("moe-ft\n", "moe-ft,0.05\n")
    )
    out = tmp_path / "o.csv"
    assert (
        main(
            [
                "allocate",
                str(path),
                "--budget-w",
                "8000",
                "--policy",
                "equal-weight",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    moe = pd.read_csv(out).set_index("job").loc["moe"]
    assert moe["throughput"] >= 0.95 * 150000 - 1e-6  # tier honoured
    assert main(["allocate", str(path), "--cut", "0.6"]) == 2
    assert "raised by max_slowdown" in capsys.readouterr().err


def test_missing_policy_input_and_bad_cut_are_clear_errors(curves_csv, capsys):
    assert main(["allocate", str(curves_csv), "--cut", "0.3", "--policy", "raw-dcgm"]) == 2
    assert "needs a per-job 'dram_copy_product' column" in capsys.readouterr().err
    assert main(["allocate", str(curves_csv), "--cut", "1.5"]) == 2
    assert "cut must be a fraction" in capsys.readouterr().err


def test_without_output_the_csv_goes_to_stdout(curves_csv, capsys):
    assert main(["allocate", str(curves_csv), "--cut", "0.1", "--policy", "equal-weight"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "job,power_w,throughput,cap_w"
