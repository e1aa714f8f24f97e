"""Flexibility offers (wattflex.ops.services.offer, ``wattflex offer``): kW sheddable at <= 10/25/50 %
throughput loss per job and in total, checked against curves whose answer is known by hand."""

import numpy as np
import pandas as pd
import pytest

from wattflex import cli
from wattflex.allocation.curves import Curves
from wattflex.ops.services.offer import offer_table, sheddable_w
from wattflex.provenance import read_csv

# job a: linear 400 W -> 0 tok/s ... 1000 W -> 100 tok/s; job b: flat above 600 W (memory-bound)
CURVES = Curves(
    np.array([[400.0, 1000.0, 1000.0], [200.0, 600.0, 800.0]]),
    np.array([[0.0, 100.0, 100.0], [50.0, 100.0, 100.0]]),
)


def test_sheddable_power_is_read_off_the_curve():
    shed = sheddable_w(CURVES, [0.10, 0.25, 0.50])
    # a: 10 % loss -> 90 tok/s at 940 W (60 W shed); 25 % -> 850 W; 50 % -> 700 W
    # b: 10 % -> 90 tok/s at 520 W (280 W shed: 600-800 W buys nothing); 25 % -> 400 W; 50 % -> floor 200 W
    np.testing.assert_allclose(shed, [[60, 150, 300], [280, 400, 600]], atol=1.5)


def test_the_table_has_every_job_and_the_total_per_loss_level():
    t = offer_table(["a", "b"], CURVES, [0.1, 0.5], hours=2.0)
    tot = t[t["job"] == "TOTAL"].set_index("max_throughput_loss")
    assert tot.loc[0.5, "shed_kw"] == pytest.approx(0.9, abs=2e-3) and tot.loc[
        0.5, "uncapped_kw"
    ] == pytest.approx(1.8)
    assert tot.loc[0.1, "energy_kwh"] == pytest.approx(2 * 0.34, abs=4e-3)
    assert tot.loc[0.1, "tokens_lost"] == pytest.approx(0.1 * 200 * 3600 * 2)


def test_offer_command_on_a_curve_table(tmp_path, capsys):
    pts = pd.DataFrame(
        {
            "job": ["a"] * 2 + ["b"] * 3,
            "power_w": [400, 1000, 200, 600, 800],
            "throughput": [1e-6, 100, 50, 100, 100],
        }
    )
    src = tmp_path / "curves.csv"
    pts.to_csv(src, index=False)
    out = tmp_path / "offer.csv"
    assert cli.main(["offer", str(src), "--job", "b=3", "--job", "a", "-o", str(out)]) == 0
    t = read_csv(out)
    assert list(t["job"].unique()) == ["b#1", "b#2", "b#3", "a", "TOTAL"]
    tot = t[(t["job"] == "TOTAL") & (t["max_throughput_loss"] == 0.25)]["shed_kw"].item()
    assert tot == pytest.approx(3 * 0.4 + 0.15, abs=5e-3)
    assert "TOTAL" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--job", "zz"], "--job 'zz': no curve for 'zz'"),
        (["--job", "a=0"], "N must be a whole number > 0"),
        (["--loss", "1.5"], "--loss 1.5: each must be a fraction in (0, 1)"),
    ],
)
def test_bad_offer_arguments_are_one_line(tmp_path, capsys, args, message):
    src = tmp_path / "curves.csv"
    pd.DataFrame({"job": ["a", "a"], "power_w": [400, 1000], "throughput": [50, 100]}).to_csv(
        src, index=False
    )
    assert cli.main(["offer", str(src), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_no_default_campaign_results_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["offer", "--configfile", "nope.yaml"]) == 2
    assert "--configfile nope.yaml: no such file" in capsys.readouterr().err


def test_a_job_at_one_cap_cannot_shed_costs_nothing_and_says_so():
    # job c: two repeats at one cap (700 W), their power differing by noise only
    curves = Curves(
        np.array([[400.0, 1000.0, 1000.0], [5400.0, 5450.0, 5450.0]]),
        np.array([[0.0, 100.0, 100.0], [10000.0, 10000.0, 10000.0]]),
        np.array([[200.0, 700.0, 700.0], [700.0, 700.0, 700.0]]),
    )
    t = offer_table(["a", "c"], curves, [0.25], hours=4.0).set_index("job")
    assert (
        t.loc["c", "shed_kw"] == 0
        and t.loc["c", "tokens_lost"] == 0
        and "no curve" in t.loc["c", "note"]
    )
    assert (
        t.loc["TOTAL", "tokens_lost"]
        == t.loc["a", "tokens_lost"]
        == pytest.approx(0.25 * 100 * 3600 * 4)
    )
    assert (
        t.loc["TOTAL", "shed_kw"] == t.loc["a", "shed_kw"]
        and "1 job(s) with one cap" in t.loc["TOTAL", "note"]
    )
    assert t.loc["a", "note"] == ""
