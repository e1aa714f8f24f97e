"""The resource plan (wattflex.runs.plan) against hand-computed cases, and its refusal."""

import copy

import pytest
import yaml

from wattflex.config import REPO_ROOT, groups, load_config, prepare
from wattflex.errors import ConfigError
from wattflex.runs import plan
from wattflex.runs.campaign_checks import check_inputs
from wattflex.runs.emulator.physics import PHYSICS

CATALOG = yaml.safe_load((REPO_ROOT / "config" / "models.yaml").read_text())["models"]
LLAMA, GPTOSS, QWEN_MOE = CATALOG["Llama-3.1-70B"], CATALOG["gpt-oss-20b"], CATALOG["Qwen3-30B-A3B"]
GIB = 2**30


def group(**kw):
    g = {
        "id": "g",
        "model": "Llama-3.1-70B",
        "task": "pt",
        "gpus": 8,
        "gpu": "H200",
        "seq_len": 2048,
        "batch": 2,
        "ep": 1,
        "compile": True,
        "grad_checkpointing": True,
        "lora_rank": 32,
    }
    return {**g, **kw}


def test_llama70b_pretraining_on_8_h200_at_bf16_mixed_does_not_fit_on_its_states_alone():
    p = plan.plan_group(group(), LLAMA)
    # fp32 master + fp32 grads + 2 fp32 AdamW states = 16 B/param over 8 GPUs: 131.5 GiB
    assert p.states_gib == pytest.approx(70.6e9 * 16 / 8 / GIB)
    assert round(p.states_gib, 1) == 131.5
    assert p.gpu_avail_gib == pytest.approx(141 * 0.95)
    assert not p.fits and p.gpu_need_gib > p.gpu_avail_gib
    assert p.reason.startswith("GPU memory: needs") and "precision bf16-mixed" in p.reason


def test_llama70b_pretraining_fits_with_bf16_states_and_the_parts_add_up():
    p = plan.plan_group(group(precision="bf16"), LLAMA)
    assert p.states_gib == pytest.approx(70.6e9 * 8 / 8 / GIB)  # 2 + 2 + 4 B/param
    # embedding/lm_head (128256 x 8192) are their own units: in forward the lm_head's copy-out
    # after the last layer (its parameters, its all-gather buffer and the layer's buffer, FSDP2
    # keeping each until the next copy-out), in backward the lm_head, its bf16 gradient and the
    # last layer's buffer prefetched: in bf16 the same bytes
    emb = 128256 * 8192
    layer = (70.6e9 - 2 * emb) / 80
    assert emb > layer
    assert p.gathered_gib == pytest.approx((2 * emb + layer) * 2 / GIB)
    # checkpointed layer inputs 2sbh per layer + the larger of the loss (12 B/logit) and a Llama
    # layer's measured 48.5sbh
    s, b, h = 2048, 2, 8192
    assert p.activations_gib == pytest.approx(
        (2 * s * b * h * 80 + max(12 * s * b * 128256, 48.5 * s * b * h)) / GIB
    )
    # the AdamW step's bf16 sqrt(exp_avg_sq) copy of the shard (2 B/param, 16.4 GiB) and the
    # gathered units + activations (16.4 GiB) within 1 %: the need is the larger
    step = 70.6e9 * 2 / 8 / GIB
    assert step == pytest.approx(p.gathered_gib + p.activations_gib, rel=0.01)
    assert p.gpu_need_gib == pytest.approx(
        p.states_gib + max(step, p.gathered_gib + p.activations_gib) + 6.0
    )
    assert p.fits and p.reason == "fits"


def test_lora_llama70b_on_8_fits_with_a_bf16_base_and_fp32_adapters():
    p = plan.plan_group(group(task="lora", seq_len=4096), LLAMA)
    # r x (in + out): q, o 8192<->8192; k, v 8192->1024; gate, up, down 8192<->28672; 80 layers
    adapters = 32 * ((8192 + 8192) * 2 + 2 * (8192 + 1024) + 3 * (8192 + 28672)) * 80
    assert plan.lora_params(LLAMA, 32) == adapters == 414_187_520
    assert p.states_gib == pytest.approx((70.6e9 * 2 + adapters * 16) / 8 / GIB)
    assert p.fits
    # the harness's checkpoint: frozen bf16 base + fp32 adapters + 2 fp32 states
    assert p.checkpoint_gb == pytest.approx((70.6e9 * 2 + adapters * 12) / 1e9)


