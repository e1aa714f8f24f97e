"""The emulated one-run sweep (wattflex.runs.sweep.emulated): the live run never rewrites what
the controller saw, per-cap rows follow the runs contract, and the one-run PFI (staircase,
adaptive) agrees with the separate runs' PFI."""

import numpy as np
import pandas as pd
import pytest

from wattflex.config import groups, run_spec
from wattflex.pfi import pfi_table
from wattflex.run_ids import run_id
from wattflex.runs.emulator.device import run_emulated
from wattflex.runs.sweep.algorithm import sweep_spec
from wattflex.runs.sweep.emulated import EmulatedRun, run_sweep
from wattflex.runs.sweep.steady import cap_rows
from wattflex.telemetry import SummaryProtocol, summarize_run

GROUP = "moe-pt-gptoss20b-x8-ep8-nocompile"


@pytest.fixture(scope="module")
def spec(default_config):
    return sweep_spec(default_config, GROUP, "staircase")


def test_emulated_run_never_rewrites_what_was_revealed(spec):
    run = EmulatedRun(spec, max_duration_s=900)
    run.device.set_cap(700)
    run.advance(400)
    before_series, before_steps = run.series().copy(), run.steps().copy()
    run.device.set_cap(300)
    run.advance(100)
    after = run.series()
    pd.testing.assert_frame_equal(after[after["t_s"] <= 400].reset_index(drop=True), before_series)
    pd.testing.assert_frame_equal(
        run.steps()[run.steps()["t_end_s"] <= 400].reset_index(drop=True), before_steps
    )
    late = after[after["t_s"] > 420]
    assert late["t_s"].max() == 500 and (late["power_w"] <= 300 * 8 * 1.01).all()
    assert (before_series.loc[before_series["gpu_util"] > 50, "power_w"] > 300 * 8 * 1.05).all()
    run.stop()
    run.device.restore()
    tel, steps, facts = run.artifacts()
    assert tel["t_s"].max() == 500 and facts["limit_restored_w"] == 700
    assert [c["cap_w"] for c in facts["cap_schedule"]] == [700, 300, 700]


def test_cap_rows_follow_the_runs_contract_with_the_mean_aggregate(spec, default_config):
    tel, steps, record = run_sweep(spec)
    rows = cap_rows(tel, steps, record)
    assert sorted(rows) == sorted(record["caps"])
    ref = summarize_run(*run_emulated_cap(default_config, 700)[:2])
    for cap, row in rows.items():
        assert set(ref) <= set(row) and row["aggregate"] == "mean"
        visit = next(v for v in record["visits"] if v["cap_w"] == cap)
        assert row["n_samples_training"] == visit["n_samples"]
        assert row["power_w"] == pytest.approx(visit["power_w"], rel=1e-9)
        assert row["power_per_gpu_w"] <= cap * 1.01
    assert (
        record["limit_restored_w"] == 700
        and record["duration_s"] < 0.25 * len(record["caps"]) * 1800
    )


def run_emulated_cap(cfg, cap):
    return run_emulated(run_spec(cfg, GROUP, run_id(cap, 0)))


def separate_pfi(cfg):
    g = next(g for g in groups(cfg) if g["id"] == GROUP)
    rows = []
    for cap in g["caps"]:
        tel, steps, _ = run_emulated_cap(cfg, cap)
        rows.append({"group": GROUP, "cap_w": cap, **summarize_run(tel, steps, SummaryProtocol())})
    return pfi_table(
        pd.DataFrame(rows),
        throughput_col="tokens_per_s",
        power_sem_col="power_w_sem",
        throughput_sem_col="tokens_per_s_sem",
        mc_samples=2000,
        seed=7,
    ).iloc[0]


def one_run_pfi(cfg, mode):
    tel, steps, record = run_sweep(sweep_spec(cfg, GROUP, mode))
    table = pd.DataFrame(
        [{"group": GROUP, "cap_w": c, **r} for c, r in cap_rows(tel, steps, record).items()]
    )
    return pfi_table(
        table,
        throughput_col="tokens_per_s",
        power_sem_col="power_w_sem",
        throughput_sem_col="tokens_per_s_sem",
        mc_samples=2000,
        seed=7,
    ).iloc[0], record


def test_emulated_staircase_pfi_is_close_to_the_separate_runs_pfi(default_config):
    sep = separate_pfi(default_config)
    one, record = one_run_pfi(default_config, "staircase")
    assert record["stop_reason"] == "all_caps_measured"
    assert all(v["reason"] == "ok" for v in record["visits"])
    assert one["pfi_ratio"] == pytest.approx(sep["pfi_ratio"], rel=0.05)
    half = np.hypot(sep["ci95_high"] - sep["ci95_low"], one["ci95_high"] - one["ci95_low"]) / 2
    assert (
        abs(one["pfi_ratio"] - sep["pfi_ratio"]) <= half
    )  # two noisy estimates agree within their CIs


def test_adaptive_spends_its_budget_where_the_pfi_is_uncertain(default_config):
    cfg = {
        **default_config,
        "staircase": {"target_ci_rel": 0.005, "budget_fraction": 0.1, "mc_samples": 500},
    }
    one, record = one_run_pfi(cfg, "adaptive")
    caps = record["caps"]
    assert len(record["visits"]) > len(caps)  # it revisited
    assert sorted({v["cap_w"] for v in record["visits"]}) == caps  # every cap measured
    halves = [h["ci_half_rel"] for h in record["history"]]
    assert halves[-1] < halves[0]
    assert record["stop_reason"] in ("ci_target_met", "budget_spent")
    if record["stop_reason"] == "ci_target_met":
        assert halves[-1] <= 0.005
    # revisits favour the caps whose terms divide by small throughput losses, not the deepest cap
    revisits = pd.Series([v["cap_w"] for v in record["visits"][len(caps) :]]).value_counts()
    assert revisits.index[0] != min(caps)
    assert record["limit_restored_w"] == 700


def test_run_sweep_refuses_an_unknown_backend_with_a_clear_message(spec):
    # (the cuda backend: tests/unit/runs/sweep/test_sweep_real.py)
    with pytest.raises(ValueError, match="unknown backend 'rocm'"):
        run_sweep({**spec, "backend": "rocm"})
    with pytest.raises(ValueError, match="wattflex.runs.sweep.real"):
        run_sweep({**spec, "backend": "cuda"})
