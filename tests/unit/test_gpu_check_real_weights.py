"""benchmarks/gpu_check.py step h) on the CPU: a locally saved tiny gpt-oss model (bf16, not
MXFP4: no real gpt-oss checkpoint here) loaded the harness's way, LoRA-wrapped and stepped once.
The MXFP4 path itself is unproven until a GPU node runs the step on real weights."""

import argparse
import importlib.util
from pathlib import Path

import pytest
import torch
import yaml

from wattflex.runs.training import TrainConfig, models

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_real_weights_step_loads_and_trains_a_saved_model(gpu_check, tmp_path):
    facts = yaml.safe_load((REPO / "config" / "models.yaml").read_text())["models"]["gpt-oss-20b"]
    cfg = TrainConfig(model_facts=facts, tiny=True, device="cpu", outdir=str(tmp_path))
    models.build_model(cfg, torch.bfloat16).save_pretrained(tmp_path / "model")
    out = gpu_check.real_weights(argparse.Namespace(model_path=str(tmp_path / "model"), device="cpu"))
    assert out.get("ok", True), out
    assert out["mxfp4_checkpoint"] is False and out["expert_dtypes"] == ["torch.bfloat16"]
    assert out["expert_lora_params_with_grad"] > 0 and out["loss"] > 0
    assert gpu_check.real_weights(argparse.Namespace(model_path=None, device="cpu")) == {"skipped": "no --model-path given"}
