"""Each mechanism the emulator's docstring claims, checked on the default campaign's jobs."""

import dataclasses

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from transformers import AutoModelForCausalLM

from wattflex.config import groups
from wattflex.gpus import GPUS
from wattflex.pfi import pfi_ratio
from wattflex.runs.emulator.physics import PHYSICS
from wattflex.runs.emulator.step import (
    JobSpec,
    attention_impl,
    job_at_cap,
    lora_linear_dims,
    operating_points,
    step_kernels,
)
from wattflex.runs.training import models

F_MAX = np.array([1980.0])


def _job(cfg, gid, **changes):
    g = next(g for g in groups(cfg) if g["id"] == gid)
    job = JobSpec.from_config(g, cfg["_catalog"][g["model"]])
    return dataclasses.replace(job, **changes), GPUS[g["gpu"]]


def _pfi(job, gpu, caps=(200, 300, 400, 500, 600, 700)):
    st = [job_at_cap(job, gpu, c, np.ones(1)) for c in caps]
    return pfi_ratio([s.power_w for s in st], [s.tokens_per_s for s in st])


def _bytes(job, gpu):
    return sum(k.dram_bytes for k in step_kernels(job, gpu))


def test_catalog_attention_is_what_transformers_gives_the_harness(default_config):
    cat = default_config["_catalog"]
    assert attention_impl(cat["gpt-oss-20b"], "lora") == "eager"
    assert attention_impl(cat["gpt-oss-20b"], "pt") == "flex_attention"
    assert attention_impl(cat["Qwen3-30B-A3B"], "lora") == "sdpa"
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssPreTrainedModel

    # no SDPA for gpt_oss: without attn_implementation transformers falls back to eager
    assert GptOssPreTrainedModel._supports_sdpa is False
    assert GptOssPreTrainedModel._supports_flex_attn is True
    assert transformers.__version__.split(".")[0] == "5"


def test_eager_attention_with_sinks_makes_gptoss_lora_more_memory_bound_than_flash(default_config):
    eager, gpu = _job(default_config, "moe-ft-gptoss20b-x8-seq4096-bs8")
    assert eager.attention == "eager" and eager.attention_sinks
    flash = dataclasses.replace(eager, attention="sdpa")
    e, f = operating_points(eager, gpu, clocks=F_MAX), operating_points(flash, gpu, clocks=F_MAX)
    assert e["dram_active"][0] > 1.5 * f["dram_active"][0]
    assert e["tensor_active"][0] < f["tensor_active"][0]
    assert _pfi(eager, gpu) > _pfi(flash, gpu) + 0.2
    # S^2 traffic: the longer sequence is the more memory-bound (published: 2.67 > 1.79)
    short, _ = _job(default_config, "moe-ft-gptoss20b-x8-seq2048-bs8")
    assert _pfi(eager, gpu) > _pfi(short, gpu)
    # sinks add the cat/slice copies when not compiled
    no_compile = dataclasses.replace(eager, compile=False)
    assert _bytes(no_compile, gpu) > _bytes(
        dataclasses.replace(no_compile, attention_sinks=False), gpu
    )


def test_compile_lowers_elementwise_routing_and_eager_attention_traffic(default_config):
    for gid in (
        "moe-ft-gptoss20b-x8-seq2048-bs8",
        "moe-pt-qwen30ba3b-x8-ep1",
        "dense-pt-qwen32b-x8-compile",
    ):
        job, gpu = _job(default_config, gid)
        compiled, eager = (
            dataclasses.replace(job, compile=True),
            dataclasses.replace(job, compile=False),
        )
        for name in ("elementwise", "routing", "attention_softmax"):
            kc = [k for k in step_kernels(compiled, gpu) if k.name == name]
            ke = [k for k in step_kernels(eager, gpu) if k.name == name]
            if kc:
                assert kc[0].dram_bytes < ke[0].dram_bytes, (gid, name)


def test_expert_parallelism_adds_exposed_all_to_all(default_config):
    ep8, gpu = _job(default_config, "moe-pt-gptoss20b-x8-ep8-compile")
    ep1 = dataclasses.replace(ep8, ep=1)
    names8 = {k.name for k in step_kernels(ep8, gpu)}
    assert "a2a_comm" in names8 and "a2a_comm" not in {k.name for k in step_kernels(ep1, gpu)}
    a2a = next(k for k in step_kernels(ep8, gpu) if k.name == "a2a_comm")
    # dispatch + combine in bf16 over forward, recompute and backward
    per_layer_pass = 2 * 2 * ep8.tokens_per_gpu * ep8.experts_active * ep8.hidden * 7 / 8
    assert a2a.comm_s * gpu.nvlink_gb_s * 1e9 == pytest.approx(per_layer_pass * ep8.layers * 3)
    p8 = operating_points(ep8, gpu, clocks=F_MAX)
    # exposed time = step - compute covers at least the whole all-to-all (overlap 0)
    assert p8["step_s"][0] - p8["compute_s"][0] >= a2a.comm_s * (1 - PHYSICS.a2a_overlap) - 1e-12


