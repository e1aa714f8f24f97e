"""``knob: clock`` as a sweep knob: config, run ids, the emulated run at a locked
clock, and the clock PFI from those runs."""

import copy
import re

import numpy as np
import pandas as pd
import pytest
import yaml

from wattflex.config import ConfigError, expand_runs, groups, prepare, run_spec
from wattflex.pfi import clock_pfi_table
from wattflex.run_ids import RUN_ID_PATTERN, parse_run_id, run_id, run_knob
from wattflex.runs.emulator.device import run_emulated
from wattflex.telemetry import SummaryProtocol, summarize_run


@pytest.fixture()
def raw(repo):
    cfg = yaml.safe_load((repo / "config" / "config.yaml").read_text())
    cfg["groups"] = [
        cfg["groups"][0],
        {
            "id": "clk-g",
            "model": cfg["groups"][0]["model"],
            "task": cfg["groups"][0]["task"],
            "gpus": 8,
            "knob": "clock",
            "clocks": [1980, 795, 1185, 1590],
        },
    ]
    cfg["repeats"] = []
    return cfg


def test_clock_run_ids_round_trip():
    assert run_id(1185, 0, "clock") == "clk1185" and run_id(1185, 2, "clock") == "clk1185_r2"
    for rid in ("clk1185", "clk1185_r2", "cap700"):
        assert re.fullmatch(RUN_ID_PATTERN, rid)
    assert (
        parse_run_id("clk1185_r2") == (1185.0, 2)
        and run_knob("clk1185") == "clock"
        and run_knob("cap700") == "cap"
    )


def test_clock_group_expands_to_one_run_per_clock_at_the_default_limit(raw, repo):
    cfg = prepare(copy.deepcopy(raw), base=repo)
    rows = [r for r in expand_runs(cfg) if r["group"] == "clk-g"]
    assert [r["run_id"] for r in rows] == ["clk795", "clk1185", "clk1590", "clk1980"]
    assert {r["cap_w"] for r in rows} == {700.0}
    g = next(g for g in groups(cfg) if g["id"] == "clk-g")
    assert g["knob"] == "clock" and g["clocks"] == [795.0, 1185.0, 1590.0, 1980.0]
    spec = run_spec(cfg, "clk-g", "clk795")
    assert (
        spec["clock_mhz"] == 795.0
        and spec["group"]["knob"] == "clock"
        and "clocks" not in spec["group"]
    )
    cap_spec = run_spec(cfg, cfg["groups"][0]["id"], expand_runs(cfg)[0]["run_id"])
    assert (
        "clock_mhz" not in cap_spec and "knob" not in cap_spec["group"]
    )  # a cap run's spec as before


@pytest.mark.parametrize(
    "mutate, words",
    [
        (
            lambda g: g.update(clocks=[300, 1200]),
            r"clocks: clock 300 MHz is outside the H200's SM clock range 345-1980 MHz",
        ),
        (lambda g: g.update(clocks=[1200, 2000]), r"clock 2000 MHz is outside"),
        (lambda g: g.update(clocks=[1200, 1200]), r"duplicate clocks"),
        (lambda g: g.pop("clocks"), r"needs clocks"),
        (lambda g: g.update(caps=[300, 700]), r"knob: clock sweeps clocks, not caps"),
        (lambda g: g.update(knob="fan"), r"knob"),
    ],
)
def test_bad_clock_groups_are_refused_naming_the_key(raw, repo, mutate, words):
    mutate(raw["groups"][1])
    with pytest.raises(ConfigError, match=words):
        prepare(copy.deepcopy(raw), base=repo)


def test_clocks_on_a_cap_group_are_refused(raw, repo):
    raw["groups"][0]["clocks"] = [1200]
    with pytest.raises(ConfigError, match=r"groups\[0\].clocks: clocks are for knob: clock groups"):
        prepare(copy.deepcopy(raw), base=repo)


def test_emulated_clock_runs_give_a_power_throughput_curve_and_its_pfi(raw, repo):
    raw["run"].update(duration_s=900, sample_period_s=1.0, eval_at_s=None, checkpoint_at_s=None)
    cfg = prepare(copy.deepcopy(raw), base=repo)
    protocol = (
        SummaryProtocol.from_config(cfg["summary"]) if "summary" in cfg else SummaryProtocol()
    )
    rows = []
    for r in (r for r in expand_runs(cfg) if r["group"] == "clk-g"):
        tel, steps, facts = run_emulated(run_spec(cfg, "clk-g", r["run_id"]))
        assert facts["clock_lock"]["clock_mhz_requested"] == r["clock_mhz"]
        # every GPU at or under the lock (the limit may take it lower); the limit in force is the default
        assert (
            tel["sm_clock_mhz"].max() <= r["clock_mhz"] + 1e-9
            and (tel["power_limit_w"] == 700).all()
        )
        rows.append(
            {
                "group": "clk-g",
                "clock_mhz": r["clock_mhz"],
                "gpus": 8,
                **summarize_run(tel, steps, protocol),
            }
        )
    runs = pd.DataFrame(rows).sort_values("clock_mhz")
    assert np.all(np.diff(runs["power_w"]) > 0) and np.all(np.diff(runs["tokens_per_s"]) > 0)
    table = clock_pfi_table(
        runs,
        throughput_col="tokens_per_s",
        power_sem_col="power_w_sem",
        throughput_sem_col="tokens_per_s_sem",
        mc_samples=200,
    )
    row = table.iloc[0]
    assert row["knob"] == "clock" and row["n_caps"] == 4 and row["uncapped_cap_w"] == 1980
    assert np.isfinite(row["pfi_ratio"]) and row["n_binding"] >= 2, row["notes"]


def test_cap_curves_and_analyses_leave_clock_groups_to_the_knob_menu():
    from wattflex.allocation.curves import curves_from_runs
    from wattflex.ops.adapters.slurm import group_curves

    runs = pd.DataFrame(
        {
            "group": ["a", "a", "c", "c"],
            "gpus": 8,
            "cap_w": [300.0, 700.0, 700.0, 700.0],
            "power_w": [2000.0, 4000.0, 3000.0, 5000.0],
            "tokens_per_s": [80.0, 100.0, 70.0, 100.0],
            "knob": [None, None, "clock", "clock"],
            "clock_mhz": [np.nan, np.nan, 990.0, 1980.0],
        }
    )
    names, curves = curves_from_runs(runs)
    assert names == ["a"] and curves.power_w.shape == (
        1,
        2,
    )  # c's runs at one limit are no cap curve
    assert group_curves(runs).groups == ("a",)
