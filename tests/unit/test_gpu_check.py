"""benchmarks/gpu_check.py's parts on the CPU, loaded as a module (``gpu_check``). The script end
to end, real torchrun training against FAKE NVML GPUs or no NVML at all:
tests/workflow/torchrun/test_gpu_check.py."""

import importlib.util
import math
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_steady_tokens_per_s_drops_the_warm_up(gpu_check):
    t = [5.0, 6.0] + [6.0 + 0.1 * k for k in range(1, 101)]       # one slow first step, then 10 steps/s
    steps = pd.DataFrame({"t_end_s": t, "tokens": [100] * len(t)})
    tps, n = gpu_check.steady_tokens_per_s(steps)
    assert tps == pytest.approx(1000.0) and n > 50
    assert math.isnan(gpu_check.steady_tokens_per_s(steps.head(2))[0])


def test_report_names_and_default_caps(gpu_check):
    assert gpu_check.gpu_slug("NVIDIA H200") == "h200"
    assert gpu_check.gpu_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3" and gpu_check.gpu_slug(None) == "no-gpu"

    class Gpu:
        def constraints(self):
            return 200.0, 700.0
    assert gpu_check.default_caps(Gpu()) == [200.0, 300.0, 400.0, 500.0, 600.0, 700.0]


# h) on the CPU: a saved tiny gpt-oss (bf16, not MXFP4: no real gpt-oss checkpoint here); the
# MXFP4 path itself is unproven until a GPU node runs the step on real weights.
def test_real_weights_step_loads_and_trains_a_saved_model(gpu_check, tmp_path):
    import argparse

    import torch
    import yaml

    from wattflex.runs.training import models
    from wattflex.runs.training.config import TrainConfig

    facts = yaml.safe_load((REPO / "config" / "models.yaml").read_text())["models"]["gpt-oss-20b"]
    cfg = TrainConfig(model_facts=facts, tiny=True, device="cpu", compile=False, grad_checkpointing=False, outdir=str(tmp_path))
    models.build_model(cfg, torch.bfloat16).save_pretrained(tmp_path / "model")
    out = gpu_check.real_weights(argparse.Namespace(model_path=str(tmp_path / "model"), device="cpu"))
    assert out.get("ok", True), out
    assert out["mxfp4_checkpoint"] is False and out["expert_dtypes"] == ["torch.bfloat16"]
    assert out["expert_lora_params_with_grad"] > 0 and out["loss"] > 0
    assert gpu_check.real_weights(argparse.Namespace(model_path=None, device="cpu")) == {"skipped": "no --model-path given"}