def test_gemma4_adapters_are_peft_s_on_the_real_class_and_its_tied_embedding_is_gathered_once():
    """Gemma-4's layers are not alike (sliding-window: head_dim 256, 8 kv heads; every 6th full
    attention: 512, 2 kv heads, no v_proj) and run a dense MLP beside the experts: the plan's
    adapter count is what peft adds to transformers' Gemma4ForCausalLM at the catalogue's
    geometry (on the meta device). Its tied embedding and head are one weight in the FSDP root."""
    import torch
    from transformers import AutoModelForCausalLM

    from wattflex.runs.training import models
    from wattflex.runs.training.train_config import TrainConfig

    gemma = CATALOG["Gemma-4-26B-A4B"]
    cfg = TrainConfig(
        model_facts=gemma,
        task="lora",
        lora_rank=8,
        device="cpu",
        compile=False,
        grad_checkpointing=False,
    )
    with torch.device("meta"):
        model = models.apply_lora(AutoModelForCausalLM.from_config(models.hf_config(gemma)), cfg)
    adapters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert plan.lora_params(gemma, 8) == adapters
    sh = plan.shape(gemma)
    assert sh.tied and sh.params == pytest.approx(
        sh.embedding + 30 * (sh.layer_dense + sh.layer_expert)
    )
    own = plan.gpu_bytes(
        {**gemma, "tie_word_embeddings": False}, "pt", 8, 1, "bf16-mixed", 4096, 1, True, 0, "sdpa"
    )
    tied = plan.gpu_bytes(gemma, "pt", 8, 1, "bf16-mixed", 4096, 1, True, 0, "sdpa")
    assert (
        tied["gathered"] > own["gathered"]
    )  # the embedding gathered all step, not a unit at a time


def test_gpt_oss_pretraining_ep8_gathers_one_eighth_of_a_layers_experts():
    ep1 = plan.plan_group(group(model="gpt-oss-20b", seq_len=4096, ep=1), GPTOSS)
    ep8 = plan.plan_group(group(model="gpt-oss-20b", seq_len=4096, ep=8), GPTOSS)
    assert ep1.states_gib == ep8.states_gib == pytest.approx(20.9e9 * 16 / 8 / GIB)
    emb, experts = 201088 * 2880, 19.1e9 / 24
    dense = (20.9e9 - 19.1e9 - 2 * emb) / 24
    # ep 1: a whole layer is the largest unit (in backward: its bf16 parameters and 6-B bf16/fp32
    # gradient, the next layer's bf16 buffer); ep 8: a rank gathers 1/8 of a layer's experts, and
    # the embedding becomes the largest unit
    assert ep1.gathered_gib == pytest.approx((dense + experts) * (2 + 6 + 2) / GIB)
    assert ep8.gathered_gib == pytest.approx(((emb + dense + experts / 8) * 2 + emb * 6) / GIB)
    assert ep8.gathered_gib < ep1.gathered_gib
    assert ep1.fits and ep8.fits and ep8.attention == "flex_attention"


def test_activations_use_the_familys_measured_factors_and_eager_scores():
    s, b, h, a, L = 4096, 8, 2880, 64, 24
    pt = plan.activation_bytes(GPTOSS, s, b, False, "flex_attention", task="pt")
    assert pt["layers"] == pytest.approx(
        s * b * h * 103.7 * L
    )  # gpt-oss pt: 103.7 sbh, no s^2 term
    # gpt-oss LoRA (eager): 106.7 sbh, the measured 2 B per a*s^2*b of scores, and the bf16 merged
    # expert weights peft's target_parameters saves (2 B per routed-expert parameter of the layer)
    eager = plan.activation_bytes(GPTOSS, s, b, False, "eager", task="lora")
    expert_per_layer = 19.1e9 / 24
    assert eager["layers"] == pytest.approx(
        (s * b * h * 106.7 + 2.0 * a * s * s * b + 2.0 * expert_per_layer) * L
    )
    ckpt = plan.activation_bytes(GPTOSS, s, b, True, "eager", task="lora")
    assert ckpt["layers"] == 2 * s * b * h * L and ckpt["working"] == pytest.approx(
        eager["layers"] / L
    )
    # an eager run of a family whose eager scores were not measured: Korthikanti's 5 B
    llama = plan.activation_bytes(LLAMA, 1024, 1, False, "eager", task="pt")
    assert llama["layers"] == pytest.approx((1024 * 8192 * 48.5 + 5 * 64 * 1024 * 1024) * 80)


