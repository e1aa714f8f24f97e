"""The one-run sweep on the cuda backend (wattflex.runs.sweep.real), on CPU: real
torchrun training of a tiny random-init model, steered while it runs, on FAKE NVML GPUs
(tests/fakes/fake_pynvml.py in ``sys.modules["pynvml"]``; NvmlGpu, the sampler, CapGuard and
the controller are the real code).

The fake GPUs draw exactly min(demand, cap) with no noise and no settling transient: they do
not respond to caps the way a real GPU does, and the tiny model's throughput does not depend
on them at all. These tests check the control flow (every cap of the grid set through NVML,
each window measured at its own cap, training stopped, the original limits restored on
every exit path, the run's files written), not the PFI."""

import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.fakes import fake_pynvml
from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from tests.unit.runs.test_real_run import _cmdline_has, cuda_spec
from tests.unit.runs.sweep.test_sweep_algorithm import FakeGpu
from wattflex.runs.devices.caps import CapConstraintError, CapError, CapSignal
from wattflex.provenance import read_json, read_parquet
from wattflex.runs.sweep.algorithm import restored_on_exit
from wattflex.runs.sweep.real import GpuSet, read_live_steps, write_real_sweep_run
from wattflex.telemetry import job_series
from wattflex.runs.training.config import TrainConfig
from wattflex.runs.training.loop import train
from wattflex.runs.training.loop import LIVE_STEPS_FILE, STOP_FILE

CAPS = [300.0, 450.0, 600.0]    # below the fake GPUs' 700 W limit, so the restore is a visible set
# Loose enough for CPU step-time noise: these tests are about control flow, not precision.
CRITERIA = {"target_rel_se": 0.5, "min_settle_s": 0.3, "min_samples": 3, "min_steps": 2, "max_dwell_s": 8.0,
            "budget_fraction": 0.25, "mc_samples": 200}   # adaptive: revisits end 22.5 s after start


def sweep_spec(tmp_path, mode="staircase", caps=CAPS, **cuda):
    spec = cuda_spec(tmp_path, model="Llama-3.1-70B", task="pt", **{
        "cap_control": "nvml", "sampler": True, "sampler_period_s": 0.1, "max_steps": None, **cuda})
    spec["run"].update(duration_s=30.0, eval_at_s=None, checkpoint_at_s=None)   # at most 3 x 30 s
    spec.update(run_id=mode, sweep=mode, caps=list(caps), staircase=dict(CRITERIA), phases={})
    return spec


def set_calls_w():
    return [mw / 1000 for _, mw in fake_pynvml.state()["set_calls"]]


def training_processes(tmp_path):
    return [p for p in Path("/proc").glob("[0-9]*") if _cmdline_has(p, str(tmp_path)) and p.name != str(os.getpid())]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["staircase", "adaptive"])
