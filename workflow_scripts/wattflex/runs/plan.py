"""Memory and time plan of a sweep group before anything is submitted (pure functions).

Per group: bytes per GPU (sharded weights, gradients, AdamW states; the FSDP units gathered
at once; activations with or without activation checkpointing; the loss's logits; a
headroom), host RAM per node, the expected start-up (build or load, first step), the
checkpoint's size and write time, and whether it fits (which resource, by how much).
``rules/plan.smk`` writes the table (``tables/resource_plan.csv``); ``wattflex.config``
refuses a ``backend: cuda`` campaign whose groups cannot fit (``check_plan``), and
``rules/common/resources.smk`` adds the planned start-up to each run's SLURM time limit.

The layout modelled is the harness's (``wattflex.runs.training.sharded.apply_fsdp``):
FSDP2 over all ``gpus`` ranks (expert weights over ``ep`` x ``gpus / ep``: per rank still
1/gpus of them), one FSDP unit per decoder layer, and the embedding and lm_head in units of
their own (``EMBEDDING_UNITS = "own"``, torchtitan's layout) or in the
root unit (``"root"``: ``fully_shard(model)`` over them; FSDP2 never reshards the root after
forward, so both stay gathered all step). Precision layouts (``cuda.precision`` or a group's
``precision``), bytes per parameter:

=============  ===================  ==================  =====================  ===========
layout         sharded weights      sharded gradients   AdamW (2 states)       gathered
=============  ===================  ==================  =====================  ===========
bf16-mixed     4 (fp32 master)      4 (fp32)            8 (fp32)               2 (bf16)
bf16           2                    2                   4 (bf16 states)        2
fp32           4                    4                   8                      4
=============  ===================  ==================  =====================  ===========

LoRA trains the adapters only: the frozen base is sharded in the load dtype (bf16 under
bf16-mixed and bf16, as the harness loads it), the adapters are fp32 (peft's
``autocast_adapter_dtype``) with fp32 gradients and AdamW states (16 B per adapter param).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from wattflex.errors import ConfigError
from wattflex.gpus import DEFAULT_GPU, gpu_spec
from wattflex.runs.attention import attention_layers, catalog_attn_implementation
from wattflex.runs.options import layout_problem, torchrun_layout
from wattflex.runs.training.train_config import dtype_policy, precision_choice
from wattflex.schema import REPO_ROOT, read_yaml, section_defaults

_GROUP, _CUDA = section_defaults("group_defaults"), section_defaults("cuda")
SLURM_PROFILE = REPO_ROOT / "profiles" / "slurm" / "config.yaml"

GB = 1e9
GIB = 2**30

# ---- GPU memory -------------------------------------------------------------------------
# Activation bytes per layer, measured: bytes a real transformers decoder layer of each family
# saves for backward (bf16, the catalogue's attention, LoRA rank 32 with fp32 adapters), counted
# with saved-tensor hooks by benchmarks/activation_bytes.py (benchmarks/results/activation_bytes.md;
# 2026-12-03, torch 2.13.0, transformers 5.25.0, peft 0.21.2, CPU). Per (hf_model_type, task):
# ``factor`` bytes per s*b*h (the catalogue model's widths; Korthikanti et al. 2022's GPT block
# is 34, a SwiGLU/MoE block with qk-norm or top-8 routing saves 1.4-3x that), ``score`` bytes
# per a*s^2*b (eager attention only: scores and softmax; sdpa and flex keep none; None: not
# measured, Korthikanti's 5 used), ``expert_weight`` bytes per routed-expert parameter of the
# layer (peft's target_parameters LoRA merges each expert weight with its delta, and grouped_mm
# saves that bf16 copy for backward: 2 B/param of the layer's experts, whatever the tokens).
# gpt-oss pretraining runs FlexAttention (CUDA only with sinks): measured as eager, scores left out.


@dataclass(frozen=True)
class ActivationFactors:
    """The memory a catalogue model's activations take, measured per family (the table above):
    ``factor`` bytes per s*b*h, ``score`` bytes per a*s^2*b (eager attention; None: not measured),
    ``expert_weight`` bytes per routed-expert parameter.
    """

    factor: float
    score: float | None = None
    expert_weight: float = 0.0


ACTIVATION_FACTORS = {
    ("llama", "pt"): ActivationFactors(48.5),
    ("llama", "lora"): ActivationFactors(71.6),
    ("mistral", "pt"): ActivationFactors(71.2),
    ("mistral", "lora"): ActivationFactors(99.4),
    ("qwen3", "pt"): ActivationFactors(74.1),
    ("qwen3", "lora"): ActivationFactors(99.1),
    ("qwen3_moe", "pt"): ActivationFactors(95.0),
    ("qwen3_moe", "lora"): ActivationFactors(102.8, None, 2.0),
    ("gemma4_text", "pt"): ActivationFactors(173.3),
    ("gemma4_text", "lora"): ActivationFactors(153.6, None, 2.0),
    ("deepseek_v2", "pt"): ActivationFactors(108.2),
    ("deepseek_v2", "lora"): ActivationFactors(103.7, None, 2.0),
    ("gpt_oss", "pt"): ActivationFactors(103.7),
    ("gpt_oss", "lora"): ActivationFactors(106.7, 2.0, 2.0),
}
ATTN_SCORE_BYTES = 5.0  # Korthikanti's s^2 term, where a family's eager scores were not measured
# The factors above are bf16 layers'; an fp32 layer (precision fp32, every CPU run) saves more, but
# not twice as much: what bf16 already saved in fp32 (LoRA's upcast inputs to its fp32 adapters,
# the fp32 softmax statistics) does not grow. fp32 over bf16 bytes saved per layer, measured with
# the same hooks on Llama- and Qwen3-shaped layers (benchmarks/step_memory.py --factors,
# benchmarks/results/step_memory.md: 1.79-1.83 pretraining, 1.13-1.19 LoRA), the larger of each task's.
FP32_ACTIVATION_SCALE = {"pt": 1.83, "lora": 1.19}
# Activation checkpointing keeps each layer's input (2*s*b*h, bf16; measured: the benchmark's
# "on" rows) and recomputes one layer at a time in backward, so one layer's full set above is
# live at once (Korthikanti et al. §4.1).
ACT_BYTES_CKPT_INPUT = 2.0
ACT_BYTES_CKPT_INPUT_FP32 = 4.0
# The loss over the full vocabulary: transformers 5's ForCausalLMLoss upcasts the logits to
# fp32 (``logits.float()``) and torch's cross_entropy keeps the fp32 log-softmax for backward;
# counted at the backward peak: fp32 saved log-softmax (4) + fp32 gradient of it (4) + fp32
# gradient of the logits (4) = 12 B per logit (the forward peak is 2 bf16 + 4 + 4 = 10).
LOGIT_BYTES = 12.0
# The harness's chunked loss (wattflex.runs.training.loss, cuda.loss_chunk_tokens; 0 = off)
# computes and recomputes the logits of one chunk of tokens at a time under checkpointing:
# the same 12 B per logit, of one chunk (at most the GPU's seq_len x batch tokens) at once.
# Expert-parallel runs (ep > 1) keep transformers' whole-sequence loss (training.loss.chunked_applies).
LOSS_CHUNK_TOKENS = section_defaults("cuda")["loss_chunk_tokens"]  # the schema's, TrainConfig's too
# FSDP2 all-gathers a unit into one flat buffer, then copies it out into the unit's own
# parameters (torch 2.13 _fsdp_collectives.foreach_all_gather_copy_out). In forward that buffer
# is kept until the next unit's copy-out, to overlap the copy with the next all-gather
# (_fsdp_param_group.wait_for_unshard; freed at the root's post-forward), so a unit's copy-out
# holds its parameters, its buffer and the previous unit's buffer: three units' worth in the
# compute dtype where they are alike; after the last layer, the lm_head twice and a layer (the
# forward's peak measured on CPU: benchmarks/results/step_memory.md). In backward the buffer is
# freed at once, the next unit is prefetched, and one unit's unsharded gradient is live
# (bf16-mixed: bf16, then its fp32 copy for the reduce-scatter, reduce_dtype=float32): the
# backward's peak is a unit, its unsharded gradient and the next unit's buffer, not the forward's
# three units beside a gradient (measured at each FSDP unit's hooks on CPU, fp32 Llama pretraining:
# benchmarks/results/step_memory.md, "Every catalogue family").
UNITS_AT_COPY_OUT = 3
# CUDA context, NCCL buffers and allocator slack (GiB): assumed; the emulator's framework_gib is this.
FRAMEWORK_GIB = 6.0
# Fraction of a GPU's memory the caching allocator can hand out (fragmentation): assumed,
# the emulator's hbm_usable (wattflex.runs.emulator.physics.Physics) is this.
HBM_USABLE = 0.95
EMBEDDING_UNITS = "own"  # training.sharded.fsdp_units: the embedding and the lm_head each a unit
# torch's foreach AdamW (the harness's torch.optim.AdamW, foreach by default on CUDA; torch 2.13
# torch/optim/adam.py _multi_tensor_adam) allocates exp_avg_sq_sqrt = torch._foreach_sqrt(
# exp_avg_sqs): one copy of the second moment of every trainable parameter in a device/dtype
# group, i.e. of the rank's whole shard, in the states' dtype (half the optimizer bytes per
# param). It lives in the step, after backward: activations freed, units resharded.
OPTIMIZER_TEMP_STATES = 0.5  # of the two AdamW states' bytes

# bytes per parameter: (sharded weight, sharded gradient, optimizer states, gathered, unsharded grad)
PT_LAYOUT = {"bf16-mixed": (4, 4, 8, 2, 2 + 4), "bf16": (2, 2, 4, 2, 2), "fp32": (4, 4, 8, 4, 4)}
LORA_BASE_BYTES = {"bf16-mixed": 2, "bf16": 2, "fp32": 4}
ADAPTER_BYTES = 16  # fp32 adapter + fp32 gradient + 2 fp32 AdamW states
PRECISIONS = tuple(PT_LAYOUT)

# ---- host memory ------------------------------------------------------------------------
# RSS of one training process before any weights (torch + CUDA libraries, NCCL, data
# loader): assumed 4 GB. Measured on CPU: 1.26 GB peak per rank with meta init of
# a 450.7M model, its fp32 shard included; CUDA's libraries add host memory on a GPU node.
PROCESS_HOST_GB = 4.0
# RSS of one CPU rank (cuda.device: cpu) before its model is built: torch, transformers and peft
# imported, gloo initialised. Measured 0.47 GB per rank on 4 gloo ranks (benchmarks/step_memory.py,
# benchmarks/results/step_memory.md: the "before build" column), rounded up.
CPU_PROCESS_GB = 0.5
CHECKPOINT_DTYPE_BYTES = 2  # published weights are bf16 safetensors (gpt-oss MXFP4 dequantised)
# How a rank gets its weights: "meta" (random init: built on the meta device, sharded, then
# materialised: each rank holds only its shard, on the GPU), "rank0-broadcast" (rank 0 loads
# the whole model in the training dtype and broadcasts: torch's set_model_state_dict(...,
# full_state_dict=True, broadcast_from_rank0=True), what training.trainer does), "per-rank" (each
# rank reads its bf16 slice: transformers 5's from_pretrained(..., distributed_config=...), not
# used by the harness), "whole" (every rank builds or loads the whole model, then shards: the
# harness's old build).
WEIGHTS_PATHS = ("meta", "rank0-broadcast", "per-rank", "whole")
REAL_WEIGHTS_PATH = "rank0-broadcast"

# ---- time -------------------------------------------------------------------------------
# Random init of a whole model on one CPU thread (torchrun sets OMP_NUM_THREADS=1): ~21M
# params/s per rank, measured (450.7M-param Llama, 20-22 s).
WHOLE_INIT_PARAMS_PER_S = 21e6
# Meta init (build on meta, fully_shard, to_empty, the model's _init_weights): 450.7M params
# in 4.0 s on 2 gloo ranks, i.e. ~56M params of a rank's shard per second, measured on CPU.
# On a GPU the init runs on the device: an upper bound there.
META_INIT_PARAMS_PER_S = 450.7e6 / 2 / 4.0
# Filesystem bandwidth per node for reading weights and writing checkpoints (GB/s):
# assumed; cuda.fs_gb_s sets the cluster's.
FS_GB_S = 2.0
# Process start, NCCL init and the first step (s): assumed; torch.compile of the decoder
# layer (one graph serves every layer: inlined nn.Module parameters, torch >= 2.5) adds more.
FIRST_STEP_S = {False: 60.0, True: 180.0}
# Host memory per node (GB) where cuda.host_mem_gb is not set: the SLURM profile's run_at_cap
# mem_mb (profiles/slurm/config.yaml, its one home), in GB.
HOST_MEM_GB = read_yaml(SLURM_PROFILE)["set-resources"]["run_at_cap"]["mem_mb"] / 1000
# What the plan reads of a group (the rule's params: nothing else of a group reruns it).
GROUP_KEYS = (
    "id",
    "model",
    "task",
    "gpus",
    "gpu",
    "seq_len",
    "batch",
    "ep",
    "compile",
    "grad_checkpointing",
    "lora_rank",
    "precision",
)


@dataclass(frozen=True)
class Shape:
    """A catalogue model's parameter counts (all layers alike; embedding and lm_head one weight
    where ``tie_word_embeddings``, as Gemma's, else two)."""

    params: float
    embedding: float  # one of embedding / lm_head: vocab x hidden
    layer_dense: float  # per decoder layer, routed experts excluded
    layer_expert: float  # per decoder layer, routed experts
    adapters: float  # LoRA adapter params at the group's rank (0 for pt)
    tied: bool = False  # lm_head is the embedding's weight (both in the FSDP root)


