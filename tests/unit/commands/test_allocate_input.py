"""``wattflex allocate`` refuses curve points that would give a wrong number
(one line naming the job and the file's line, exit 2), cleans non-monotone curves with a
stated note, never allocates below a floor, and reports its phases on large inputs."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wattflex.cli import main

HEADER = "job,power_w,throughput,cap_w,gpus"
GOOD = """dense,1600,3000,200,8
dense,3000,7000,400,8
dense,5500,10500,700,8
moe,1550,60000,200,8
moe,3100,130000,400,8
moe,5400,150000,700,8
"""


def write(tmp_path, body: str, name: str = "curves.csv") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + "\n" + body)
    return path


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1, captured.err
    assert lines[0].startswith("wattflex allocate: error: ") and "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize(
    "body, expected",
    [
        # negative throughput (line 3 of the file: header is line 1)
        (
            GOOD.replace("dense,3000,7000", "dense,3000,-7000"),
            ["curves.csv:3:", "job 'dense'", "throughput", "not a positive finite number"],
        ),
        # zero power
        (
            GOOD.replace("moe,1550,60000", "moe,0,60000"),
            ["curves.csv:5:", "job 'moe'", "power_w 0"],
        ),
        # non-finite power
        (
            GOOD.replace("moe,3100,130000", "moe,inf,130000"),
            ["curves.csv:6:", "job 'moe'", "power_w"],
        ),
        # zero throughput
        (
            GOOD.replace("moe,1550,60000", "moe,1550,0"),
            ["curves.csv:5:", "job 'moe'", "throughput 0"],
        ),
        # single-point curve
        (
            GOOD + "solo,2000,5000,400,8\n",
            ["curves.csv:8:", "job 'solo'", "single measured power (2000 W)"],
        ),
        # conflicting duplicate (job, power)
        (
            GOOD + "dense,3000,7100,400,8\n",
            [
                "curves.csv:8:",
                "job 'dense'",
                "power_w 3000 is already measured at",
                "curves.csv:3",
                "7000",
                "7100",
                "conflicting duplicate",
            ],
        ),
        # missing job id
        (GOOD + ",2000,5000,400,8\n", ["curves.csv:8:", "missing job id"]),
        # non-positive gpus
        (
            GOOD.replace("moe,1550,60000,200,8", "moe,1550,60000,200,0")
            .replace("moe,3100,130000,400,8", "moe,3100,130000,400,0")
            .replace("moe,5400,150000,700,8", "moe,5400,150000,700,0"),
            ["job 'moe'", "gpus 0"],
        ),
    ],
)
def test_bad_points_are_one_line_naming_job_and_line(tmp_path, capsys, body, expected):
    path = write(tmp_path, body)
    assert main(["allocate", str(path), "--cut", "0.3", "--policy", "equal-weight"]) == 2
    line = one_error_line(capsys)
    for part in expected:
        assert part in line, line


def test_exact_duplicate_rows_are_merged_not_refused(tmp_path, capsys):
    path = write(tmp_path, GOOD + "dense,3000,7000,400,8\n")
    assert main(["allocate", str(path), "--cut", "0.3", "--policy", "oracle"]) == 0
    ref = write(tmp_path, GOOD, "ref.csv")
    first = capsys.readouterr().out
    assert main(["allocate", str(ref), "--cut", "0.3", "--policy", "oracle"]) == 0
    assert capsys.readouterr().out == first


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--budget-w", "2000"], "below the jobs' floors 3150.0 W"),  # below the sum of floors
        (["--budget-w", "-5"], "budget_w must be a positive number"),
        (["--budget-w", "nan"], "budget_w must be a positive number"),
        (["--cut", "nan"], "cut must be a fraction"),
    ],
)
def test_infeasible_or_bad_budget_is_one_line(tmp_path, capsys, args, expected):
    path = write(tmp_path, GOOD)
    for policy in ("equal-weight", "oracle"):
        assert main(["allocate", str(path), *args, "--policy", policy]) == 2
        assert expected in one_error_line(capsys)


def test_non_monotone_curve_is_fitted_with_a_note(tmp_path, capsys):
    # throughput falls from 7000 to 6000 as power rises 3000 -> 5500 W: the isotonic fit pools
    # the two points to 6500 (and the job can never be allocated below its 1600 W floor)
    path = write(tmp_path, GOOD.replace("dense,5500,10500", "dense,5500,6000"))
    out = tmp_path / "o.csv"
    assert (
        main(["allocate", str(path), "--cut", "0.3", "--policy", "equal-weight", "-o", str(out)])
        == 0
    )
    err = capsys.readouterr().err
    assert "note: 1 job(s) have throughput falling as power rises (e.g. 'dense')" in err
    assert "isotonic" in err
    got = pd.read_csv(out).set_index("job")
    p = got.loc["dense", "power_w"]
    assert p >= 1600.0
    assert got.loc["dense", "throughput"] == pytest.approx(
        np.interp(p, [1600, 3000, 5500], [3000, 6500, 6500])
    )
    totals = json.loads((tmp_path / "o.csv.totals.json").read_text())["totals"]
    assert totals["monotone_fit_jobs"] == 1


@pytest.mark.parametrize(
    "policy",
    [
        "equal-weight",
        "pfi-aware",
        "moe-ft-weighted",
        "raw-dcgm",
        "pfi-aware-measured",
        "curve-aware",
        "oracle",
    ],
)
def test_no_job_below_its_floor_at_the_deepest_cut(tmp_path, capsys, policy):
    body = (
        "job,power_w,throughput,pfi,pfi_measured,cluster,dram_copy_product\n"
        + "\n".join(
            f"{j},{p},{t},{pf},{pf},{c},{d}"
            for j, pts, pf, c, d in [
                ("a", [(1600, 3000), (3000, 7000), (5500, 10500)], 1.2, "dense", 0.9),
                ("b", [(1550, 60000), (3100, 130000), (5400, 150000)], 2.2, "moe-ft", 0.0),
                ("c", [(300, 10), (700, 20)], 1.0, "dense", 0.1),
            ]
            for p, t in pts
        )
        + "\n"
    )
    path = tmp_path / "c.csv"
    path.write_text(body)
    floors = {"a": 1600.0, "b": 1550.0, "c": 300.0}
    for budget in (sum(floors.values()), sum(floors.values()) + 1.0, 6000.0):
        assert main(["allocate", str(path), "--budget-w", str(budget), "--policy", policy]) == 0
        out = capsys.readouterr().out
        got = pd.read_csv(pd.io.common.StringIO(out)).set_index("job")["power_w"]
        for job, floor in floors.items():
            assert got[job] >= floor - 1e-6, (policy, budget, job)
        assert got.sum() <= budget + 1e-6


def test_large_input_reports_phases_on_stderr_only(tmp_path):
    n = 1200
    rng = np.random.default_rng(0)
    P = np.sort(rng.uniform(100, 1000, (n, 4)), 1) + np.arange(4) * 1000
    T = np.sort(rng.uniform(1, 100, (n, 4)), 1)
    path = tmp_path / "big.csv"
    pd.DataFrame(
        {
            "job": np.repeat([f"j{i}" for i in range(n)], 4),
            "power_w": P.ravel(),
            "throughput": T.ravel(),
        }
    ).to_csv(path, index=False)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "wattflex.cli",
            "allocate",
            str(path),
            "--cut",
            "0.3",
            "--policy",
            "equal-weight",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "4800 points -> 1200 job curves" in r.stderr and "oracle over 1200 jobs" in r.stderr
    assert (
        r.stdout.splitlines()[0] == "job,power_w,throughput" and len(r.stdout.splitlines()) == n + 1
    )