def test_fake_nvml_cuda_sweep_visits_every_cap_stops_training_and_restores(fake_nvml, tmp_path, mode):
    out = tmp_path / mode
    t_start = time.time()
    write_real_sweep_run(sweep_spec(tmp_path, mode), out)
    elapsed = time.time() - t_start

    # Each cap set once on both GPUs (the guard sets the lowest), then the original 700 W back;
    # adaptive: then revisits, each a cap of the grid set on both GPUs.
    calls = set_calls_w()
    assert calls[:6] == [c for cap in CAPS for c in (cap, cap)] and calls[-2:] == [700.0, 700.0]
    assert set(calls[6:-2]) <= set(CAPS) and calls[6:-2:2] == calls[7:-2:2]
    if mode == "staircase":
        assert len(calls) == 8
    assert limits_w() == [700.0, 700.0]
    assert not list((tmp_path / "state").glob("caps-*.json"))
    assert not training_processes(out.parent)

    assert sorted(p.name for p in out.iterdir()) == ["run.json", "steps.parquet", "telemetry.parquet", "train.log"]
    run = read_json(out / "run.json")
    assert run["backend"] == "cuda" and run["sweep_mode"] == mode and run["cap_control"] == "nvml"
    assert run["stop_reason"] in ({"all_caps_measured"} if mode == "staircase" else {"ci_target_met", "budget_spent"})
    assert [v["cap_w"] for v in run["visits"][:3]] == CAPS
    assert all(v["enforced_limit_w"] == v["cap_w"] for v in run["visits"])
    assert len(run["visits"]) == 3 if mode == "staircase" else len(run["visits"]) >= 3
    assert run["original_limit_w"] == [700.0, 700.0] and run["provenance"]["backend"] == "cuda"

    # Training was stopped when the sweep ended, long before its 90-s limit, and its step log
    # is the one the controller read (the live log is gone, steps.parquet has every step).
    steps = read_parquet(out / "steps.parquet")
    assert run["training"]["steps"] == len(steps) and steps["step"].tolist() == list(range(1, len(steps) + 1))
    assert steps["t_end_s"].max() < run["duration_s"] + 10 < 90
    assert elapsed < 60

    # Every window was measured at its own cap: the fake GPUs' job power there is 2 x cap.
    tel = read_parquet(out / "telemetry.parquet")
    assert set(CAPS) <= set(tel["power_limit_w"].unique())
    power = job_series(tel).set_index("t_s")["power_w"]
    for v in run["visits"]:
        assert v["sample_times"] and (power.loc[v["sample_times"]] == 2 * v["cap_w"]).all(), v


def _kill_training_worker(tmp_path):
    """SIGKILL the training worker (as the kernel's OOM killer would); torchrun then fails."""
    for p in training_processes(tmp_path):
        if _cmdline_has(p, "wattflex.runs.training") and not _cmdline_has(p, "torch.distributed.run"):
            os.kill(int(p.name), signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["training_killed", "sigterm"])
def test_fake_nvml_cuda_staircase_restores_after_an_exception_mid_sweep(fake_nvml, tmp_path, how):
    """Once the second cap is set on both GPUs, the training worker dies (torchrun fails and
    the controller raises its error) or the controller's process gets SIGTERM (SLURM's time
    limit: ``caps.CapSignal``, exit status 128 + 15)."""
    out = tmp_path / "staircase"
    done, handler_before = threading.Event(), signal.getsignal(signal.SIGTERM)

    def strike():
        while not done.is_set():
            if set_calls_w().count(CAPS[1]) == 2:
                _kill_training_worker(out.parent) if how == "training_killed" else os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    striker = threading.Thread(target=strike, daemon=True)
    striker.start()
    expected = (RuntimeError, "training exited with status") if how == "training_killed" else (CapSignal, None)
    try:
        with pytest.raises(expected[0], match=expected[1]) as err:
            write_real_sweep_run(sweep_spec(tmp_path), out)
    finally:
        done.set()
        striker.join()
    if how == "sigterm":
        assert err.value.code == 128 + signal.SIGTERM
    assert set_calls_w() == [300.0, 300.0, 450.0, 450.0, 700.0, 700.0]
    assert limits_w() == [700.0, 700.0]
    assert not list((tmp_path / "state").glob("caps-*.json"))
    assert not out.exists() and not training_processes(out.parent)
    assert signal.getsignal(signal.SIGTERM) == handler_before


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
    cfg = dict(model_facts=catalog, task="pt", seq_len=16, batch=2, device="cpu", tiny=True, duration_s=60,
               eval_at_s=None, checkpoint_at_s=None)
    (tmp_path / "a").mkdir()
    steps = train(TrainConfig(**cfg, max_steps=4, outdir=str(tmp_path / "a")))
    live = read_live_steps(tmp_path / "a" / LIVE_STEPS_FILE)
    pd.testing.assert_frame_equal(live, steps[["step", "t_end_s", "tokens", "loss"]], check_dtype=False)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / STOP_FILE).touch()          # the orchestrator's stop request: one step, then out
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