def shape(facts: dict[str, Any], lora_rank: int = 0) -> Shape:
    """The parameter counts of a catalogue model (its ``facts``: billions of parameters, layers,
    hidden, vocab...) with LoRA adapters of ``lora_rank`` (0: none, pre-training).

    Raises KeyError when the facts lack a needed entry.
    """
    total = float(facts["total_params_b"]) * 1e9
    layers, h = int(facts["layers"]), int(facts["hidden"])
    emb = float(facts["vocab"]) * h
    expert = float(facts.get("expert_params_b", 0.0) or 0.0) * 1e9
    tied = bool(facts.get("tie_word_embeddings", False))
    return Shape(
        params=total,
        embedding=emb,
        layer_dense=(total - expert - (1 if tied else 2) * emb) / layers,
        layer_expert=expert / layers,
        adapters=lora_params(facts, lora_rank),
        tied=tied,
    )


def lora_params(facts: dict[str, Any], rank: int) -> float:
    """Adapter parameters of rank ``rank`` on the harness's targets (wattflex.runs.training.
    models.lora_targets): attention q/k/v/o (each kind of attention layer at its widths), the
    dense MLP's gate/up/down (beside the experts where ``dense_intermediate``, as in Gemma-4), and
    the fused expert weights of MoE layers (peft target_parameters: rank x experts per weight).
    r x (in + out) per matrix."""
    if rank <= 0:
        return 0.0
    h, layers = int(facts["hidden"]), int(facts["layers"])
    attention = sum(
        k.count
        * ((h + k.q_width) + (2 if k.has_v_proj else 1) * (h + k.kv_width) + (k.q_width + h))
        for k in attention_layers(facts)
    )
    inter = int(facts["intermediate"])
    experts = int(facts.get("experts", 0) or 0)
    if experts:
        per_layer = experts * ((h + 2 * inter) + (inter + h))  # gate_up_proj, down_proj
        if facts.get("dense_intermediate"):
            per_layer += 3 * (h + int(facts["dense_intermediate"]))
    else:
        per_layer = 3 * (h + inter)
    return float(rank * (attention + per_layer * layers))


