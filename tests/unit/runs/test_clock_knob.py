"""The emulated SM clock lock: every GPU at the locked clock, the power limit
still holding, and no straggler: at the same job power a lock trains at least as fast as a cap."""

import numpy as np
import pytest

from wattflex.runs.emulator.clock_knob import clock_curve, default_clocks, job_at_clock
from wattflex.runs.emulator.step import gpu_leakages, job_at_caps

from .test_emulator import _job


def test_a_locked_clock_runs_every_gpu_at_it_under_the_limit(default_config):
    job, gpu = _job(default_config, "dense-pt-qwen32b-x8-compile")
    leak = gpu_leakages(3, job.gpus)
    st = job_at_clock(job, gpu, 1005.0, leak)
    assert {g.sm_clock_mhz for g in st.per_gpu} == {1005.0}
    top = job_at_clock(job, gpu, gpu.sm_clock_max_mhz, leak, limit_w=400.0)
    assert (
        max(g.power_w for g in top.per_gpu) <= 400.0 + 1e-9
    )  # the limit lowers the clock below the lock
    with pytest.raises(ValueError, match="below"):
        job_at_clock(job, gpu, 100.0, leak)


def test_at_equal_power_a_clock_lock_beats_a_cap(default_config):
    job, gpu = _job(default_config, "dense-ft-llama70b-x8-compile")
    leak = gpu_leakages(0, job.gpus)  # unequal GPUs: under a cap the leaky one straggles
    clocks, P, T = clock_curve(job, gpu, leak)
    assert (
        list(clocks) == sorted(clocks) and clocks[0] == 390.0
    )  # 20 % of 1980 MHz, on a 15 MHz bin
    assert (np.diff(P) >= 0).all() and (np.diff(T) >= 0).all()
    # lock every GPU at the clock of the slowest one under the cap: the same step, no more power
    for cap in job_at_caps(job, gpu, [200, 300, 400, 500, 600, 700], leak):
        slowest = min(g.sm_clock_mhz for g in cap.per_gpu)
        lock = job_at_clock(job, gpu, slowest, leak)
        assert lock.tokens_per_s == pytest.approx(cap.tokens_per_s, rel=1e-9)
        assert lock.power_w <= cap.power_w + 1e-9
        if (
            len({g.sm_clock_mhz for g in cap.per_gpu}) > 1
        ):  # a straggler: the others waited at a higher clock
            assert lock.power_w < cap.power_w
    assert len(default_clocks(gpu)) == 6
