"""``wattflex knobs``: the knob menu's choice from a campaign's runs and a jobs table, written as
the CSV ``cluster-control --knob-choice`` reads."""

import io
import json

import numpy as np
import pandas as pd
import pytest
import yaml

from wattflex.gpus import GPUS
from wattflex.ops.adapters.slurm_knobs import KnobPlan, read_choice

# One cap group of 2 GPUs measured at 200/400/700 W per GPU, and its knob: clock group at three
# locked clocks (default limit): the clock sheds cheaper than the cap at every power
RUNS = """group,gpus,cap_w,power_w,tokens_per_s,knob,clock_mhz
dense,2,200,400,60,cap,
dense,2,400,800,90,cap,
dense,2,700,1300,100,cap,
dense,2,700,1310,100,cap,
dense-clk,2,700,500,80,clock,990
dense-clk,2,700,850,95,clock,1485
dense-clk,2,700,1300,100,clock,1980
"""
# 101 may take the clock; 102 restarts fast; 103 may not pause (max_pause_s 0)
JOBS = """job,group,clock_group,since_checkpoint_s,restart_s,checkpoint_write_s,max_pause_s
101,dense,dense-clk,100,,,
102,dense,,0,30,5,
103,dense,,50,,,0
"""
PLAN = "group,startup_s,checkpoint_write_s\ndense,600,20\n"


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "runs.csv").write_text(RUNS)
    (tmp_path / "jobs.csv").write_text(JOBS)
    (tmp_path / "plan.csv").write_text(PLAN)
    return tmp_path


ARGS = ["--curves", "runs.csv", "--jobs", "jobs.csv", "--plan", "plan.csv", "--duration-s", "3600"]


def test_a_deep_event_gets_a_mix_that_meets_it_in_the_csv_cluster_control_reads(inputs, run_cli):
    r = run_cli(
        "knobs", *ARGS, "--depth-frac", "0.75", "--notice-s", "60", "-o", "c.csv", cwd=inputs
    )
    assert r.returncode == 0, r.stderr
    out = pd.read_csv(inputs / "c.csv", dtype={"job": str})
    assert list(out.columns) == [
        "job",
        "knob",
        "power_w",
        "shed_kw",
        "tokens_lost",
        "clock_mhz",
        "why",
    ]
    uncapped = 3 * 1305.0  # the repeats at 700 W averaged
    assert out["job"].tolist() == ["101", "102", "103"]
    assert out["power_w"].sum() <= 0.25 * uncapped + 1e-6  # the event met
    knob = dict(zip(out["job"], out["knob"]))
    assert knob["103"] != "pause" and "pause unavailable" in out["why"].iloc[2]
    assert set(knob.values()) <= {"cap", "clock", "pause", "requeue", "none"}
    assert all(out["why"].str.contains(r"\*"))  # each row stars the option it took
    for row in out[out["knob"] == "clock"].itertuples():  # the lock that runs it at its power
        assert row.clock_mhz == np.floor(
            np.interp(row.power_w, [500, 850, 1300], [990, 1485, 1980])
        )
    assert knob["101"] == "clock"  # the cheapest way for 101, the only job with a clock curve
    assert out.loc[out["knob"] != "clock", "clock_mhz"].isna().all()
    # cluster-control's reader takes it, and its plan names 101's clock
    plan = KnobPlan(read_choice(inputs / "c.csv"), GPUS["H200"].idle_w, log=lambda m: None)
    assert plan.choice["clock_mhz"].iloc[0] == out["clock_mhz"].iloc[0]
    assert (inputs / "c.csv.meta.json").exists()


def test_caps_alone_cannot_a_deep_cut_and_a_shallow_one_takes_curves_at_no_more_cost(
    inputs, run_cli
):
    r = run_cli("knobs", *ARGS, "--depth-frac", "0.75", "--knobs", "cap", cwd=inputs)
    assert r.returncode == 2  # floors 3 x 400 W over the 25 % left of 3 x 1305 W
    assert r.stderr.strip().splitlines() == [
        "wattflex knobs: error: no choice meets the event: infeasible with cap: the lowest power "
        "they reach is 1.2 kW, the event asks for 1.0 kW (deepest cut 69.3% of 3.9 kW)"
    ]
    shallow = run_cli("knobs", *ARGS, "--depth-kw", "0.3", cwd=inputs)
    assert shallow.returncode == 0, shallow.stderr
    table = pd.read_csv(io.StringIO(shallow.stdout))
    assert table["power_w"].sum() <= 3 * 1305.0 - 300.0 + 1e-6
    assert not table["knob"].isin(["pause", "requeue"]).any()  # a shallow cut: curves only
    caps = run_cli("knobs", *ARGS, "--depth-kw", "0.3", "--knobs", "cap", cwd=inputs)
    lost = lambda r: pd.read_csv(io.StringIO(r.stdout))["tokens_lost"].sum()  # noqa: E731
    assert lost(shallow) <= lost(caps) + 1e-6


@pytest.mark.parametrize(
    "jobs, expected",
    [
        ("job,group,since_checkpoint_s\n1,sparse,0\n", "job 1: group 'sparse' has no cap curve"),
        ("job,group\n1,dense\n", "jobs table needs column(s) since_checkpoint_s"),
        (
            "job,group,since_checkpoint_s,clock_group\n1,dense,0,nope\n",
            "job 1: clock_group 'nope' has no clock curve",
        ),
        ("job,group,since_checkpoint_s\n1,dense,-5\n", "job 1: since_checkpoint_s -5"),
        ("job,group,since_checkpoint_s\n1,dense,0\n1,dense,0\n", "names job 1 twice"),
    ],
)
def test_a_bad_jobs_table_is_one_line_naming_the_job(inputs, run_cli, jobs, expected):
    (inputs / "jobs.csv").write_text(jobs)
    r = run_cli("knobs", *ARGS, "--depth-frac", "0.5", cwd=inputs)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert expected in r.stderr, r.stderr