def attention_of(facts: dict[str, Any], task: str, override: str | None = None) -> str:
    """The attention implementation a group runs: ``override`` if given, else the catalogue's for
    the family and task, else ``sdpa``.
    """
    return override or catalog_attn_implementation(facts, task) or "sdpa"


def activation_factors(family: str, task: str) -> ActivationFactors:
    """The measured factors of ``family`` (hf_model_type) and ``task``; a family not measured
    gets the largest of the task's (each field its own maximum), so its plan errs high."""
    if (family, task) in ACTIVATION_FACTORS:
        return ACTIVATION_FACTORS[(family, task)]
    known = [f for (_, t), f in ACTIVATION_FACTORS.items() if t == task]
    return ActivationFactors(
        max(f.factor for f in known), None, max(f.expert_weight for f in known)
    )


def layer_activation_bytes(
    facts: dict[str, Any],
    task: str,
    seq_len: int,
    batch: int,
    attention: str,
    ep: int = _GROUP["ep"],
    precision: str = "bf16-mixed",
) -> float:
    """Bytes one decoder layer saves for backward on this GPU (its ep-slice of the experts), its
    compute in bf16 (bf16-mixed, bf16) or fp32 (``FP32_ACTIVATION_SCALE``)."""
    s, b, h, a = seq_len, batch, int(facts["hidden"]), int(facts["heads"])
    f = activation_factors(str(facts.get("hf_model_type", "")), task)
    score = (
        (ATTN_SCORE_BYTES if f.score is None else f.score) * a * s * s * b
        if attention == "eager"
        else 0.0
    )
    expert = f.expert_weight * shape(facts).layer_expert / max(ep, 1)
    scale = FP32_ACTIVATION_SCALE[task] if precision == "fp32" else 1.0
    return (s * b * h * f.factor + score + expert) * scale