def test_launch_time_hides_behind_longer_gpu_work_and_shows_when_launch_bound(default_config):
    job, gpu = _job(default_config, "dense-pt-qwen32b-x8-nocompile")
    pts = operating_points(job, gpu, clocks=F_MAX)
    launch = next(k for k in step_kernels(job, gpu) if k.name == "launch")
    assert launch.launch_s < pts["compute_s"][0]
    host_exposed = (
        pts["step_s"][0]
        - pts["compute_s"][0]
        - sum(
            max(0.0, k.comm_s - PHYSICS.fsdp_overlap * pts["compute_s"][0])
            for k in step_kernels(job, gpu)
            if k.comm_s
        )
    )
    assert host_exposed == pytest.approx(PHYSICS.host_base_s)  # launches fully hidden
    # launch-bound: launches longer than the GPU work -> only the excess is exposed
    ph = dataclasses.replace(PHYSICS, launch_s=2e-3)
    tp = operating_points(job, gpu, clocks=F_MAX, physics=ph)
    tl = next(k for k in step_kernels(job, gpu, ph) if k.name == "launch").launch_s
    assert tl > tp["compute_s"][0]
    comm = sum(
        max(0.0, k.comm_s - ph.fsdp_overlap * tp["compute_s"][0])
        for k in step_kernels(job, gpu, ph)
        if k.comm_s
    )
    assert tp["step_s"][0] == pytest.approx(
        tp["compute_s"][0] + comm + ph.host_base_s + (tl - tp["compute_s"][0])
    )


def test_pfi_ordering_follows_the_roofline_clock_independent_share(default_config):
    shares, pfis = [], []
    for g in groups(default_config):
        if g["set"] != "headline":
            continue
        job, gpu = JobSpec.from_config(g, default_config["_catalog"][g["model"]]), GPUS[g["gpu"]]
        t = operating_points(job, gpu, clocks=np.array([990.0, 1980.0]))["step_s"]
        shares.append(1 - (t[0] - t[1]) / t[1])  # t = a + b/f -> a / t(f_max)
        pfis.append(_pfi(job, gpu))
    assert spearmanr(shares, pfis).statistic >= 0.8


def test_perturbed_physics_changes_results_and_default_is_the_module_default(default_config):
    job, gpu = _job(default_config, "moe-ft-qwen30ba3b-x8")
    base = operating_points(job, gpu, clocks=F_MAX)
    same = operating_points(job, gpu, clocks=F_MAX, physics=PHYSICS)
    assert np.array_equal(base["step_s"], same["step_s"])
    slower = operating_points(
        job, gpu, clocks=F_MAX, physics=dataclasses.replace(PHYSICS, hbm_efficiency=0.6)
    )
    assert slower["step_s"][0] > base["step_s"][0]


def test_lora_on_fused_experts_adds_their_weight_gradient_pass_and_the_fold(default_config):
    """peft's target_parameters LoRA makes W' = W + B A trainable through its factors: the backward
    computes the experts' full weight gradient (3 expert-GEMM passes + the recompute, as in full
    training, not 2 + 1), and each forward folds the adapters into every local expert (baddbmm)."""
    job, gpu = _job(default_config, "moe-ft-qwen30ba3b-x8")
    k = {x.name: x for x in step_kernels(job, gpu)}
    tok, n_expert = job.tokens_per_gpu, job.expert_params_b * 1e9
    active = n_expert * job.experts_active / job.experts
    assert k["expert_gemm"].tensor_flops == pytest.approx(
        2 * active * tok * 4
    )  # fwd, recompute, dX, dW
    # read W + write W' per forward (2 with the recompute), write dW' + read it twice: 14 B per expert weight
    assert k["lora_expert_fold"].dram_bytes == pytest.approx(n_expert * 14)
    pt, _ = _job(default_config, "moe-pt-qwen30ba3b-x8-ep1")
    assert "lora_expert_fold" not in {
        x.name for x in step_kernels(pt, gpu)
    }  # full training: no adapters
    dense, dgpu = _job(default_config, "dense-ft-mistral24b-x8")
    assert "lora_expert_fold" not in {x.name for x in step_kernels(dense, dgpu)}  # no experts


