"""The in-run staircase: restore on every exit path, the emulated live run, the polling hook,
and the one-run PFI against separate runs. The GPU is faked only where named (FakeGpu)."""
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wattflex.config import groups, run_id, run_spec
from wattflex.analysis.pfi import pfi_table
from wattflex.runs.sweep.staircase import (
    EmulatedRun,
    PollingRun,
    restored_on_exit,
    run_sweep,
    staircase,
    sweep_spec,
)
from wattflex.runs.sweep.steady import SteadyCriteria, cap_rows
from wattflex.telemetry import SummaryProtocol, summarize_run

REPO = Path(__file__).resolve().parents[3]
GROUP = "moe-pt-gptoss20b-x8-ep8-nocompile"


class FakeGpu:
    """Fake GPU power-limit interface (stands in for NVML): remembers every change."""

    def __init__(self, original_w=700.0, lo=200.0, hi=700.0):
        self.original_limit_w, self.lo, self.hi = original_w, lo, hi
        self.limit_w = original_w
        self.history = []

    def set_cap(self, cap_w):
        if not self.lo <= cap_w <= self.hi:
            raise ValueError(f"cap {cap_w} outside {self.lo}-{self.hi}")
        self.limit_w = float(cap_w)
        self.history.append(self.limit_w)
        return self.limit_w

    def restore(self):
        self.limit_w = self.original_limit_w
        self.history.append(("restore", self.limit_w))


class SyntheticJob:
    """A training job read while it runs (for PollingRun): 8 GPUs drawing min(cap, 560) W
    each, tokens/s falling with the cap, 5-s samples and 2-s steps, on a fake clock."""

    def __init__(self, gpu, clock, seed=0, fail_after_caps=None):
        self.gpu, self.clock, self.rng = gpu, clock, np.random.default_rng(seed)
        self.rows, self.step_rows, self.t_sample, self.t_step = [], [], 0.0, 30.0
        self.fail_after_caps = fail_after_caps

    @staticmethod
    def expected(cap):
        return 8 * min(cap, 560.0), 10_000.0 * min(1.0, (cap / 560.0) ** 0.5)

    def _extend(self):
        now = self.clock.now
        while self.t_sample + 5 <= now:
            self.t_sample += 5
            p, _ = self.expected(self.gpu.limit_w)
            busy = self.t_sample > 30
            self.rows.append({"t_s": self.t_sample, "power_w": (p if busy else 600.0) * (1 + self.rng.normal(0, 0.003)),
                              "gpu_util": 99.0 if busy else 0.0, "fb_used_gib": 40.0})
        while self.t_step + 2 <= now:
            self.t_step += 2
            _, r = self.expected(self.gpu.limit_w)
            self.step_rows.append({"step": len(self.step_rows) + 1, "t_end_s": self.t_step,
                                   "tokens": int(2 * r * (1 + self.rng.normal(0, 0.005))), "loss": 1.0})

    def series(self):
        if self.fail_after_caps is not None and len(self.gpu.history) > self.fail_after_caps:
            raise RuntimeError("sampler died")
        self._extend()
        return pd.DataFrame(self.rows, columns=["t_s", "power_w", "gpu_util", "fb_used_gib"])

    def steps(self):
        self._extend()
        return pd.DataFrame(self.step_rows, columns=["step", "t_end_s", "tokens", "loss"])


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def sleep(self, dt):
        self.now += dt


def polling_run(gpu, clock, job, max_duration_s=3600.0):
    stopped = []
    run = PollingRun(gpu, job.series, job.steps, lambda: stopped.append(clock.now), max_duration_s,
                     poll_s=5.0, t0=0.0, clock=lambda: clock.now, sleep=clock.sleep)
    return run, stopped


# ---- restore on every exit path ----------------------------------------------------------