def activation_bytes(
    facts: dict[str, Any],
    seq_len: int,
    batch: int,
    grad_checkpointing: bool,
    attention: str,
    loss_chunk_tokens: int = LOSS_CHUNK_TOKENS,
    task: str = "pt",
    ep: int = _GROUP["ep"],
    precision: str = "bf16-mixed",
) -> dict[str, float]:
    """Per GPU: ``layers`` (live through the whole step: every layer's activations, or their
    checkpointed inputs), ``working`` (one recomputed layer's, checkpointing only) and
    ``logits`` (the loss's peak). The step's peak is layers + max(working, logits): the loss
    runs before backward recomputes any layer."""
    s, b, h, L = seq_len, batch, int(facts["hidden"]), int(facts["layers"])
    per_layer = layer_activation_bytes(facts, task, s, b, attention, ep, precision)
    tokens = min(s * b, loss_chunk_tokens) if loss_chunk_tokens > 0 else s * b
    logits = LOGIT_BYTES * tokens * float(facts["vocab"])
    if grad_checkpointing:
        kept = ACT_BYTES_CKPT_INPUT_FP32 if precision == "fp32" else ACT_BYTES_CKPT_INPUT
        return {"layers": kept * s * b * h * L, "working": per_layer, "logits": logits}
    return {"layers": per_layer * L, "working": 0.0, "logits": logits}


