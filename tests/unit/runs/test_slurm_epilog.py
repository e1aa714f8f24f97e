"""slurm/epilog.sh: calls `wattflex restore-caps` when cap records exist, and fails (so
SLURM drains the node) when limits could not be restored."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

EPILOG = Path(__file__).resolve().parents[3] / "slurm" / "epilog.sh"


def epilog(tmp_path, wattflex, state_dir):
    env = {
        **os.environ,
        "WATTFLEX": str(wattflex),
        "WATTFLEX_STATE_DIR": str(state_dir),
        "WATTFLEX_EPILOG_LOG": str(tmp_path / "epilog.log"),
        "SLURM_JOB_ID": "42",
    }
    return subprocess.run(
        ["bash", str(EPILOG)], env=env, capture_output=True, text=True, timeout=60
    )


def stub_wattflex(tmp_path, exit_code):
    """A stand-in for the wattflex command that records its arguments (the epilog's boundary)."""
    stub = tmp_path / "wattflex"
    stub.write_text(
        f'#!/bin/bash\necho "$@" >> {tmp_path / "calls"}\necho restored GPU 0\nexit {exit_code}\n'
    )
    stub.chmod(0o755)
    return stub


def test_epilog_without_cap_records_does_nothing_stub_wattflex(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    assert epilog(tmp_path, stub_wattflex(tmp_path, 1), state).returncode == 0
    assert epilog(tmp_path, stub_wattflex(tmp_path, 1), tmp_path / "absent").returncode == 0
    assert not (tmp_path / "calls").exists()


@pytest.mark.parametrize("exit_code", [0, 1])
def test_epilog_runs_restore_caps_and_passes_on_its_failure_stub_wattflex(tmp_path, exit_code):
    state = tmp_path / "state"
    state.mkdir()
    (state / "caps-node1-123.json").write_text("{}")
    proc = epilog(tmp_path, stub_wattflex(tmp_path, exit_code), state)
    assert proc.returncode == exit_code  # non-zero drains the node
    assert (tmp_path / "calls").read_text().split() == ["restore-caps", "--state-dir", str(state)]
    assert (
        f"job 42: restore-caps (exit {exit_code}): restored GPU 0"
        in (tmp_path / "epilog.log").read_text()
    )


def test_epilog_drains_when_records_exist_but_wattflex_is_missing(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "caps-node1-123.json").write_text("{}")
    assert epilog(tmp_path, tmp_path / "no-such-wattflex", state).returncode == 1
    assert "no wattflex command" in (tmp_path / "epilog.log").read_text()


def test_epilog_arguments_are_the_real_restore_caps_interface(tmp_path):
    wattflex = shutil.which("wattflex")
    if wattflex is None:
        pytest.skip("wattflex command not on PATH")
    state = tmp_path / "state"
    state.mkdir()
    (state / "not-a-cap-record.txt").write_text("")
    proc = epilog(tmp_path, wattflex, state)
    assert proc.returncode == 0, proc.stderr
    assert "nothing to restore" in (tmp_path / "epilog.log").read_text()
