"""Cap control is always undone: CapGuard, state files and restore-caps, on FAKE NVML GPUs
(tests/fakes/fake_pynvml.py, shared between processes through a state file)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import fake_pynvml
from tests.fakes.nvml_fixture import fake_nvml, limits_w  # noqa: F401 (fixture)
from wattflex import cli
from wattflex.gpus import GPUS
from wattflex.runs.devices import caps
from wattflex.runs.devices.nvml import open_gpus
from wattflex.runs.emulator.device import EmulatedDevice

pytestmark = pytest.mark.fake_gpu
FAKES = Path(fake_pynvml.__file__).resolve().parent
REPO = FAKES.parents[1]


def test_fake_nvml_guard_caps_then_restores_and_cleans_state(fake_nvml, tmp_path):
    state_dir = tmp_path / "state"
    with caps.CapGuard(open_gpus(gpm=False), 400, "nvml", state_dir) as guard:
        assert limits_w() == [400.0, 400.0]
        assert guard.enforced_w == [400.0, 400.0]
        doc = json.loads(guard.state_path.read_text())
        assert doc["pid"] == os.getpid() and [g["original_limit_w"] for g in doc["gpus"]] == [
            700.0,
            700.0,
        ]
    assert limits_w() == [700.0, 700.0]
    assert not list(state_dir.glob("*.json"))
    rec = guard.record()
    assert rec["cap_control"] == "nvml" and rec["original_limit_w"] == [700.0, 700.0]


def test_fake_nvml_guard_restores_on_exception(fake_nvml, tmp_path):
    with pytest.raises(RuntimeError, match="training blew up"):
        with caps.CapGuard(open_gpus(gpm=False), 300, "nvml", tmp_path):
            assert limits_w() == [300.0, 300.0]
            raise RuntimeError("training blew up")
    assert limits_w() == [700.0, 700.0]
    assert not list(tmp_path.glob("caps-*.json"))


def test_fake_nvml_guard_refuses_out_of_range_cap_before_touching_any_gpu(fake_nvml, tmp_path):
    fake_nvml.update_gpu(1, min_mw=250_000)
    with pytest.raises(caps.CapConstraintError, match="GPU 1 .*200 W is outside.*250-700 W"):
        with caps.CapGuard(open_gpus(gpm=False), 200, "nvml", tmp_path):
            pass
    assert fake_nvml.state()["set_calls"] == [] and not list(tmp_path.glob("caps-*.json"))


def test_fake_nvml_guard_permission_error_restores_already_capped_gpus(fake_nvml, tmp_path):
    fake_nvml.update_gpu(1, deny_set=True)
    with pytest.raises(
        caps.CapPermissionError, match="GPU 1 .*not permitted.*cap_control: command"
    ):
        with caps.CapGuard(open_gpus(gpm=False), 500, "nvml", tmp_path):
            pass
    assert limits_w() == [700.0, 700.0]  # GPU 0 was capped, then put back
    assert fake_nvml.state()["set_calls"] == [[0, 500_000], [0, 700_000]]
    assert not list(tmp_path.glob("caps-*.json"))


def test_fake_nvml_observe_mode_changes_nothing_and_records_limits(fake_nvml, tmp_path):
    fake_nvml.reset(n_gpus=2, path=tmp_path / "gpus.json", allow_set=False)
    fake_nvml.update_gpu(0, limit_mw=450_000)
    with caps.CapGuard(open_gpus(gpm=False), 300, "observe", tmp_path) as guard:
        pass
    assert guard.record()["enforced_limit_w"] == [450.0, 700.0]
    assert fake_nvml.state()["set_calls"] == [] and not list(tmp_path.glob("caps-*.json"))


def test_fake_nvml_command_mode_runs_the_admin_command(fake_nvml, tmp_path):
    template = f"{sys.executable} {FAKES / 'fake_setcap.py'} {{gpu}} {{watts}}"
    setter = caps.limit_setter("command", template)
    fake_nvml.reset(
        n_gpus=2, path=tmp_path / "gpus.json", allow_set=False
    )  # NVML itself may not set
    with caps.CapGuard(open_gpus(set_limit=setter, gpm=False), 350, "command", tmp_path, template):
        assert limits_w() == [350.0, 350.0]
    assert limits_w() == [700.0, 700.0]


def test_command_setter_failure_and_bad_template_are_clear():
    with pytest.raises(ValueError, match="must contain \\{gpu\\} and \\{watts\\}"):
        caps.command_setter("sudo setcap {gpu}")
    setter = caps.command_setter(
        f"{sys.executable} -c \"import sys; sys.exit('denied by policy')\" {{gpu}} {{watts}}"
    )
    with pytest.raises(caps.CapPermissionError, match="exit 1.*denied by policy"):
        setter(0, 300)


def test_guard_works_on_the_emulated_device_too(tmp_path):
    dev = EmulatedDevice(GPUS["H200"])
    with caps.CapGuard([dev], 400, "nvml", tmp_path, handle_signals=False):
        assert dev.enforced_limit_w() == 400
    assert dev.enforced_limit_w() == dev.original_limit_w


def _sleeper(tmp_path, cap_w=300):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "workflow_scripts"), str(REPO)]),
        "FAKE_PYNVML_STATE": str(tmp_path / "gpus.json"),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.Popen(
        [sys.executable, str(FAKES / "capped_sleeper.py"), str(tmp_path / "state"), str(cap_w)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout.readline().strip() == "CAPPED", proc.stderr.read()
    return proc


@pytest.mark.parametrize(
    "sig",
    [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2],
)
def test_fake_nvml_signal_restores_caps_in_a_real_process(fake_nvml, tmp_path, sig):
    proc = _sleeper(tmp_path)
    assert limits_w() == [300.0, 300.0]
    proc.send_signal(sig)
    rc = proc.wait(timeout=30)
    assert rc == 128 + sig, proc.stderr.read()
    assert limits_w() == [700.0, 700.0]
    assert not list((tmp_path / "state").glob("caps-*.json"))


def test_fake_nvml_sigkill_leaves_state_file_and_restore_caps_repairs(fake_nvml, tmp_path, capsys):
    proc = _sleeper(tmp_path, cap_w=250)
    proc.kill()
    proc.wait(timeout=30)
    assert limits_w() == [250.0, 250.0]  # SIGKILL cannot be caught
    files = list((tmp_path / "state").glob("caps-*.json"))
    assert len(files) == 1
    assert cli.main(["restore-caps", "--state-dir", str(tmp_path / "state"), "--dry-run"]) == 0
    assert "would restore" in capsys.readouterr().out and limits_w() == [250.0, 250.0]
    assert cli.main(["restore-caps", "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out
    assert "restored (GPU 0 -> 700 W, GPU 1 -> 700 W)" in out
    assert limits_w() == [700.0, 700.0] and not files[0].exists()
    assert cli.main(["restore-caps", "--state-dir", str(tmp_path / "state")]) == 0
    assert "nothing to restore" in capsys.readouterr().out


def test_fake_nvml_restore_skips_files_of_live_processes(fake_nvml, tmp_path):
    with caps.CapGuard(open_gpus(gpm=False), 400, "nvml", tmp_path) as guard:
        res = caps.restore_from_state_dir(tmp_path)
        assert [r["action"] for r in res] == ["skipped: its process is still running"]
        assert limits_w() == [400.0, 400.0] and guard.state_path.exists()


def test_fake_nvml_failed_restore_keeps_state_file_and_says_so(fake_nvml, tmp_path):
    gpus = open_gpus(gpm=False)
    guard = caps.CapGuard(gpus, 400, "nvml", tmp_path, handle_signals=False)
    guard.__enter__()
    s = fake_nvml.state()
    s["allow_set"] = False
    fake_nvml._save(s)
    with pytest.raises(caps.CapError, match="state file kept.*wattflex restore-caps"):
        guard.restore()
    assert guard.state_path.exists()
    s["allow_set"] = True
    fake_nvml._save(s)
    # the recording process (this one) is alive: only --force restores
    assert caps.restore_from_state_dir(tmp_path, force=True)[0]["action"] == "restored"
    assert limits_w() == [700.0, 700.0]