def gpu_bytes(
    facts: dict[str, Any],
    task: str,
    gpus: int,
    ep: int,
    precision: str,
    seq_len: int,
    batch: int,
    grad_checkpointing: bool,
    lora_rank: int,
    attention: str,
    embedding_units: str = EMBEDDING_UNITS,
    loss_chunk_tokens: int = LOSS_CHUNK_TOKENS,
) -> dict[str, float]:
    """Bytes per GPU by part (``states``: sharded weights + gradients + AdamW; ``gathered``:
    FSDP units unsharded at once; activations; ``optimizer_step``: AdamW's temporary, live
    without the two before it; ``framework``), and their ``total`` (the larger of the
    backward's and the optimizer step's peaks)."""
    if precision not in PT_LAYOUT:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    sh = shape(facts, lora_rank if task == "lora" else 0)
    if task == "pt":
        w, g, o, gathered_b, grad_b = PT_LAYOUT[precision]
        states = sh.params * (w + g + o) / gpus
    else:
        gathered_b, grad_b = LORA_BASE_BYTES[precision], 0  # frozen base: no base gradients
        states = sh.params * LORA_BASE_BYTES[precision] / gpus + sh.adapters * ADAPTER_BYTES / gpus
    trainable = (
        sh.params * PT_LAYOUT[precision][2] if task == "pt" else sh.adapters * ADAPTER_BYTES / 2
    )
    optimizer_step = trainable * OPTIMIZER_TEMP_STATES / gpus
    gathered = 0.0
    if gpus > 1:
        # A rank gathers its ep-slice of a layer's experts (all of them over the efsdp ranks).
        layer = sh.layer_dense + sh.layer_expert / max(ep, 1)
        if (
            embedding_units == "root" or sh.tied
        ):  # root never resharded: embedding + lm_head live all step
            copies = (
                1 if sh.tied else 2
            )  # tied: one weight, in the root (training.sharded.fsdp_units)
            gathered = (
                copies * sh.embedding * (gathered_b + grad_b)
                + UNITS_AT_COPY_OUT * layer * gathered_b
                + layer * grad_b
            )
        else:
            big = max(layer, sh.embedding)
            # forward: the largest unit's copy-out (its parameters and buffer) after a layer's
            # buffer; backward: the largest unit and its unsharded gradient, the next unit's
            # buffer prefetched (FSDP2 frees a unit's buffer at its copy-out in backward)
            gathered = max(
                (2 * big + layer) * gathered_b, (big + layer) * gathered_b + big * grad_b
            )
    act = activation_bytes(
        facts, seq_len, batch, grad_checkpointing, attention, loss_chunk_tokens, task, ep, precision
    )
    activations = act["layers"] + max(act["working"], act["logits"])
    framework = FRAMEWORK_GIB * GIB
    return {
        "states": states,
        "gathered": gathered,
        "activations": activations,
        "logits": act["logits"],
        "optimizer_step": optimizer_step,
        "framework": framework,
        "total": states + max(gathered + activations, optimizer_step) + framework,
    }


def cpu_rank_bytes(
    facts: dict[str, Any],
    task: str,
    ranks: int,
    seq_len: int,
    batch: int,
    lora_rank: int = _GROUP["lora_rank"],
    grad_checkpointing: bool = _GROUP["grad_checkpointing"],
    attention: str = "sdpa",
    precision: str = "fp32",
    loss_chunk_tokens: int = LOSS_CHUNK_TOKENS,
) -> dict[str, float]:
    """Host bytes of one rank of a CPU run (cuda.device: cpu, cuda.parallel: fsdp: FSDP2 over
    ``ranks`` gloo ranks) during its steps: ``gpu_bytes``' parts, the rank's memory being the
    host's, with ``CPU_PROCESS_GB`` for the process in place of the CUDA framework; ``total`` is
    the steps' peak RSS per rank the plan expects (training.trainer records the measured one as
    ``peak_rss_bytes_per_rank[*].steps`` in run.json)."""
    parts = gpu_bytes(
        facts,
        task,
        ranks,
        1,
        precision,
        seq_len,
        batch,
        grad_checkpointing,
        lora_rank,
        attention,
        loss_chunk_tokens=loss_chunk_tokens,
    )
    process = CPU_PROCESS_GB * GB
    return {**parts, "framework": process, "total": parts["total"] - parts["framework"] + process}


def weights_path(cuda: dict[str, Any]) -> str:
    """How the runs get weights (training.trainer._materialize): meta init for random weights;
    real weights read whole by rank 0 and broadcast, with or without expert parallelism."""
    if cuda.get("tiny") or (cuda.get("random_init") and not cuda.get("model_path")):
        return "meta"
    return REAL_WEIGHTS_PATH