def test_a_family_without_measured_factors_gets_the_tasks_largest():
    assert plan.activation_factors("qwen2", "pt") == plan.ActivationFactors(
        173.3, None, 0.0
    )  # Gemma-4's
    assert plan.activation_factors("qwen2", "lora") == plan.ActivationFactors(153.6, None, 2.0)


def test_qwen3_moe_pretraining_without_checkpointing_is_refused_on_its_measured_activations():
    # the default config's moe-pt-qwen30ba3b-x8-ep8 (seq 4096, batch 2) without checkpointing
    g = group(model="Qwen3-30B-A3B", seq_len=4096, batch=2, ep=8, grad_checkpointing=False)
    p = plan.plan_group(g, QWEN_MOE)
    # 48 layers x 95 B x 4096 x 2 x 2048 = 71.3 GiB (with the 34 of before: 25.5 GiB, and 104.7 in all: "fits")
    assert p.activations_gib == pytest.approx(
        (95.0 * 4096 * 2 * 2048 * 48 + 12 * 8192 * 151936) / GIB
    )
    assert round(p.gpu_need_gib, 1) == 150.5 and not p.fits
    assert plan.plan_group({**g, "grad_checkpointing": True}, QWEN_MOE).fits
    # gpt-oss LoRA runs eager attention (catalogue): its plan counts the S^2 term
    assert (
        plan.plan_group(
            group(model="gpt-oss-20b", task="lora", seq_len=4096, batch=8), GPTOSS
        ).attention
        == "eager"
    )


def test_host_memory_and_build_time_of_the_old_whole_build_match_issue_23():
    p = plan.plan_group(
        group(precision="bf16-mixed"), LLAMA, {"random_init": True}, checkpoint_at_s=None
    )
    # every rank building 70.6B fp32 params: ~2.26 TB per 8-GPU node, ~55 min at 21M params/s
    assert p.host_whole_build_gb == pytest.approx(8 * 70.6e9 * 4 / 1e9 + 8 * plan.PROCESS_HOST_GB)
    assert plan.build_s(70.6e9, 8, 1, "whole", 2.0) / 60 == pytest.approx(56.0, abs=0.1)
    # meta init: each rank holds its processes' memory only, and initialises its shard
    assert p.weights_path == "meta" and p.host_need_gb == 8 * plan.PROCESS_HOST_GB
    assert p.build_s == pytest.approx(70.6e9 / 8 / (450.7e6 / 2 / 4.0))
    assert p.startup_s == p.build_s + plan.FIRST_STEP_S[True]


def test_real_weights_rank0_broadcast_holds_the_full_state_dict_on_one_node():
    real = {"model_path": "/m", "fs_gb_s": 4.0, "checkpoint_async": False}
    p = plan.plan_group(group(gpus=16, precision="bf16"), LLAMA, real)
    assert (p.weights_path, p.nodes) == ("rank0-broadcast", 2)
    # rank 0 loads the whole model in the training dtype (bf16 here), the bf16 files read at 4 GB/s
    assert p.host_need_gb == pytest.approx(8 * plan.PROCESS_HOST_GB + 70.6e9 * 2 / 1e9)
    assert p.build_s == pytest.approx(70.6e9 * 2 / 1e9 / 4.0)
    small = plan.plan_group(group(gpus=16, precision="bf16"), LLAMA, {**real, "host_mem_gb": 128})
    assert not small.fits and small.reason.startswith("host memory: needs 173 GB")
    # bf16-mixed pretraining loads fp32 master weights: 4 B/param on rank 0's node, with EP too
    ep = plan.plan_group(
        group(model="gpt-oss-20b", ep=8), GPTOSS, {"model_path": "/m"}, checkpoint_at_s=None
    )
    assert ep.weights_path == "rank0-broadcast" and ep.host_need_gb == pytest.approx(
        8 * 4.0 + 20.9e9 * 4 / 1e9
    )
    # transformers' per-rank loader (not used by the harness) would hold each rank's bf16 slice
    assert plan.host_gb_per_node(20.9e9, "pt", "bf16-mixed", 8, 8, "per-rank") == pytest.approx(
        32 + 20.9e9 * 2 / 1e9
    )


