"""The ``fake_nvml`` pytest fixture: FAKE pynvml in ``sys.modules`` with two fake H200s whose
state lives in a file under tmp_path (so subprocesses share it). Import it into a test
module: ``from tests.fakes.nvml_fixture import fake_nvml, limits_w``."""

import sys

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