def load_bytes_per_param(task: str, precision: str) -> int:
    """dtype the model is built or loaded in on the host (training.trainer.prepare_model)."""
    return 2 if precision == "bf16" or (precision == "bf16-mixed" and task == "lora") else 4


def host_gb_per_node(
    params: float,
    task: str,
    precision: str,
    gpus: int,
    ranks_per_node: int,
    path: str,
    staging_bytes: float = 0.0,
) -> float:
    """Host RAM of the busiest node (GB): its ranks' processes plus the larger of the weights
    they hold while loading and ``staging_bytes`` (the whole checkpoint of the job: an
    asynchronous DCP save first copies each rank's shard of it to host memory)."""
    base = ranks_per_node * PROCESS_HOST_GB
    staging = ranks_per_node * staging_bytes / gpus / GB
    if path == "meta":
        weights = 0.0
    elif path == "rank0-broadcast":  # rank 0 loads the whole model in the training dtype
        weights = params * load_bytes_per_param(task, precision) / GB
    elif path == "per-rank":
        weights = ranks_per_node * params * CHECKPOINT_DTYPE_BYTES / gpus / GB
    elif path == "whole":
        weights = ranks_per_node * params * load_bytes_per_param(task, precision) / GB
    else:
        raise ValueError(f"weights path {path!r}: expected one of {', '.join(WEIGHTS_PATHS)}")
    return base + max(weights, staging)


def build_s(params: float, gpus: int, nodes: int, path: str, fs_gb_s: float) -> float:
    """Seconds from process start to a sharded model on the GPUs, before the first step."""
    if path == "meta":
        return params / gpus / META_INIT_PARAMS_PER_S
    if path == "whole":
        return params / WHOLE_INIT_PARAMS_PER_S
    if path == "rank0-broadcast":  # one node reads everything; the broadcast is NVLink/IB-fast
        return params * CHECKPOINT_DTYPE_BYTES / GB / fs_gb_s
    return params * CHECKPOINT_DTYPE_BYTES / GB / (fs_gb_s * nodes)


def checkpoint_bytes(params: float, adapters: float, task: str, precision: str) -> float:
    """What the harness's checkpoint saves (torch get_state_dict(model, optimizer): every
    parameter, frozen ones included, plus the optimizer states). Pretraining at bf16-mixed:
    fp32 weights + 2 fp32 AdamW states = 12 B/param, as measured."""
    if task == "pt":
        w, _, o, _, _ = PT_LAYOUT[precision]
        return params * (w + o)
    return params * LORA_BASE_BYTES[precision] + adapters * (4 + 8)


