"""The one-run sweep on the cuda backend (wattflex.runs.sweep.real), on CPU: its refusals
before any cap, the live step log, GpuSet, and ``sweep_spec``. With it
tests/workflow/torchrun/test_sweep_real.py steers real torchrun training of a tiny random-init
model on FAKE NVML GPUs (tests/fakes/fake_pynvml.py in ``sys.modules["pynvml"]``; NvmlGpu, the
sampler, CapGuard and the controller are the real code).

The fake GPUs draw exactly min(demand, cap) with no noise and no settling transient: they do
not respond to caps the way a real GPU does, and the tiny model's throughput does not depend
on them at all. The torchrun tests check the control flow (every cap of the grid set through NVML,
each window measured at its own cap, training stopped, the original limits restored on
every exit path, the run's files written), not the PFI."""

import os
from pathlib import Path

import pandas as pd
import pytest

from tests.fakes import fake_pynvml
from tests.fakes.nvml_fixture import fake_nvml  # noqa: F401 (fixture)
from tests.unit.runs.sweep.test_sweep_algorithm import FakeGpu
from tests.unit.runs.test_real_run import _cmdline_has, cuda_spec
from wattflex.runs.devices.caps import CapConstraintError, CapError
from wattflex.runs.sweep.algorithm import restored_on_exit
from wattflex.runs.sweep.real import GpuSet, read_live_steps, write_real_sweep_run
from wattflex.runs.training.train_config import LIVE_STEPS_FILE, STOP_FILE, TrainConfig
from wattflex.runs.training.trainer import train

CAPS = [300.0, 450.0, 600.0]  # below the fake GPUs' 700 W limit, so the restore is a visible set
# Loose enough for CPU step-time noise: these tests are about control flow, not precision.
CRITERIA = {
    "target_rel_se": 0.5,
    "min_settle_s": 0.3,
    "min_samples": 3,
    "min_steps": 2,
    "max_dwell_s": 8.0,
    "budget_fraction": 0.25,
    "mc_samples": 200,
}  # adaptive: revisits end 22.5 s after start


def sweep_spec(tmp_path, mode="staircase", caps=CAPS, **cuda):
    spec = cuda_spec(
        tmp_path,
        model="Llama-3.1-70B",
        task="pt",
        **{
            "cap_control": "nvml",
            "sampler": True,
            "sampler_period_s": 0.1,
            "max_steps": None,
            **cuda,
        },
    )
    spec["run"].update(duration_s=30.0, eval_at_s=None, checkpoint_at_s=None)  # at most 3 x 30 s
    spec.update(run_id=mode, sweep=mode, caps=list(caps), staircase=dict(CRITERIA), phases={})
    return spec


def set_calls_w():
    return [mw / 1000 for _, mw in fake_pynvml.state()["set_calls"]]


def training_processes(tmp_path):
    return [
        p
        for p in Path("/proc").glob("[0-9]*")
        if _cmdline_has(p, str(tmp_path)) and p.name != str(os.getpid())
    ]


def test_fake_nvml_cuda_sweep_refuses_observe_mode_and_bad_caps_before_any_cap(fake_nvml, tmp_path):
    with pytest.raises(ValueError, match="needs cuda.cap_control nvml or command"):
        write_real_sweep_run(sweep_spec(tmp_path, cap_control="observe"), tmp_path / "a")
    with pytest.raises(CapConstraintError, match="cap 150 W is outside"):
        write_real_sweep_run(sweep_spec(tmp_path, caps=[150, 450, 600]), tmp_path / "b")
    assert set_calls_w() == [] and not list((tmp_path / "state").glob("caps-*.json"))
    assert not training_processes(tmp_path)


@pytest.mark.slow
def test_live_step_log_matches_steps_parquet_and_a_stop_file_ends_training(tmp_path):
    catalog = cuda_spec(tmp_path)["model_facts"]
    cfg = dict(
        model_facts=catalog,
        task="pt",
        seq_len=16,
        batch=2,
        device="cpu",
        tiny=True,
        duration_s=60,
        compile=False,
        grad_checkpointing=False,
        eval_at_s=None,
        checkpoint_at_s=None,
    )
    (tmp_path / "a").mkdir()
    steps = train(TrainConfig(**cfg, max_steps=4, outdir=str(tmp_path / "a")))
    live = read_live_steps(tmp_path / "a" / LIVE_STEPS_FILE)
    pd.testing.assert_frame_equal(
        live, steps[["step", "t_end_s", "tokens", "loss"]], check_dtype=False
    )
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / STOP_FILE).touch()  # the orchestrator's stop request: one step, then out
    assert len(train(TrainConfig(**cfg, max_steps=50, outdir=str(tmp_path / "b")))) == 1


def test_read_live_steps_ignores_a_half_written_line(tmp_path):
    path = tmp_path / LIVE_STEPS_FILE
    assert list(read_live_steps(path).columns) == ["step", "t_end_s", "tokens", "loss"]
    path.write_text("step,t_end_s,tokens,loss\n1,2.5,64,5.5\n2,3.")
    assert read_live_steps(path)[["step", "t_end_s"]].values.tolist() == [[1, 2.5]]


def test_gpu_set_caps_every_fake_gpu_and_restores_all_even_when_one_fails():
    class Stuck(FakeGpu):
        def restore(self):
            raise RuntimeError("NVML: insufficient permissions")

    gpus = [FakeGpu(), Stuck(), FakeGpu()]
    with pytest.raises(CapError, match="insufficient permissions"):
        with restored_on_exit(GpuSet(gpus)) as device:
            assert device.set_cap(400) == 400
    assert [g.limit_w for g in gpus] == [700, 400, 700]
