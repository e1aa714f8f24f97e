"""The sweep controller (wattflex.runs.sweep.algorithm): the staircase through a live run
polled on a fake clock, and the original cap restored on every exit path (normal end,
exception, signal, dwell timeout). The GPU is faked only where named (FakeGpu)."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wattflex.runs.sweep.algorithm import restored_on_exit, staircase
from wattflex.runs.sweep.real import PollingRun
from wattflex.runs.sweep.steady import SteadyCriteria

REPO = Path(__file__).resolve().parents[4]


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
            self.rows.append(
                {
                    "t_s": self.t_sample,
                    "power_w": (p if busy else 600.0) * (1 + self.rng.normal(0, 0.003)),
                    "gpu_util": 99.0 if busy else 0.0,
                    "fb_used_gib": 40.0,
                }
            )
        while self.t_step + 2 <= now:
            self.t_step += 2
            _, r = self.expected(self.gpu.limit_w)
            self.step_rows.append(
                {
                    "step": len(self.step_rows) + 1,
                    "t_end_s": self.t_step,
                    "tokens": int(2 * r * (1 + self.rng.normal(0, 0.005))),
                    "loss": 1.0,
                }
            )

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
    run = PollingRun(
        gpu,
        job.series,
        job.steps,
        lambda: stopped.append(clock.now),
        max_duration_s,
        poll_s=5.0,
        t0=0.0,
        clock=lambda: clock.now,
        sleep=clock.sleep,
    )
    return run, stopped


# ---- restore on every exit path ----------------------------------------------------------


def test_staircase_through_the_polling_hook_measures_each_cap_and_restores_fake_gpu():
    gpu, clock = FakeGpu(), FakeClock()
    job = SyntheticJob(gpu, clock)
    run, stopped = polling_run(gpu, clock, job)
    result = staircase(run, [300, 500, 700])
    assert [v.cap_w for v in result.visits] == [
        300,
        500,
        700,
    ] and result.stop_reason == "all_caps_measured"
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
    from wattflex.runs.sweep.algorithm import staircase
    from wattflex.runs.sweep.real import PollingRun

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
    proc = subprocess.Popen(
        [sys.executable, str(script), str(state)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout.readline().split() == [
            "set",
            "300.0",
        ]  # first cap set, now waiting for steady state
        proc.send_signal(getattr(signal, signame))
        rc = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert rc == 128 + getattr(signal, signame)
    assert pd.read_json(state, typ="series").to_dict() == {"limit_w": 700.0, "last": "restore"}


def test_unsettled_job_times_out_at_max_dwell_and_still_restores():
    gpu, clock = FakeGpu(), FakeClock()
    never = lambda: pd.DataFrame(columns=["t_s", "power_w", "gpu_util", "fb_used_gib"])
    no_steps = lambda: pd.DataFrame(columns=["step", "t_end_s", "tokens", "loss"])
    run = PollingRun(
        gpu,
        never,
        no_steps,
        lambda: None,
        3600,
        poll_s=5,
        t0=0,
        clock=lambda: clock.now,
        sleep=clock.sleep,
    )
    result = staircase(run, [400, 700], SteadyCriteria(), max_dwell_s=60)
    assert [v.window.reason for v in result.visits] == ["max_dwell:too_few_samples"] * 2
    assert gpu.limit_w == 700