def test_staircase_through_the_polling_hook_measures_each_cap_and_restores_fake_gpu():
    gpu, clock = FakeGpu(), FakeClock()
    job = SyntheticJob(gpu, clock)
    run, stopped = polling_run(gpu, clock, job)
    result = staircase(run, [300, 500, 700])
    assert [v.cap_w for v in result.visits] == [300, 500, 700] and result.stop_reason == "all_caps_measured"
    pts = result.points().set_index("cap_w")
    for cap in (300, 500, 700):
        p, t = SyntheticJob.expected(cap)
        assert pts.loc[cap, "power_w"] == pytest.approx(p, rel=0.005)
        assert pts.loc[cap, "tokens_per_s"] == pytest.approx(t, rel=0.01)
    assert gpu.limit_w == 700 and gpu.history[-1] == ("restore", 700)
    assert stopped == [result.duration_s] and result.duration_s < 600


def test_exception_mid_staircase_restores_fake_gpu_and_propagates():
    gpu, clock = FakeGpu(), FakeClock()
    job = SyntheticJob(gpu, clock, fail_after_caps=2)  # fails once the third cap is set
    run, _ = polling_run(gpu, clock, job)
    with pytest.raises(RuntimeError, match="sampler died"):
        staircase(run, [300, 500, 700])
    assert gpu.history == [300, 500, 700, ("restore", 700)]


def test_restored_on_exit_puts_signal_handlers_back():
    before = signal.getsignal(signal.SIGTERM)
    with restored_on_exit(FakeGpu()):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