def test_an_asynchronous_checkpoint_stages_each_ranks_shard_in_host_memory():
    # 8 ranks on one node stage the whole 6 B/param checkpoint (bf16 weights + bf16 AdamW states)
    p = plan.plan_group(group(precision="bf16"), LLAMA, {"random_init": True})
    assert p.host_need_gb == pytest.approx(8 * plan.PROCESS_HOST_GB + 70.6e9 * 6 / 1e9) and p.fits
    # at bf16-mixed (12 B/param, 847 GB) it outgrows the profile's 512 GB per node
    q = plan.plan_group(group(), LLAMA, {"random_init": True, "host_mem_gb": 512})
    assert (
        "host memory: needs 879 GB on a node (meta weights, checkpoint staging 847 GB)" in q.reason
    )
    # two nodes stage half each; without async_save nothing is staged
    assert plan.plan_group(
        group(gpus=16), LLAMA, {"random_init": True}
    ).host_need_gb == pytest.approx(32 + 847.2 / 2)
    assert (
        plan.plan_group(
            group(), LLAMA, {"random_init": True, "checkpoint_async": False}
        ).host_need_gb
        == 32
    )


def test_checkpoint_size_is_12_bytes_per_param_for_bf16_mixed_pretraining():
    p = plan.plan_group(group(), LLAMA, {"fs_gb_s": 2.0})
    assert p.checkpoint_gb == pytest.approx(
        70.6e9 * 12 / 1e9
    )  # ~847 GB: fp32 weights + 2 AdamW states
    assert p.checkpoint_write_s == pytest.approx(p.checkpoint_gb / 2.0)
    assert plan.plan_group(group(precision="bf16"), LLAMA).checkpoint_gb == pytest.approx(
        70.6e9 * 6 / 1e9
    )


def test_the_run_limit_holds_the_start_up_and_a_checkpoint_outlasting_the_run():
    p = plan.plan_group(group(precision="bf16"), LLAMA, {"model_path": "/m", "fs_gb_s": 0.2})
    assert plan.run_limit_s(p, 1800, 60, None) == p.startup_s + 1800 + 60
    # a 2118-s checkpoint write at 1200 s ends after the 1800-s loop would have
    assert p.checkpoint_write_s > 600
    assert plan.run_limit_s(p, 1800, 60, 1200) == pytest.approx(
        p.startup_s + 1200 + p.checkpoint_write_s + 60
    )


def test_unknown_precision_is_named():
    with pytest.raises(ValueError, match="precision 'fp8': expected one of bf16-mixed, bf16, fp32"):
        plan.gpu_bytes(LLAMA, "pt", 8, 1, "fp8", 2048, 2, True, 0, "sdpa")


def test_constants_shared_with_the_emulator_agree():
    assert plan.HBM_USABLE == PHYSICS.hbm_usable and plan.FRAMEWORK_GIB == PHYSICS.framework_gib
    assert plan.ACT_BYTES_CKPT_INPUT == PHYSICS.act_bytes_ckpt


def _cuda_campaign(cuda, **g):
    cfg = load_config(REPO_ROOT / "config" / "config.yaml")
    raw = {k: v for k, v in cfg.items() if k != "_catalog"}
    raw = copy.deepcopy(raw)
    raw.update(
        backend="cuda",
        cuda=cuda,
        repeats=[],
        groups=[
            {"id": "dense-pt-llama70b-x1", "model": "Llama-3.1-70B", "task": "pt", "gpus": 1, **g}
        ],
    )
    return raw


def test_llama70b_pretraining_on_one_gpu_is_refused_for_a_real_campaign(tmp_path):
    with pytest.raises(ConfigError) as err:
        check_inputs(
            prepare(_cuda_campaign({"random_init": True, "cap_control": "observe"})), cwd=tmp_path
        )
    msg = str(err.value)
    assert msg.startswith("config error at groups: 1 group(s) cannot fit")
    assert "group dense-pt-llama70b-x1 (Llama-3.1-70B pt on 1 H200): GPU memory: needs" in msg
    assert "133.9 GiB usable" in msg and "\n" not in msg


@pytest.mark.parametrize(
    "cuda", [{"tiny": True}, {"random_init": True, "device": "cpu"}], ids=["tiny", "cpu"]
)
def test_tiny_and_cpu_campaigns_are_never_refused(tmp_path, cuda):
    check_inputs(
        prepare(_cuda_campaign({**cuda, "cap_control": "observe", "sampler": False})), cwd=tmp_path
    )


