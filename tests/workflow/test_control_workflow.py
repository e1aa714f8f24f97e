"""The closed-loop control stage through real Snakemake on the tiny campaign with a control
section: one short scenario, every output and figure, budget kept, rerun is a no-op."""

import re

import numpy as np
import pytest
import yaml

from wattflex.provenance import read_csv, read_parquet, read_png_meta

from .conftest import snakemake

CONTROL = {
    "policies": ["equal-weight", "pfi-aware", "online-learning"],
    "cap_step_w": 25,
    "seed": 3,
    "controller": {"period_s": 5, "tolerance": 0.01},
    "cluster": {
        "gpus": 32,
        "mix": "random",
        "mean_interarrival_s": 200,
        "startup_s": 60,
        "duration": {"median_s": 900, "sigma": 0.5, "min_s": 300, "max_s": 3600},
        "checkpoint_every_s": 600,
        "checkpoint_s": 20,
    },
}


def control_config(tmp_path, tiny_config):
    signal = tmp_path / "tiny-cut.csv"
    signal.write_text("time_s,fraction\n0,1\n120,1\n120,0.7\n1080,0.7\n1080,1\n1200,1\n")
    cfg = yaml.safe_load(tiny_config.read_text())
    cfg.update(
        campaign="tiny-control",
        repeats=[],
        control={**CONTROL, "scenarios": {"tiny-cut": {"signal": str(signal), "response_s": 30}}},
    )
    path = tmp_path / "control.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_control_stage_end_to_end(tmp_path, tiny_config):
    config = control_config(tmp_path, tiny_config)
    target = "results/tiny-control/control/summary.csv"
    offer = "results/tiny-control/offer/offer.png"
    plan = snakemake(target, offer, "-n", "--cores", "2", "--configfile", str(config), cwd=tmp_path)
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", plan.stdout, re.M))
    assert (
        jobs["control_truth"] == "1"
        and jobs["simulate_control"] == "1"
        and jobs["control_figures"] == "1"
    )
    assert jobs["offer"] == "1"
    snakemake(target, offer, "--cores", "2", "--configfile", str(config), cwd=tmp_path)
    out = tmp_path / "results" / "tiny-control" / "control"
    summary = read_csv(out / "tiny-cut" / "summary.csv")
    assert list(summary.columns[:5]) == [
        "policy",
        "worst_overshoot_w",
        "seconds_above_budget",
        "tokens",
        "tokens_vs_oracle",
    ]
    assert list(summary["policy"]) == CONTROL["policies"] + ["oracle", "uncapped"]
    ctl = summary[summary["kind"] == "controller"]
    assert (ctl["worst_overshoot_frac"] <= 0.01).all() and (ctl["tokens_vs_oracle"] <= 1.002).all()
    assert summary.set_index("policy").loc["uncapped", "seconds_above_budget"] > 500
    combined = read_csv(out / "summary.csv")
    assert set(combined["scenario"]) == {"tiny-cut"} and len(combined) == len(summary)
    ts = read_parquet(out / "tiny-cut" / "timeseries.parquet")
    assert len(ts) == 1200 and np.isfinite(ts["budget_w"]).sum() == 960
    # M&V of the event for every controller and the oracle: within tolerance after the response time
    mv = read_csv(out / "mv.csv").set_index("policy")
    assert list(mv.index) == CONTROL["policies"] + ["oracle"] and set(mv["scenario"]) == {
        "tiny-cut"
    }
    assert (
        (mv["event_id"] == "event1").all()
        and (mv["start_s"] == 120).all()
        and (mv["deadline_s"] == 30).all()
    )
    assert (mv["worst_w_above_target_after_deadline"] <= 0.01 * mv["target_w"]).all() and mv[
        "deadline_met"
    ].all()
    assert (mv["delivered_w_vs_pre_event"] > 0).all() and mv.loc[
        "oracle", "throughput_lost_vs_oracle"
    ] == 0
    assert len(read_csv(out / "tiny-cut" / "mv_intervals.csv")) >= 16
    offer_table = read_csv(tmp_path / "results" / "tiny-control" / "offer" / "offer.csv")
    total = offer_table[offer_table["job"] == "TOTAL"]
    assert (
        list(total["max_throughput_loss"]) == [0.1, 0.25, 0.5]
        and total["shed_kw"].is_monotonic_increasing
    )
    assert (
        read_png_meta(tmp_path / "results" / "tiny-control" / "offer" / "offer.png")["provenance"][
            "backend"
        ]
        == "emulated"
    )
    for png in ("power_vs_budget", "tokens_lost", "mv"):
        path = out / "tiny-cut" / f"{png}.png"
        assert path.stat().st_size > 10_000
        assert read_png_meta(path)["provenance"]["backend"] == "emulated"
    again = snakemake(target, "-n", "--cores", "2", "--configfile", str(config), cwd=tmp_path)
    assert "Nothing to be done" in again.stdout + again.stderr
