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
    t = [5.0, 6.0] + [6.0 + 0.1 * k for k in range(1, 101)]  # one slow first step, then 10 steps/s
    steps = pd.DataFrame({"t_end_s": t, "tokens": [100] * len(t)})
    tps, n = gpu_check.steady_tokens_per_s(steps)
    assert tps == pytest.approx(1000.0) and n > 50
    assert math.isnan(gpu_check.steady_tokens_per_s(steps.head(2))[0])


def test_report_names_and_default_caps(gpu_check):
    assert gpu_check.gpu_slug("NVIDIA H200") == "h200"
    assert (
        gpu_check.gpu_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
        and gpu_check.gpu_slug(None) == "no-gpu"
    )

    class Gpu:
        def constraints(self):
            return 200.0, 700.0

    assert gpu_check.default_caps(Gpu()) == [200.0, 300.0, 400.0, 500.0, 600.0, 700.0]


# h) on the CPU: a saved tiny gpt-oss (bf16, not MXFP4: no real gpt-oss checkpoint here); the
# MXFP4 path itself is unproven until a GPU node runs the step on real weights.
@pytest.mark.conformance  # real torch: ~7 s of CPU (tests/tiers.py)
def test_real_weights_step_loads_and_trains_a_saved_model(gpu_check, tmp_path):
    import argparse

    import torch
    import yaml

    from wattflex.runs.training import models
    from wattflex.runs.training.train_config import TrainConfig

    facts = yaml.safe_load((REPO / "config" / "models.yaml").read_text())["models"]["gpt-oss-20b"]
    cfg = TrainConfig(
        model_facts=facts,
        tiny=True,
        device="cpu",
        compile=False,
        grad_checkpointing=False,
        outdir=str(tmp_path),
    )
    models.build_model(cfg, torch.bfloat16).save_pretrained(tmp_path / "model")
    out = gpu_check.real_weights(
        argparse.Namespace(model_path=str(tmp_path / "model"), device="cpu")
    )
    assert out.get("ok", True), out
    assert out["mxfp4_checkpoint"] is False and out["expert_dtypes"] == ["torch.bfloat16"]
    assert out["expert_lora_params_with_grad"] > 0 and out["loss"] > 0
    assert gpu_check.real_weights(argparse.Namespace(model_path=None, device="cpu")) == {
        "skipped": "no --model-path given"
    }


# i) NCCL's own INFO lines, from its format strings (NVIDIA/nccl src/init.cc "Using network %s";
# src/transport/net.cc at 022c022aadf39e370f14668935069c35863ff525, sendSetup/recvSetup:
# "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s%s"; p2p.cc "... via P2P/%s%s%s"),
# each behind NCCL's "host:pid:tid [dev] NCCL INFO " prefix (src/debug.cc).
def _nccl(msg: str) -> str:
    return f"node1:4242:4250 [0] NCCL INFO {msg}"


def test_nccl_transport_parsed_from_its_info_lines(gpu_check):
    ib = "\n".join(
        [
            _nccl("Using network IB"),
            _nccl("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"),
            _nccl("Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA"),
            _nccl("Channel 01/0 : 0[0] -> 8[0] [send] via NET/IB/1(1)/GDRDMA"),
        ]
    )
    assert gpu_check.nccl_transports(ib) == {
        "networks": ["IB"],
        "channel_transports": ["NET/IB", "P2P"],
        "channels": 3,
        "gdrdma": True,
        "transport": "NET/IB",
    }
    sock = "\n".join(
        [
            _nccl("Using network Socket"),
            _nccl("Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0"),
        ]
    )
    got = gpu_check.nccl_transports(sock)
    assert (
        got["transport"] == "NET/Socket"
        and got["gdrdma"] is False
        and got["networks"] == ["Socket"]
    )
    one_node = _nccl(
        "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"
    )  # NVLink only: nothing crossed a network
    assert gpu_check.nccl_transports(one_node)["transport"] is None


# j) on the CPU: the tiny Llama the harness builds, with a graph break put into its MLP (so the
# count and the reasons are seen, not just an empty list); compiling is left to the slow test.
@pytest.mark.conformance  # real torch: ~7 s of CPU (tests/tiers.py)
def test_graph_breaks_per_layer_are_counted_with_their_reasons(gpu_check, monkeypatch):
    import time

    import torch
    from transformers.models.llama import modeling_llama

    forward = modeling_llama.LlamaMLP.forward

    def breaking(self, x):
        torch._dynamo.graph_break()
        return forward(self, x)

    name, facts = gpu_check.catalogue_families(["llama"])["llama"]
    clean = gpu_check.layer_graph_breaks(
        "llama", name, facts, "pt", "cpu", "eager", time.monotonic() - 1
    )
    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", breaking)
    out = gpu_check.layer_graph_breaks(
        "llama", name, facts, "pt", "cpu", "eager", time.monotonic() - 1
    )
    assert out["family"] == "llama" and out["task"] == "pt" and len(out["layers"]) == 2
    for before, r in zip(clean["layers"], out["layers"]):
        assert (
            r["class"] == "LlamaDecoderLayer"
            and before["graph_breaks"] == 0
            and before["graphs"] == 1
        )
        assert r["graph_breaks"] > 0 and r["graphs"] == len(r["ops_per_graph"]) > 1
        assert r["break_reasons"] and all(
            isinstance(x, str) and "graph_break" in x for x in r["break_reasons"]
        )
    assert out["layers"][0]["compiled"] == {"skipped": "--compile-budget-s spent"}
    assert out["layers"][1]["compiled"] == {"skipped": "--compile-budget-s spent"}
    with pytest.raises(ValueError, match="catalogue"):
        gpu_check.catalogue_families(["nope"])
