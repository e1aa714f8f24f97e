"""The ``fake_nvml`` pytest fixture: FAKE pynvml in ``sys.modules`` with two fake H200s whose
state lives in a file under tmp_path (so subprocesses share it). Import it into a test
module: ``from tests.fakes.nvml_fixture import fake_nvml, limits_w``."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakes import fake_pynvml


@pytest.fixture
def fake_nvml(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_pynvml.reset(n_gpus=2, path=tmp_path / "gpus.json")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    yield fake_pynvml
    fake_pynvml.reset()


def limits_w() -> list[float]:
    """Current power limits of the fake GPUs in W."""
    return [g["limit_mw"] / 1000 for g in fake_pynvml.state()["gpus"]]


FAKES = Path(fake_pynvml.__file__).resolve().parent
REPO = FAKES.parents[1]


def control_popen(tmp_path, *args):
    """``wattflex control ARGS`` started in its own process on the fake GPUs (their state file shared)."""
    code = (
        f"import sys; sys.path.insert(0, {str(FAKES)!r}); import fake_pynvml; sys.modules['pynvml'] = fake_pynvml; "
        f"from wattflex import cli; sys.exit(cli.main({['control', *args]!r}))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "workflow_scripts"), str(REPO)]),
        "FAKE_PYNVML_STATE": str(tmp_path / "gpus.json"),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def control_process(tmp_path, *args):
    """:func:`control_popen`, returned once the controller has capped the GPUs."""
    proc = control_popen(tmp_path, *args)
    assert proc.stdout.readline().startswith("controlling 2 GPU(s)"), proc.stderr.read()
    deadline = time.time() + 30
    while max(limits_w()) >= 700 and time.time() < deadline:  # wait until the controller has capped
        time.sleep(0.05)
    assert max(limits_w()) < 700
    return proc