def test_every_group_of_the_default_config_is_planned_and_the_chosen_layouts_fit():
    cfg = load_config(REPO_ROOT / "config" / "config.yaml")
    plans = {p.group: p for p in plan.plan_campaign(cfg, groups(cfg))}
    assert list(plans) == [g["id"] for g in groups(cfg)]
    for gid in ("dense-pt-llama70b-x8-compile", "dense-pt-llama70b-x8-nocompile"):
        p = plans[gid]
        assert p.precision == "bf16" and p.fits, gid
        g = next(g for g in groups(cfg) if g["id"] == gid)
        assert not plan.plan_group(
            {**g, "precision": "bf16-mixed"}, cfg["_catalog"][g["model"]]
        ).fits, gid
    # with the chunked loss every group fits; the four at 65536 tokens per GPU did not without it
    assert [p.group for p in plans.values() if not p.fits] == []
    big = [gid for gid, p in plans.items() if p.seq_len * p.batch == 65536]
    assert sorted(big) == sorted(
        [
            "dense-pt-qwen32b-x32-seq8192-bs8",
            "moe-ft-qwen30ba3b-x8",
            "moe-ft-qwen30ba3b-x16",
            "h100-moe-ft-qwen30ba3b-x8",
        ]
    )
    unchunked = {**cfg, "cuda": {**(cfg.get("cuda") or {}), "loss_chunk_tokens": 0}}
    for p in plan.plan_campaign(unchunked, [g for g in groups(cfg) if g["id"] in big]):
        assert not p.fits and p.logits_gib > p.gpu_avail_gib / 2, p.group


def test_the_docs_plan_table_and_refusal_are_the_codes():
    page = (REPO_ROOT / "docs" / "resource-plan.md").read_text()
    block = page.split("<!-- resource-plan -->\n", 1)[1].split("\n<!-- /resource-plan -->", 1)[0]
    cfg = load_config(REPO_ROOT / "config" / "config.yaml")
    assert block == plan.markdown([p.row() for p in plan.plan_campaign(cfg, groups(cfg))])
    quoted = page.split("the default group settings):\n\n```text\n", 1)[1].split(" ...\n```", 1)[0]
    with pytest.raises(ConfigError) as err:
        check_inputs(prepare(_cuda_campaign({"random_init": True, "cap_control": "observe"})))
    assert str(err.value).startswith(quoted)


def test_a_group_without_shape_keys_is_planned_with_the_harness_defaults(tmp_path):
    from wattflex.runs.emulator.step import JobSpec
    from wattflex.runs.training.train_config import TrainConfig

    bare = {"id": "g", "model": "Llama-3.1-70B", "task": "pt", "gpus": 8}
    p = plan.plan_group(bare, LLAMA)
    assert (p.seq_len, p.batch, p.gpu) == (4096, 2, "H200")
    # compile and grad_checkpointing: the one default a group without them gets, in the plan, the
    # harness and the emulator alike (the schema's group default, config/config.yaml's value)
    harness = TrainConfig.from_spec({"group": bare, "model_facts": LLAMA}, tmp_path)
    emulated = JobSpec.from_config(
        {**bare, "seq_len": 4096, "batch": 2}, {**LLAMA, "architecture": "dense"}
    )
    assert p.grad_checkpointing is harness.grad_checkpointing is emulated.grad_checkpointing is True
    assert p.first_step_s == plan.FIRST_STEP_S[True] and harness.compile is emulated.compile is True


def test_the_chunked_loss_counts_one_chunks_logits():
    from wattflex.runs.training.train_config import TrainConfig

    facts = yaml.safe_load((REPO_ROOT / "config" / "models.yaml").read_text())["models"][
        "Qwen3-32B"
    ]
    vocab = float(facts["vocab"])

    def logits(tokens_per_chunk, seq_len=8192, batch=8):
        return plan.activation_bytes(facts, seq_len, batch, False, "sdpa", tokens_per_chunk)[
            "logits"
        ]

    assert logits(8192) == plan.LOGIT_BYTES * 8192 * vocab
    assert logits(0) == plan.LOGIT_BYTES * 65536 * vocab  # off: the whole sequence
    assert (
        logits(8192, seq_len=1024, batch=2) == plan.LOGIT_BYTES * 2048 * vocab
    )  # a chunk is at most the batch
    assert TrainConfig(model_facts={}).loss_chunk_tokens == plan.LOSS_CHUNK_TOKENS


def test_expert_parallel_groups_are_planned_with_the_whole_sequence_loss():
    facts = yaml.safe_load((REPO_ROOT / "config" / "models.yaml").read_text())["models"][
        "Qwen3-30B-A3B"
    ]
    g = {"id": "g", "model": "Qwen3-30B-A3B", "task": "pt", "gpus": 8, "seq_len": 4096, "batch": 4}
    vocab = float(facts["vocab"])
    assert plan.plan_group({**g, "ep": 8}, facts).logits_gib == pytest.approx(
        plan.LOGIT_BYTES * 16384 * vocab / 2**30
    )
    assert plan.plan_group({**g, "ep": 1}, facts).logits_gib == pytest.approx(
        plan.LOGIT_BYTES * 8192 * vocab / 2**30
    )