CHILD = textwrap.dedent("""
    import json, sys, time
    import pandas as pd
    from wattflex.runs.sweep.staircase import PollingRun, staircase

    state = sys.argv[1]

    class FakeGpu:  # fake NVML: its limit lives in a file the parent reads
        original_limit_w = 700.0
        def _write(self, w, what):
            json.dump({"limit_w": w, "last": what}, open(state, "w"))
            print(what, w, flush=True)
        def set_cap(self, w):
            self._write(w, "set")
            return w
        def restore(self):
            self._write(self.original_limit_w, "restore")

    never = lambda: pd.DataFrame(columns=["t_s", "power_w", "gpu_util", "fb_used_gib"])
    no_steps = lambda: pd.DataFrame(columns=["step", "t_end_s", "tokens", "loss"])
    run = PollingRun(FakeGpu(), never, no_steps, lambda: None, max_duration_s=600, poll_s=0.05)
    staircase(run, [300, 700], max_dwell_s=300)
""")


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_signal_mid_staircase_restores_fake_gpu_in_subprocess(tmp_path, signame):
    script, state = tmp_path / "child.py", tmp_path / "gpu.json"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow_scripts")}
    proc = subprocess.Popen([sys.executable, str(script), str(state)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().split() == ["set", "300.0"]  # first cap set, now waiting for steady state
        proc.send_signal(getattr(signal, signame))
        rc = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert rc == 128 + getattr(signal, signame)
    assert pd.read_json(state, typ="series").to_dict() == {"limit_w": 700.0, "last": "restore"}


# ---- the emulated live run ---------------------------------------------------------------

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
    pd.testing.assert_frame_equal(run.steps()[run.steps()["t_end_s"] <= 400].reset_index(drop=True), before_steps)
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
    assert record["limit_restored_w"] == 700 and record["duration_s"] < 0.25 * len(record["caps"]) * 1800


def run_emulated_cap(cfg, cap):
    from wattflex.runs.devices.emulated import run_emulated

    return run_emulated(run_spec(cfg, GROUP, run_id(cap, 0)))


def separate_pfi(cfg):
    g = next(g for g in groups(cfg) if g["id"] == GROUP)
    rows = []
    for cap in g["caps"]:
        tel, steps, _ = run_emulated_cap(cfg, cap)
        rows.append({"group": GROUP, "cap_w": cap, **summarize_run(tel, steps, SummaryProtocol())})
    return pfi_table(pd.DataFrame(rows), throughput_col="tokens_per_s", power_sem_col="power_w_sem",
                     throughput_sem_col="tokens_per_s_sem", mc_samples=2000, seed=7).iloc[0]


def one_run_pfi(cfg, mode):
    tel, steps, record = run_sweep(sweep_spec(cfg, GROUP, mode))
    table = pd.DataFrame([{"group": GROUP, "cap_w": c, **r} for c, r in cap_rows(tel, steps, record).items()])
    return pfi_table(table, throughput_col="tokens_per_s", power_sem_col="power_w_sem",
                     throughput_sem_col="tokens_per_s_sem", mc_samples=2000, seed=7).iloc[0], record


def test_emulated_staircase_pfi_is_close_to_the_separate_runs_pfi(default_config):
    sep = separate_pfi(default_config)
    one, record = one_run_pfi(default_config, "staircase")
    assert record["stop_reason"] == "all_caps_measured"
    assert all(v["reason"] == "ok" for v in record["visits"])
    assert one["pfi_ratio"] == pytest.approx(sep["pfi_ratio"], rel=0.05)
    half = np.hypot(sep["ci95_high"] - sep["ci95_low"], one["ci95_high"] - one["ci95_low"]) / 2
    assert abs(one["pfi_ratio"] - sep["pfi_ratio"]) <= half  # two noisy estimates agree within their CIs


def test_adaptive_spends_its_budget_where_the_pfi_is_uncertain(default_config):
    cfg = {**default_config, "staircase": {"target_ci_rel": 0.005, "budget_fraction": 0.1, "mc_samples": 500}}
    one, record = one_run_pfi(cfg, "adaptive")
    caps = record["caps"]
    assert len(record["visits"]) > len(caps)                      # it revisited
    assert sorted({v["cap_w"] for v in record["visits"]}) == caps  # every cap measured
    halves = [h["ci_half_rel"] for h in record["history"]]
    assert halves[-1] < halves[0]
    assert record["stop_reason"] in ("ci_target_met", "budget_spent")
    if record["stop_reason"] == "ci_target_met":
        assert halves[-1] <= 0.005
    # revisits favour the caps whose terms divide by small throughput losses, not the deepest cap
    revisits = pd.Series([v["cap_w"] for v in record["visits"][len(caps):]]).value_counts()
    assert revisits.index[0] != min(caps)
    assert record["limit_restored_w"] == 700


def test_run_sweep_refuses_an_unknown_backend_with_a_clear_message(spec):
    # (the cuda backend: tests/unit/runs/test_staircase_cuda.py)
    with pytest.raises(ValueError, match="unknown backend 'rocm'"):
        run_sweep({**spec, "backend": "rocm"})


def test_unsettled_job_times_out_at_max_dwell_and_still_restores():
    gpu, clock = FakeGpu(), FakeClock()
    never = lambda: pd.DataFrame(columns=["t_s", "power_w", "gpu_util", "fb_used_gib"])
    no_steps = lambda: pd.DataFrame(columns=["step", "t_end_s", "tokens", "loss"])
    run = PollingRun(gpu, never, no_steps, lambda: None, 3600, poll_s=5, t0=0, clock=lambda: clock.now,
                     sleep=clock.sleep)
    result = staircase(run, [400, 700], SteadyCriteria(), max_dwell_s=60)
    assert [v.window.reason for v in result.visits] == ["max_dwell:too_few_samples"] * 2
    assert gpu.limit_w == 700


def test_gpu_set_caps_every_fake_gpu_and_restores_all_even_when_one_fails():
    class Stuck(FakeGpu):
        def restore(self):
            raise RuntimeError("NVML: insufficient permissions")

    from wattflex.runs.devices.caps import CapError
    from wattflex.runs.sweep.staircase import GpuSet

    gpus = [FakeGpu(), Stuck(), FakeGpu()]
    with pytest.raises(CapError, match="insufficient permissions"):
        with restored_on_exit(GpuSet(gpus)) as device:
            assert device.set_cap(400) == 400
    assert [g.limit_w for g in gpus] == [700, 400, 700]