@dataclass(frozen=True)
class GroupPlan:
    """A group's resource plan: its layout, the memory it needs per GPU (GiB: states, gathered
    weights, activations, logits, framework) against what the GPU has, the host memory (GB), the
    start-up and checkpoint times (s), and whether it fits (``reason`` when not).
    """

    group: str
    model: str
    task: str
    gpu: str
    gpus: int
    nodes: int
    ep: int
    seq_len: int
    batch: int
    precision: str
    grad_checkpointing: bool
    attention: str
    states_gib: float
    gathered_gib: float
    activations_gib: float
    logits_gib: float  # the loss's part of activations_gib (peak: it and one recomputed layer)
    framework_gib: float
    gpu_need_gib: float
    gpu_avail_gib: float
    weights_path: str
    host_need_gb: float
    host_avail_gb: float
    host_whole_build_gb: float
    cpu_rank_gb: float  # host GB per rank if the group runs on CPU ranks (cpu_rank_bytes)
    build_s: float
    first_step_s: float
    startup_s: float
    checkpoint_gb: float
    checkpoint_write_s: float
    fits: bool
    reason: str

    def row(self) -> dict[str, Any]:
        """The plan as one table row (floats rounded to two decimals)."""
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def plan_group(
    g: dict[str, Any],
    facts: dict[str, Any],
    cuda: dict[str, Any] | None = None,
    checkpoint_at_s: float | None = 1200.0,
) -> GroupPlan:
    """The plan of one resolved group (``wattflex.config.groups``) of catalogue model ``facts``
    (``checkpoint_at_s``: run.checkpoint_at_s; None: no checkpoint)."""
    cuda = cuda or {}
    task, gpus = g["task"], int(g["gpus"])
    precision = dtype_policy(precision_choice(g, cuda), cuda.get("device", _CUDA["device"]))
    ep = int(g.get("ep", _GROUP["ep"])) if facts.get("experts") and task == "pt" else 1
    ckpt = bool(g.get("grad_checkpointing", _GROUP["grad_checkpointing"]))
    attention = attention_of(facts, task, cuda.get("attn_implementation"))
    # defaults: the schema's, as TrainConfig.from_spec (a group from the library API need not set them)
    seq_len, batch = int(g.get("seq_len", _GROUP["seq_len"])), int(g.get("batch", _GROUP["batch"]))
    parts = gpu_bytes(
        facts,
        task,
        gpus,
        ep,
        precision,
        seq_len,
        batch,
        ckpt,
        int(g.get("lora_rank", _GROUP["lora_rank"])),
        attention,
        loss_chunk_tokens=0 if ep > 1 else int(cuda.get("loss_chunk_tokens", LOSS_CHUNK_TOKENS)),
    )
    spec = gpu_spec(g.get("gpu", DEFAULT_GPU))
    avail = spec.hbm_gib * HBM_USABLE
    need = parts["total"] / GIB
    ranks_per_node, nodes = torchrun_layout(g, cuda)
    path = weights_path(cuda)
    sh = shape(facts, int(g.get("lora_rank", _GROUP["lora_rank"])) if task == "lora" else 0)
    ck_bytes = checkpoint_bytes(sh.params, sh.adapters, task, precision)
    # training.trainer: DCP async_save (cuda.checkpoint_async, default on) stages in host memory
    staging = (
        ck_bytes
        if cuda.get("checkpoint_async", section_defaults("cuda")["checkpoint_async"])
        and checkpoint_at_s is not None
        else 0.0
    )
    host = host_gb_per_node(sh.params, task, precision, gpus, ranks_per_node, path, staging)
    host_avail = float(cuda.get("host_mem_gb") or HOST_MEM_GB)
    fs = float(cuda.get("fs_gb_s") or FS_GB_S)
    b_s = build_s(sh.params, gpus, nodes, path, fs)
    first = FIRST_STEP_S[bool(g.get("compile", _GROUP["compile"]))]
    short = []
    if need > avail:
        short.append(
            f"GPU memory: needs {need:.1f} GiB per {spec.name}, {avail:.1f} GiB usable "
            f"({need - avail:.1f} GiB over: states {parts['states'] / GIB:.1f} at precision {precision}, "
            f"gathered units {parts['gathered'] / GIB:.1f}, activations {parts['activations'] / GIB:.1f} "
            f"(loss logits {parts['logits'] / GIB:.1f}; grad_checkpointing {ckpt}), "
            f"or in the optimizer step its temporary {parts['optimizer_step'] / GIB:.1f}, "
            f"framework {parts['framework'] / GIB:.1f})"
        )
    if host > host_avail:
        short.append(
            f"host memory: needs {host:.0f} GB on a node ({path} weights, checkpoint staging "
            f"{ranks_per_node * staging / gpus / GB:.0f} GB), {host_avail:.0f} GB available "
            f"(cuda.host_mem_gb; {host - host_avail:.0f} GB over)"
        )
    return GroupPlan(
        group=g["id"],
        model=g["model"],
        task=task,
        gpu=spec.name,
        gpus=gpus,
        nodes=nodes,
        ep=ep,
        seq_len=seq_len,
        batch=batch,
        precision=precision,
        grad_checkpointing=ckpt,
        attention=attention,
        states_gib=parts["states"] / GIB,
        gathered_gib=parts["gathered"] / GIB,
        activations_gib=parts["activations"] / GIB,
        logits_gib=parts["logits"] / GIB,
        framework_gib=parts["framework"] / GIB,
        gpu_need_gib=need,
        gpu_avail_gib=avail,
        weights_path=path,
        host_need_gb=host,
        host_avail_gb=host_avail,
        host_whole_build_gb=host_gb_per_node(
            sh.params, task, precision, gpus, ranks_per_node, "whole"
        ),
        cpu_rank_gb=cpu_rank_bytes(
            facts,
            task,
            gpus,
            seq_len,
            batch,
            int(g.get("lora_rank", _GROUP["lora_rank"])),
            ckpt,
            attention,
            precision,
            0 if ep > 1 else int(cuda.get("loss_chunk_tokens", LOSS_CHUNK_TOKENS)),
        )["total"]
        / GB,
        build_s=b_s,
        first_step_s=first,
        startup_s=b_s + first,
        checkpoint_gb=ck_bytes / GB,
        checkpoint_write_s=ck_bytes / GB / (fs * nodes),
        fits=not short,
        reason="; ".join(short) or "fits",
    )


def plan_groups(
    groups: list[dict[str, Any]],
    catalog: dict[str, dict[str, Any]],
    cuda: dict[str, Any] | None,
    checkpoint_at_s: float | None = 1200.0,
) -> list[GroupPlan]:
    """The plans of resolved groups (``wattflex.config.groups``), models from ``catalog``."""
    return [plan_group(g, catalog[g["model"]], cuda, checkpoint_at_s) for g in groups]


def plan_campaign(cfg: dict[str, Any], resolved: list[dict[str, Any]]) -> list[GroupPlan]:
    """The groups ``resolved`` (``wattflex.config.groups(cfg)``) of a prepared config ``cfg``
    (``_catalog`` attached), with its cuda section and run.checkpoint_at_s."""
    return plan_groups(resolved, cfg["_catalog"], cfg["cuda"], cfg["run"]["checkpoint_at_s"])


