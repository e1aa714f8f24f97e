"""benchmarks/plan_gpu_check.py on CPU: the plumbing (the tiny model trains, the plan of the cut
model is written); the GPU comparison itself needs a GPU (unproven here)."""

import importlib.util
import json

import pytest
import yaml

from tests.conftest import REPO
from wattflex.runs import plan


def load_check():
    spec = importlib.util.spec_from_file_location(
        "plan_gpu_check", REPO / "benchmarks" / "plan_gpu_check.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_model_cut_to_two_layers_keeps_the_full_models_layer_and_vocabulary():
    llama = yaml.safe_load((REPO / "config" / "models.yaml").read_text())["models"]["Llama-3.1-70B"]
    cut = load_check().cut_to_layers(llama, 2)
    emb, layer = 128256 * 8192, (70.6e9 - 2 * 128256 * 8192) / 80
    assert cut["layers"] == 2 and cut["total_params_b"] * 1e9 == pytest.approx(2 * emb + 2 * layer)
    assert plan.shape(cut).layer_dense == pytest.approx(plan.shape(llama).layer_dense)


@pytest.mark.slow
def test_on_cpu_it_trains_the_tiny_model_and_writes_the_plan(tmp_path):
    res = load_check().main(
        [
            "--device",
            "cpu",
            "--steps",
            "2",
            "--seq-len",
            "32",
            "--batch",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert (
        res["steps"] == 2
        and res["peak_allocated_gib"] is None
        and res["measured_over_planned"] is None
    )
    doc = json.loads((tmp_path / "plan_gpu_check_cpu.json").read_text())
    assert doc["planned_gib"]["states"] == pytest.approx(
        res["params_b"] * 1e9 * 8 / 2**30
    )  # bf16: 8 B/param
    assert "n/a (no GPU)" in (tmp_path / "plan_gpu_check_cpu.md").read_text()


@pytest.mark.slow
def test_the_chunked_loss_is_trained_and_planned_alike(tmp_path):
    res = load_check().main(
        [
            "--device",
            "cpu",
            "--steps",
            "2",
            "--seq-len",
            "32",
            "--batch",
            "2",
            "--loss-chunk-tokens",
            "16",
            "--out",
            str(tmp_path),
        ]
    )
    vocab = yaml.safe_load((REPO / "config" / "models.yaml").read_text())["models"][
        "Llama-3.1-70B"
    ]["vocab"]
    assert res["steps"] == 2 and res["loss_chunk_tokens"] == 16
    assert res["planned_gib"]["logits"] == pytest.approx(
        plan.LOGIT_BYTES * 16 * vocab / 2**30
    )  # 16 of 64 tokens