def test_the_adamw_steps_temporary_copy_of_the_second_moment_is_planned():
    # fp32 pretraining at a short sequence: the step's sqrt(exp_avg_sq) copy of the rank's shard
    # (4 B/param, torch's _multi_tensor_adam) outgrows the backward's gathered units + activations
    parts = plan.gpu_bytes(LLAMA, "pt", 8, 1, "fp32", 256, 1, True, 0, "sdpa")
    assert parts["optimizer_step"] == pytest.approx(70.6e9 * 4 / 8)
    assert parts["optimizer_step"] > parts["gathered"] + parts["activations"]
    assert parts["total"] == pytest.approx(
        parts["states"] + parts["optimizer_step"] + parts["framework"]
    )
    # bf16 states: a bf16 copy; LoRA: the fp32 adapters' only
    assert plan.gpu_bytes(LLAMA, "pt", 8, 1, "bf16", 256, 1, True, 0, "sdpa")[
        "optimizer_step"
    ] == pytest.approx(70.6e9 * 2 / 8)
    lora = plan.gpu_bytes(LLAMA, "lora", 8, 1, "bf16-mixed", 256, 1, True, 32, "sdpa")
    assert lora["optimizer_step"] == pytest.approx(plan.lora_params(LLAMA, 32) * 4 / 8)


def test_fp32_layers_save_the_measured_multiple_of_a_bf16_layers_activations():
    s, b, h, L = 1024, 2, 8192, 80
    for task, scale in (("pt", 1.83), ("lora", 1.19)):  # benchmarks/results/step_memory.md
        bf16 = plan.activation_bytes(LLAMA, s, b, False, "sdpa", task=task, precision="bf16-mixed")
        fp32 = plan.activation_bytes(LLAMA, s, b, False, "sdpa", task=task, precision="fp32")
        assert fp32["layers"] == pytest.approx(scale * bf16["layers"])
        assert fp32["logits"] == bf16["logits"]  # the loss is fp32 either way
    # checkpointed: each layer keeps its input, 4 B per element in fp32
    ckpt = plan.activation_bytes(LLAMA, s, b, True, "sdpa", precision="fp32")
    assert ckpt["layers"] == pytest.approx(4 * s * b * h * L)


def test_a_cpu_rank_holds_the_process_in_place_of_the_cuda_framework():
    small = {
        "hf_model_type": "llama",
        "total_params_b": 0.173,
        "layers": 8,
        "hidden": 1024,
        "heads": 16,
        "kv_heads": 2,
        "head_dim": 64,
        "intermediate": 3584,
        "vocab": 32000,
    }
    cpu = plan.cpu_rank_bytes(small, "pt", 4, 256, 1, grad_checkpointing=False)
    gpu = plan.gpu_bytes(small, "pt", 4, 1, "fp32", 256, 1, False, 32, "sdpa")
    # by default checkpointed, as the harness runs (the schema's grad_checkpointing)
    assert plan.cpu_rank_bytes(small, "pt", 4, 256, 1) == plan.cpu_rank_bytes(
        small, "pt", 4, 256, 1, grad_checkpointing=True
    )
    assert cpu["framework"] == plan.CPU_PROCESS_GB * 1e9
    assert cpu["total"] == pytest.approx(
        gpu["total"] - gpu["framework"] + plan.CPU_PROCESS_GB * 1e9
    )
    assert cpu["states"] == pytest.approx(0.173e9 * 16 / 4)  # fp32 weights, grads, 2 AdamW states
    emb, layer = 32000 * 1024, (0.173e9 - 2 * 32000 * 1024) / 8
    # fp32: the lm_head's copy-out after a layer's buffer (forward) = the lm_head, its gradient and
    # a layer's buffer (backward)
    assert cpu["gathered"] == pytest.approx((2 * emb + layer) * 4)
    p = plan.plan_group(
        {
            "id": "g",
            "model": "m",
            "task": "pt",
            "gpus": 4,
            "seq_len": 256,
            "batch": 1,
            "grad_checkpointing": False,
        },
        small,
        {"device": "cpu"},
    )
    assert p.precision == "fp32" and p.cpu_rank_gb == pytest.approx(cpu["total"] / 1e9)
