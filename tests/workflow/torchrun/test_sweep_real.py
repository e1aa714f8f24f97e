"""The one-run sweep on the cuda backend (wattflex.runs.sweep.real), on CPU: real
torchrun training of a tiny random-init model, steered while it runs, on FAKE NVML GPUs
(tests/fakes/fake_pynvml.py in ``sys.modules["pynvml"]``; NvmlGpu, the sampler, CapGuard and
the controller are the real code). What the fake GPUs do and do not model, and the sweep's
spec: tests/unit/runs/sweep/test_sweep_real.py. These tests check the control flow, not the PFI."""

import os
import signal
import threading
import time

import pytest

from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from tests.unit.runs.sweep.test_sweep_real import CAPS, set_calls_w, sweep_spec, training_processes
from tests.unit.runs.test_real_run import _cmdline_has
from wattflex.provenance import read_json, read_parquet
from wattflex.runs.devices.caps import CapSignal
from wattflex.runs.sweep.real import write_real_sweep_run
from wattflex.telemetry import job_series

pytestmark = pytest.mark.usefixtures("one_thread_subprocesses")  # tiny models: torch on one thread


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["staircase", "adaptive"])
def test_fake_nvml_cuda_sweep_visits_every_cap_stops_training_and_restores(
    fake_nvml, tmp_path, mode
):
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

    assert sorted(p.name for p in out.iterdir()) == [
        "run.json",
        "steps.parquet",
        "telemetry.parquet",
        "train.log",
    ]
    run = read_json(out / "run.json")
    assert run["backend"] == "cuda" and run["sweep_mode"] == mode and run["cap_control"] == "nvml"
    assert run["stop_reason"] in (
        {"all_caps_measured"} if mode == "staircase" else {"ci_target_met", "budget_spent"}
    )
    assert [v["cap_w"] for v in run["visits"][:3]] == CAPS
    assert all(v["enforced_limit_w"] == v["cap_w"] for v in run["visits"])
    assert len(run["visits"]) == 3 if mode == "staircase" else len(run["visits"]) >= 3
    assert run["original_limit_w"] == [700.0, 700.0] and run["provenance"]["backend"] == "cuda"

    # Training was stopped when the sweep ended, long before its 90-s limit, and its step log
    # is the one the controller read (the live log is gone, steps.parquet has every step).
    steps = read_parquet(out / "steps.parquet")
    assert run["training"]["steps"] == len(steps) and steps["step"].tolist() == list(
        range(1, len(steps) + 1)
    )
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
        if _cmdline_has(p, "wattflex.runs.training") and not _cmdline_has(
            p, "torch.distributed.run"
        ):
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
                _kill_training_worker(out.parent) if how == "training_killed" else os.kill(
                    os.getpid(), signal.SIGTERM
                )
                return
            time.sleep(0.05)

    striker = threading.Thread(target=strike, daemon=True)
    striker.start()
    expected = (
        (RuntimeError, "training exited with status")
        if how == "training_killed"
        else (CapSignal, None)
    )
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