def refusals(plans: list[GroupPlan]) -> list[str]:
    """One line per group that cannot fit."""
    return [
        f"group {p.group} ({p.model} {p.task} on {p.gpus} {p.gpu}): {p.reason}"
        for p in plans
        if not p.fits
    ]


def enforced(cfg: dict[str, Any]) -> bool:
    """Whether a campaign's plan is binding: real runs of full-size models on GPUs (``backend:
    cuda``, not ``cuda.tiny``, not ``cuda.device: cpu``). The emulator has no memory, a tiny
    smoke model always fits, and a CPU run has no GPU memory to plan."""
    cuda = cfg["cuda"]  # a prepared config: the schema's defaults filled in
    return cfg["backend"] == "cuda" and not cuda.get("tiny") and cuda["device"] != "cpu"


def check_plan(cfg: dict[str, Any], resolved: list[dict[str, Any]]) -> None:
    """Refuse (ConfigError) a binding campaign with a group that cannot fit, naming every such
    group, the resource and the numbers (``resolved``: ``wattflex.config.groups(cfg)``)."""
    if not enforced(cfg):
        return
    # A group's own command (group.command) is not the harness: its memory is its own business.
    short = refusals(plan_campaign(cfg, [g for g in resolved if not g.get("command")]))
    if short:
        raise ConfigError(
            f"config error at groups: {len(short)} group(s) cannot fit (wattflex.runs.plan, docs/resource-plan.md): "
            + " | ".join(short)
            + ". Give the group precision: bf16, grad_checkpointing: true, more gpus or a "
            "smaller batch/seq_len; host memory: cuda.host_mem_gb (the SLURM profile's mem_mb)"
        )


def check_layouts(cfg: dict[str, Any], resolved: list[dict[str, Any]], per_node: int) -> None:
    """Refuse (ConfigError) a harness group whose torchrun layout is not the nodes SLURM gives it
    on ``per_node``-GPU nodes (``runs.options.layout_problem``); a group's own command launches
    itself."""
    for i, g in enumerate(resolved):
        why = None if g.get("command") else layout_problem(g, cfg["cuda"], per_node)
        if why:
            raise ConfigError(f"config error at groups[{i}]: {why}")


def run_limit_s(
    plan: GroupPlan, duration_s: float, gap_s: float, checkpoint_at_s: float | None
) -> float:
    """Wall-clock seconds one run needs: start-up, then the loop (which stops after
    ``duration_s`` but cannot stop inside the checkpoint: a checkpoint at ``checkpoint_at_s``
    longer than the rest of the run extends it), then the gap."""
    loop = float(duration_s)
    if checkpoint_at_s is not None and checkpoint_at_s < duration_s:
        loop = max(loop, float(checkpoint_at_s) + plan.checkpoint_write_s)
    return plan.startup_s + loop + float(gap_s)


# ---- the docs' table (docs/resource-plan.md) -------------------------------------------
README_COLUMNS = (
    ("group", "group"),
    ("precision", "precision"),
    ("gpu_need_gib", "GPU GiB needed"),
    ("gpu_avail_gib", "usable"),
    ("states_gib", "states"),
    ("gathered_gib", "gathered"),
    ("activations_gib", "activations"),
    ("logits_gib", "of which logits"),
    ("host_need_gb", "host GB/node"),
    ("host_whole_build_gb", "whole-build GB/node"),
    ("startup_s", "start-up s"),
    ("checkpoint_gb", "checkpoint GB"),
    ("checkpoint_write_s", "write s"),
    ("fits", "fits"),
)


def markdown(rows: list[dict[str, Any]]) -> str:
    """docs/resource-plan.md's plan table from rows of tables/resource_plan.csv (or GroupPlan.row())."""

    def cell(key: str, v: Any) -> str:
        if key == "fits":
            return "yes" if str(v) == "True" else "**no**"
        if key.endswith("_gib") or key.endswith("_gb") or key.endswith("_s"):
            return (
                f"{float(v):.0f}"
                if key.endswith("_s") or key.endswith("_gb")
                else f"{float(v):.1f}"
            )
        return str(v)

    lines = [
        "| " + " | ".join(t for _, t in README_COLUMNS) + " |",
        "|" + " --- |" * len(README_COLUMNS),
    ]
    lines += ["| " + " | ".join(cell(k, r[k]) for k, _ in README_COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


if (
    __name__ == "__main__"
):  # python -m wattflex.runs.plan results/<campaign>/tables/resource_plan.csv
    import csv
    import sys

    with open(sys.argv[1], newline="") as f:
        print(markdown(list(csv.DictReader(f))))
