"""SM clock locks are always released: ClockGuard, its state files and restore-caps, on FAKE NVML
GPUs (tests/fakes/fake_pynvml.py's FAKE nvmlDeviceSetGpuLockedClocks / ResetGpuLockedClocks)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakes import fake_pynvml
from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from wattflex import cli
from wattflex.runs.devices import caps, clocks
from wattflex.runs.devices.nvml import open_gpus

pytestmark = pytest.mark.fake_gpu
FAKES = Path(fake_pynvml.__file__).resolve().parent
REPO = FAKES.parents[1]


def locks() -> list:
    return [g["locked_mhz"] for g in fake_pynvml.state()["gpus"]]


def test_fake_nvml_clock_guard_locks_then_resets_and_cleans_state(fake_nvml, tmp_path):
    with clocks.ClockGuard(open_gpus(gpm=False), 1200, "nvml", tmp_path) as guard:
        assert locks() == [1200, 1200]
        assert guard.clocks_read == [1200.0, 1200.0]  # the fake reads the lock back
        doc = json.loads(guard.state_path.read_text())
        assert guard.state_path.name.startswith("clocks-") and doc["pid"] == os.getpid()
        assert [g["index"] for g in doc["gpus"]] == [0, 1]
    assert locks() == [None, None]
    assert not list(tmp_path.glob("clocks-*.json"))
    assert fake_nvml.state()["clock_calls"] == [
        [0, 1200, 1200],
        [1, 1200, 1200],
        [0, "reset"],
        [1, "reset"],
    ]
    assert guard.record()["clock_mhz_requested"] == 1200


def test_fake_nvml_clock_lock_lowers_power_and_clock(fake_nvml, tmp_path):
    gpu = open_gpus(gpm=False)[0]
    free = gpu.sample(0.0)
    with clocks.ClockGuard([gpu], 990, "nvml", tmp_path, handle_signals=False):
        locked = gpu.sample(1.0)
    assert locked["sm_clock_mhz"] == 990 < free["sm_clock_mhz"]
    assert locked["power_w"] < free["power_w"]


def test_fake_nvml_clock_guard_resets_on_exception(fake_nvml, tmp_path):
    with pytest.raises(RuntimeError, match="training blew up"):
        with clocks.ClockGuard(open_gpus(gpm=False), 900, "nvml", tmp_path):
            assert locks() == [900, 900]
            raise RuntimeError("training blew up")
    assert locks() == [None, None] and not list(tmp_path.glob("clocks-*.json"))


def test_fake_nvml_clock_guard_refuses_out_of_range_before_touching_any_gpu(fake_nvml, tmp_path):
    for mhz in (300, 2100):  # H200: 345-1980 MHz (wattflex.gpus / NVML max clock)
        with pytest.raises(
            caps.CapConstraintError, match=f"GPU 0 .*{mhz} MHz is outside .*345-1980 MHz"
        ):
            with clocks.ClockGuard(open_gpus(gpm=False), mhz, "nvml", tmp_path):
                pass
    assert fake_nvml.state()["clock_calls"] == [] and not list(tmp_path.glob("clocks-*.json"))


def test_fake_nvml_clock_permission_error_resets_already_locked_gpus(fake_nvml, tmp_path):
    fake_nvml.update_gpu(1, deny_lock=True)
    with pytest.raises(caps.CapPermissionError, match="GPU 1 .*not permitted to lock the SM clock"):
        with clocks.ClockGuard(open_gpus(gpm=False), 1500, "nvml", tmp_path):
            pass
    assert locks() == [None, None]  # GPU 0 was locked, then reset
    assert not list(tmp_path.glob("clocks-*.json"))


def test_fake_nvml_clock_observe_changes_nothing(fake_nvml, tmp_path):
    with clocks.ClockGuard(open_gpus(gpm=False), 1000, "observe", tmp_path) as guard:
        pass
    assert fake_nvml.state()["clock_calls"] == [] and guard.record()["sm_clock_mhz"] == [
        1980.0,
        1980.0,
    ]


def _sleeper(tmp_path, cap_w=300, clock_mhz=1100):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "workflow_scripts"), str(REPO)]),
        "FAKE_PYNVML_STATE": str(tmp_path / "gpus.json"),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(FAKES / "capped_sleeper.py"),
            str(tmp_path / "state"),
            str(cap_w),
            str(clock_mhz),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout.readline().strip() == "CAPPED", proc.stderr.read()
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_fake_nvml_signal_resets_clock_and_cap_in_a_real_process(fake_nvml, tmp_path, sig):
    proc = _sleeper(tmp_path)
    assert locks() == [1100, 1100] and limits_w() == [300.0, 300.0]
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 128 + sig, proc.stderr.read()
    assert locks() == [None, None] and limits_w() == [700.0, 700.0]
    assert not list((tmp_path / "state").glob("*.json"))


def test_fake_nvml_sigkill_leaves_lock_and_restore_caps_resets_it(fake_nvml, tmp_path, capsys):
    proc = _sleeper(tmp_path, cap_w=250, clock_mhz=800)
    proc.kill()
    proc.wait(timeout=30)
    assert locks() == [800, 800] and limits_w() == [250.0, 250.0]  # SIGKILL cannot be caught
    state = tmp_path / "state"
    assert len(list(state.glob("clocks-*.json"))) == 1
    assert cli.main(["restore-caps", "--state-dir", str(state), "--dry-run"]) == 0
    assert capsys.readouterr().out.count("would restore") == 2 and locks() == [800, 800]
    assert cli.main(["restore-caps", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert "restored (GPU 0 clock lock reset, GPU 1 clock lock reset)" in out
    assert "restored (GPU 0 -> 700 W, GPU 1 -> 700 W)" in out
    assert (
        locks() == [None, None] and limits_w() == [700.0, 700.0] and not list(state.glob("*.json"))
    )
    assert cli.main(["restore-caps", "--state-dir", str(state)]) == 0
    assert "nothing to restore" in capsys.readouterr().out


def test_fake_nvml_clock_restore_skips_live_and_damaged_records(fake_nvml, tmp_path):
    with clocks.ClockGuard(open_gpus(gpm=False), 1000, "nvml", tmp_path) as guard:
        res = clocks.restore_clocks_from_state_dir(tmp_path)
        assert [r["action"] for r in res] == ["skipped: its process is still running"]
        assert locks() == [1000, 1000] and guard.state_path.exists()
        assert clocks.restore_clocks_from_state_dir(tmp_path, force=True)[0]["action"] == "restored"
        assert locks() == [None, None]
    bad = tmp_path / f"clocks-{os.uname().nodename}-1.json"
    bad.write_text(json.dumps({"pid": 1, "gpus": [{"index": "zero"}]}))
    assert clocks.restore_clocks_from_state_dir(tmp_path)[0]["action"] == "unreadable"


def test_fake_nvml_cuda_backend_locks_a_clock_runs_gpus_and_not_a_cap_runs(fake_nvml, tmp_path):
    from types import SimpleNamespace

    from wattflex.runs.real_run import clock_guard

    opts = SimpleNamespace(cap_control="nvml", state_dir=tmp_path)
    gpus = open_gpus(gpm=False)
    with clock_guard(1395.0, gpus, opts) as guard:
        assert locks() == [1395, 1395] and guard.record()["clock_control"] == "nvml"
    assert locks() == [None, None]
    with clock_guard(None, gpus, opts) as guard:
        assert guard is None and locks() == [None, None]
    with clock_guard(1395.0, gpus, SimpleNamespace(cap_control="observe", state_dir=tmp_path)):
        assert locks() == [None, None]  # observe: nothing changed


def test_a_clock_hold_follows_its_target_and_leaves_nothing_locked(fake_nvml, tmp_path):
    """ClockHold (a cluster-control agent's lock on the knob menu's clock): each new clock locks,
    None resets, a refused clock leaves nothing locked, close resets and removes the record."""
    hold = clocks.ClockHold(open_gpus(gpm=False), "nvml", tmp_path)
    hold.follow(None)
    assert locks() == [None, None] and not list(tmp_path.glob("clocks-*.json"))
    hold.follow(1200.0)
    assert locks() == [1200, 1200] and len(list(tmp_path.glob("clocks-*.json"))) == 1
    hold.follow(990.0)
    assert locks() == [990, 990] and len(list(tmp_path.glob("clocks-*.json"))) == 1
    hold.follow(None)
    assert locks() == [None, None] and not list(tmp_path.glob("clocks-*.json"))
    hold.follow(1200.0)
    with pytest.raises(caps.CapError, match="outside"):
        hold.follow(5000.0)  # above the part's clocks: refused before anything is locked
    assert locks() == [None, None] and hold.mhz is None
    hold.follow(1200.0)
    hold.close()
    assert locks() == [None, None] and not list(tmp_path.glob("clocks-*.json"))


def test_fake_gpus_read_idle_while_their_user_is_stopped_or_gone(fake_nvml):
    """FAKE: a GPU whose user process (fake_pynvml.claim) is stopped (SIGSTOP, as scontrol
    suspend leaves a job) or gone reads its FAKE idle power through the real NVML reader."""
    user = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fake_nvml.claim([0], user.pid)
        gpus = open_gpus(gpm=False)
        power = lambda: [g.sample(0.0)["power_w"] for g in gpus]  # noqa: E731
        assert power() == [650.0, 650.0]
        os.kill(user.pid, signal.SIGSTOP)
        deadline = time.time() + 10
        while power()[0] != 75.0 and time.time() < deadline:
            time.sleep(0.05)
        assert power() == [75.0, 650.0]
        os.kill(user.pid, signal.SIGCONT)
        while power()[0] != 650.0 and time.time() < deadline:
            time.sleep(0.05)
        assert power() == [650.0, 650.0]
    finally:
        user.kill()
        user.wait()
    assert power() == [75.0, 650.0]