def test_a_pipeline_stage_runs_its_share_of_the_layers_and_idles_in_the_bubble(default_config):
    """pp stages: each GPU runs layers / pp over all of its replica's tokens, idles (pp - 1) / m of
    its busy time at barrier power (1F1B / GPipe bubble), and the job trains on dp = gpus / pp
    replicas' tokens; pp 1 is the data-parallel step unchanged."""
    from wattflex.runs.emulator.step import pipeline_bubble, pipeline_stage

    job, gpu = _job(default_config, "dense-pt-qwen32b-x8-compile")
    assert pipeline_stage(job) is job and pipeline_bubble(job) == 0.0
    piped = dataclasses.replace(job, pp=4, microbatches=8)
    stage = pipeline_stage(piped)
    assert (
        stage.layers == job.layers / 4
        and stage.gpus == 2
        and stage.total_params_b == job.total_params_b / 4
    )
    flops = {k.name: k.tensor_flops for k in step_kernels(job, gpu)}
    piped_flops = {k.name: k.tensor_flops for k in step_kernels(piped, gpu)}
    assert piped_flops["dense_gemm"] == pytest.approx(flops["dense_gemm"] / 4)
    busy = operating_points(dataclasses.replace(piped, microbatches=10**9), gpu, clocks=F_MAX)
    pts = operating_points(piped, gpu, clocks=F_MAX)
    assert pts["step_s"][0] == pytest.approx(busy["step_s"][0] * (1 + 3 / 8), rel=1e-6)
    energy = pts["power_w"][0] * pts["step_s"][0] - busy["power_w"][0] * busy["step_s"][0]
    assert energy == pytest.approx(
        (gpu.idle_w + PHYSICS.barrier_extra_w) * busy["step_s"][0] * 3 / 8, rel=1e-6
    )
    st = job_at_cap(piped, gpu, 700, np.ones(8))
    assert st.tokens_per_s == pytest.approx(job.tokens_per_gpu * 2 / st.step_s)
    with pytest.raises(ValueError, match="pp 3 must divide gpus 8"):
        step_kernels(dataclasses.replace(job, pp=3), gpu)


@pytest.mark.parametrize("name", ["gpt-oss-20b", "Qwen3-30B-A3B", "Llama-3.1-70B"])
def test_lora_linear_widths_are_those_peft_adapts_in_the_real_model(default_config, name):
    """The per-token LoRA kernel counts the nn.Linear modules the harness adapts in the real
    transformers class (tiny config): q, k, v, o with their GQA widths, and gate, up, down only
    where the layer has a dense MLP; an MoE's routed experts take LoRA as fused parameters."""
    facts = dict(default_config["_catalog"][name])
    hf = models.hf_config(facts, tiny=True)
    model = AutoModelForCausalLM.from_config(hf)
    targets, _ = models.lora_targets(model, facts["hf_model_type"])
    adapted = [
        m
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and ".layers.0." in n and n.split(".")[-1] in targets
    ]
    facts.update(
        hidden=hf.hidden_size,
        heads=hf.num_attention_heads,
        kv_heads=hf.num_key_value_heads,
        head_dim=hf.head_dim,
        intermediate=getattr(hf, "moe_intermediate_size", None) or hf.intermediate_size,
    )
    group = {"model": name, "task": "lora", "gpus": 8, "seq_len": 2048, "batch": 1}
    job = JobSpec.from_config(group, facts)
    assert lora_linear_dims(job) == (
        sum(m.in_features for m in adapted),
        sum(m.out_features for m in adapted),
    )


@pytest.mark.parametrize("gid", ["moe-ft-gptoss20b-x8-seq2048-bs8", "dense-ft-llama70b-x8-compile"])
def test_lora_on_linears_is_memory_bound_at_rank_32(default_config, gid):
    """peft's adapter GEMMs re-read each module's input for a rank-32 product (32 FLOP/B), far
    below the ridge: their time is HBM's and does not follow the assumed lora_gemm_eff."""
    job, gpu = _job(default_config, gid)
    k = next(x for x in step_kernels(job, gpu) if x.name == "lora_gemm")
    top = np.array([1.0])  # f / f_max
    t = k.times(gpu, top, PHYSICS)[0]
    assert t == pytest.approx(k.dram_bytes / (gpu.hbm_tb_s * 1e12 * PHYSICS.hbm_efficiency))
    slow = dataclasses.replace(PHYSICS, lora_gemm_eff=PHYSICS.lora_gemm_eff / 2)
    assert k.times(gpu, top, slow)[0] == pytest.approx(t)