def test_without_a_plan_a_job_needs_its_restart_time(inputs, run_cli):
    r = run_cli("knobs", *ARGS[:4], "--duration-s", "60", "--depth-frac", "0.5", cwd=inputs)
    assert r.returncode == 2
    assert "job 101: no restart_s (the resource plan's startup_s of the group)" in r.stderr


@pytest.mark.parametrize(
    "extra, expected",
    [
        (
            ["--depth-frac", "1.5"],
            "argument --depth-frac: '1.5': must be a finite number > 0 and <= 1",
        ),
        (["--depth-kw", "nan"], "argument --depth-kw: 'nan': must be a finite number > 0"),
        (["--depth-frac", "0.5", "--knobs", "cap,throttle"], "--knobs 'cap,throttle': name one"),
    ],
)
def test_bad_numbers_and_knobs_are_refused(inputs, run_cli, extra, expected):
    r = run_cli("knobs", *ARGS, *extra, cwd=inputs)
    assert r.returncode == 2 and expected in r.stderr, r.stderr


# Rack r1 holds node1 (job 101), rack r2 node2 and node3 (jobs 102 and 103) at 2.2 kW, below
# their 2 x 1305 W uncapped: a 0.3 kW event met on 101's clock alone leaves r2 over.
SITE = {
    "site": "dc1",
    "limit_kw": 4.0,
    "feeds": [
        {
            "name": "a",
            "limit_kw": 4.0,
            "pdus": [
                {
                    "name": "p1",
                    "limit_kw": 4.0,
                    "racks": [
                        {"name": "r1", "limit_kw": 2.0, "nodes": ["node1"]},
                        {"name": "r2", "limit_kw": 2.2, "nodes": ["node[2-3]"]},
                    ],
                }
            ],
        }
    ],
}


@pytest.fixture
def site_inputs(inputs):
    (inputs / "site.yaml").write_text(yaml.safe_dump(SITE))
    jobs = pd.read_csv(io.StringIO(JOBS), dtype=str).assign(node=["node1", "node2", "node3"])
    jobs.to_csv(inputs / "jobs.csv", index=False)
    return inputs


def test_site_holds_every_rack_the_site_only_choice_overloads(site_inputs, run_cli):
    flat = run_cli("knobs", *ARGS, "--depth-kw", "0.3", cwd=site_inputs)
    assert flat.returncode == 0, flat.stderr
    power = pd.read_csv(io.StringIO(flat.stdout))["power_w"]
    assert power.iloc[1:].sum() > 2200.0  # r2 over its limit without --site
    r = run_cli(
        "knobs", *ARGS, "--depth-kw", "0.3", "--site", "site.yaml", "-o", "c.csv", cwd=site_inputs
    )
    assert r.returncode == 0, r.stderr
    out = pd.read_csv(site_inputs / "c.csv", dtype={"job": str})
    assert out["power_w"].iloc[1:].sum() <= 2200.0 * (1 + 1e-9)
    assert out["power_w"].iloc[0] <= 2000.0 * (1 + 1e-9)
    assert out["power_w"].sum() <= 3 * 1305.0 - 300.0 + 1e-6  # the event still met
    levels = json.loads((site_inputs / "c.csv.meta.json").read_text())["levels"]
    assert levels["rack:r2"]["limit_w"] == 2200.0
    assert levels["rack:r2"]["load_w"] == pytest.approx(out["power_w"].iloc[1:].sum())
    assert "rack:r2:" in r.stderr and "of its 2200.0 W limit" in r.stderr
    assert out["tokens_lost"].sum() > pd.read_csv(io.StringIO(flat.stdout))["tokens_lost"].sum()


@pytest.mark.parametrize(
    "change, expected",
    [
        ("nope.yaml", "site file nope.yaml: no such file"),
        ("bad.yaml", "site file bad.yaml: "),
        ("nonode", "--site needs a node column in --jobs"),
        ("tight", "the lowest power the jobs under rack:r2 reach is 0.800 kW, over its limit"),
    ],
)
def test_a_bad_site_a_missing_node_or_a_rack_below_its_floors_is_one_line(
    site_inputs, run_cli, change, expected
):
    site = change if change.endswith(".yaml") else "site.yaml"
    if change == "bad.yaml":
        (site_inputs / site).write_text("site: dc1\nfeeds: 3\n")
    elif change == "nonode":  # the jobs table without its node column
        pd.read_csv(io.StringIO(JOBS), dtype=str).to_csv(site_inputs / "jobs.csv", index=False)
    elif change == "tight":
        tight = yaml.safe_load(yaml.safe_dump(SITE))
        tight["feeds"][0]["pdus"][0]["racks"][1]["limit_kw"] = 0.7  # 2 x 400 W caps' floor
        (site_inputs / site).write_text(yaml.safe_dump(tight))
    r = run_cli(
        "knobs", *ARGS, "--depth-kw", "0.3", "--knobs", "cap", "--site", site, cwd=site_inputs
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert expected in r.stderr, r.stderr
