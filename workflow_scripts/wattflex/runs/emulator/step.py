"""The physics behind the emulated backend: a virtual H200/H100 running one training job.

Every global constant is a field of ``Physics`` (``PHYSICS`` is the default) with its source
in ``metadata["source"]``: a measurement, a documented framework/kernel behaviour, a count
of the bytes a named piece of code moves, or "assumed"/"fitted". Never per group: groups
differ only through their architecture (catalog facts), task, layout and settings.

**GPU power/DVFS model** (``GPUSpec``, ``operating_points``). Board power of a kernel class
at SM clock ``f`` (``x = f / f_max``)::

    P = idle_w + mem_dyn_w * dram_util + sm_dyn_w * x * v(x)^2 * (sm_busy_weight * sm_busy + tensor_weight * tensor_util)

``sm_busy`` and ``tensor_util`` are the kernel's own activity from its roofline at that clock
(``Kernel.sm_activity``: the share of its time compute or issue sets, floored at
``sm_stall_activity`` where HBM sets it; ``tensor_util``: its tensor FLOPs over the peak at
``f`` over its time), so a job at 35-45 % MFU draws less per MHz than one at peak. The
achieved efficiency per kernel class is taken from published framework figures
(``dense_gemm_eff``: torchtitan's H100 throughput, ``expert_gemm_rel_eff``: DeepGEMM's
grouped over dense GEMM rates, ``attention_eff``: FlashAttention-2 on H100), not assumed.

``v(x) = v_min + (1 - v_min) * x**v_exp`` is the normalised core voltage: flat at low clocks,
rising steeply near the top. The memory clock does not change under a power cap (the
paper's mechanism), so memory-bound work keeps its speed while the SM clock drops. A cap is
enforced as the firmware does: the highest SM clock (15 MHz bins) whose step-average power
fits under it.

Calibration (``wattflex.analysis.calibration``), on public measurements only, never on the paper's
tables. The voltage curve (``v_min``, ``v_exp``) is fitted to measured (SM clock, board draw,
memory power) triples of a 94 GB H100 under caps 200-700 W (Ujeniya et al. 2026 v2, a reading
of its figures; at the 700 W cap it draws 647 W, so a cap is never taken as a draw). One more
number splits that power into activity units: the **anchor**, the SM clock a bf16 GEMM at
``anchor_tensor_util`` (0.70) holds under 700 W. It is carried over, at the same fraction of
f_max, from the A100 anchor fitted on the Perseus A100 power-limit sweeps (``public_anchor``):
1680 MHz, ``sm_dyn_w`` 1168 W. A user's measurements or the GPU check's anchor GEMM can replace
it (``wattflex calibrate``, ``emulator: {calibration: FILE}``). No H200 table was found, so the
fit serves every GH100 part; the parts differ in HBM (``wattflex.gpus``). A part of another die
(the A100) has no default curve: its anchor is fitted by ``wattflex calibrate`` on sweeps
measured on it, and ``physics_for_gpu`` refuses to emulate it without that calibration.

**Training-step roofline** (``JobSpec``, ``step_kernels``). One optimizer step per GPU is a
list of kernel classes, each with tensor FLOPs, DRAM bytes and SM issue cost, derived from the
architecture, the task and the layout; each takes ``max(compute at f, memory, issue at f)``:

* dense GEMMs: ``2 * N * tokens`` per pass; 3 passes for full training, 2 for LoRA, +1 with
  activation checkpointing (the recompute);
* attention, as the harness runs it (``attention_impl``: the catalog's ``attn_implementation``
  per task, else transformers' default ``sdpa``). Fused (FlashAttention-2 via sdpa,
  FlexAttention): causal FLOPs, no S x S traffic. Eager (gpt-oss LoRA: transformers declares
  no SDPA for gpt_oss): full S x S batched GEMMs and a softmax chain that moves every score
  element through HBM (bytes counted per op in ``Physics``; fewer when the layer is
  compiled, more with sink logits);
* routed experts (transformers 5 ``grouped_mm`` path): FLOPs of the active experts, bytes of
  all local expert weights and of the GEMM activations, the bf16 efficiency of the dense
  GEMMs times the fill of each expert's last row tile; routing (gather, weighting, inverse
  permutation, top-k sum and their gradients) as bytes counted from that code, fewer when
  compiled, plus the dispatch/combine copies of expert parallelism; with LoRA (peft
  ``target_parameters`` on the fused experts) the experts' weight gradient is computed too
  (one more GEMM pass) and every forward folds the adapters into each expert's weight;
* LoRA on the targeted nn.Linear modules (q, k, v, o; gate, up, down where the layer has a dense
  MLP): two rank-r GEMMs per module, with the bytes peft's ``lora.Linear.forward`` moves (it
  reads each module's input again), memory-bound at rank 32;
* element-wise / norm kernels, AdamW (full training): DRAM bytes, issue-limited at low clocks;
* collectives: FSDP all-gather / reduce-scatter (hidden behind compute up to
  ``fsdp_overlap``) and, with ``ep > 1``, the all-to-all dispatch + combine (bf16, forward,
  recompute and backward; fully exposed, as transformers' EP waits on it), each at NCCL's
  published bus bandwidth over NVLink (``GPUSpec.nvlink_gb_s``);
* pipeline parallelism (``pp`` > 1, emulated groups only; the Perseus sweeps): each GPU runs
  ``layers / pp`` over all of its replica's tokens and idles ``(pp - 1) / microbatches`` of its
  busy time in the schedule's bubble (``pipeline_stage``, ``pipeline_bubble``);
* host: the per-step host work after the step's sync is exposed; kernel-launch time hides
  behind queued GPU work and shows only where it exceeds it (CUDA launches are asynchronous).

Compute-bound time scales with 1/f; memory, communication and host time do not. Which groups
are flexible follows from that split: the emulated PFI of the headline groups rank-correlates
with each job's clock-independent share of step time (checked by
``tests/unit/runs/test_emulator_mechanisms.py``). ``benchmarks/emulator_vs_perseus.py`` sets
the emulator's clock scaling beside the Perseus (SOSP'24) A100 SM-frequency profiles.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wattflex.gpus import GPUS_PER_NODE, GPUSpec
from wattflex.runs.attention import catalog_attn_implementation, mean_head_dim
from wattflex.runs.emulator.physics import (
    PHYSICS,
    Physics,
    voltage,
)
from wattflex.runs.plan import layer_activation_bytes
from wattflex.schema import section_defaults

_GROUP = section_defaults("group_defaults")

GIB = 1024**3


@dataclass(frozen=True)
class Kernel:
    """One class of work in a training step on one GPU."""

    name: str
    tensor_flops: float = 0.0  # bf16 tensor-core FLOPs
    efficiency: float = 0.75  # achievable fraction of peak tensor rate
    dram_bytes: float = 0.0
    issue_bytes: float = 0.0  # bytes whose handling costs SM issue slots (element-wise)
    comm_s: float = 0.0  # exposed communication time (clock-independent)
    host_s: float = 0.0  # GPU idle, waiting for the host (after a host sync)
    launch_s: float = 0.0  # host time launching kernels; hidden behind queued GPU work

    def times(self, gpu: GPUSpec, x: np.ndarray, physics: Physics = PHYSICS) -> np.ndarray:
        """Seconds the kernel takes at relative SM clocks ``x``: the slowest of compute, HBM
        and issue, plus its communication, host and launch time."""
        t = np.zeros_like(x, dtype=float)
        if self.tensor_flops:
            t = np.maximum(t, self.tensor_flops / (gpu.tensor_flops_per_s(x) * self.efficiency))
        if self.dram_bytes:
            t = np.maximum(t, self.dram_bytes / (gpu.hbm_tb_s * 1e12 * physics.hbm_efficiency))
        if self.issue_bytes:
            t = np.maximum(
                t, self.issue_bytes / (physics.issue_bw_factor * gpu.hbm_tb_s * 1e12 * x)
            )
        return t + self.comm_s + self.host_s + self.launch_s

    def sm_activity(self, gpu: GPUSpec, x: np.ndarray, physics: Physics = PHYSICS) -> np.ndarray:
        """Issue activity of the SMs over the kernel, from its roofline: the share of its time
        its compute (tensor work at its efficiency) or its issue slots set, floored at
        ``sm_stall_activity`` where HBM sets it (warps waiting on memory)."""
        t = self.times(gpu, x, physics)
        busy = np.zeros_like(t)
        if self.tensor_flops:
            busy = np.maximum(
                busy, self.tensor_flops / (gpu.tensor_flops_per_s(x) * self.efficiency)
            )
        if self.issue_bytes:
            busy = np.maximum(
                busy, self.issue_bytes / (physics.issue_bw_factor * gpu.hbm_tb_s * 1e12 * x)
            )
        frac = np.divide(busy, t, out=np.ones_like(t), where=t > 0)
        return np.clip(frac, physics.sm_stall_activity, 1.0)


@dataclass(frozen=True)
class JobSpec:
    """A training job as the emulator sees it (one sweep group)."""

    model: str
    architecture: str  # dense | moe
    task: str  # pt | lora
    gpus: int
    seq_len: int
    batch: int  # micro-batch per GPU (sequences)
    total_params_b: float
    active_params_b: float
    expert_params_b: float
    layers: int
    hidden: int
    heads: int
    head_dim: int  # averaged over the layers (runs.attention.mean_head_dim)
    intermediate: int
    vocab: int
    experts: int = 0
    experts_active: int = 0
    ep: int = _GROUP["ep"]
    compile: bool = _GROUP["compile"]
    grad_checkpointing: bool = _GROUP["grad_checkpointing"]
    lora_rank: int = _GROUP["lora_rank"]
    attention: str = (
        "sdpa"  # transformers attn_implementation the harness runs (see attention_impl)
    )
    attention_sinks: bool = False  # per-head learned sink logits (gpt-oss)
    pp: int = 1  # pipeline stages (GPipe/1F1B; each GPU holds layers / pp)
    microbatches: int = 1  # micro-batches per step through the pipeline (pp > 1)
    family: str = ""  # hf_model_type: picks runs.plan's measured activation bytes
    kv_heads: int = 0  # key/value heads (0: as many as query heads)
    # width of the dense MLP whose gate/up/down projections carry LoRA adapters (nn.Linear):
    # a dense model's intermediate; an MoE model's dense_intermediate (0 where its MLP is all
    # routed experts, which take LoRA through target_parameters instead)
    lora_mlp_intermediate: int = 0

    @classmethod
    def from_config(cls, group: dict[str, Any], model: dict[str, Any]) -> JobSpec:
        """The job of a resolved config ``group`` on its catalogue entry ``model``."""
        return cls(
            model=group["model"],
            architecture=model["architecture"],
            task=group["task"],
            gpus=int(group["gpus"]),
            seq_len=int(group["seq_len"]),
            batch=int(group["batch"]),
            total_params_b=float(model["total_params_b"]),
            active_params_b=float(model["active_params_b"]),
            expert_params_b=float(model.get("expert_params_b", 0.0)),
            layers=int(model["layers"]),
            hidden=int(model["hidden"]),
            heads=int(model["heads"]),
            head_dim=round(mean_head_dim(model)),
            intermediate=int(model["intermediate"]),
            vocab=int(model["vocab"]),
            experts=int(model.get("experts", 0) or 0),
            experts_active=int(model.get("experts_active", 0) or 0),
            ep=int(group.get("ep", _GROUP["ep"])),
            compile=bool(group.get("compile", _GROUP["compile"])),
            grad_checkpointing=bool(group.get("grad_checkpointing", _GROUP["grad_checkpointing"])),
            lora_rank=int(group.get("lora_rank", _GROUP["lora_rank"])),
            attention=attention_impl(model, group["task"]),
            attention_sinks=bool(model.get("attention_sinks", False)),
            pp=int(group.get("pp", 1)),
            microbatches=int(group.get("microbatches", 1)),
            family=str(model.get("hf_model_type", "")),
            kv_heads=int(model.get("kv_heads", 0) or 0),
            lora_mlp_intermediate=int(
                model["intermediate"]
                if model["architecture"] == "dense"
                else model.get("dense_intermediate", 0) or 0
            ),
        )

    @property
    def tokens_per_gpu(self) -> int:
        """Tokens one GPU trains on per step (micro-batch x sequence length)."""
        return self.seq_len * self.batch

    @property
    def tokens_per_step(self) -> int:
        """Tokens the whole job trains on per step: each data-parallel replica's (a pipeline's
        stages all see the same tokens)."""
        return self.tokens_per_gpu * (self.gpus // self.pp)

    @property
    def nodes(self) -> int:
        """Nodes the job spans (``GPUS_PER_NODE`` GPUs each)."""
        return max(1, math.ceil(self.gpus / GPUS_PER_NODE))


def attention_impl(model: dict[str, Any], task: str) -> str:
    """The attention implementation a job of ``task`` runs for catalog entry ``model``.

    ``attn_implementation`` in the catalog (a name, or a mapping task -> name) is what the
    harness asks transformers for; without it transformers picks ``sdpa`` (its default for
    every family that supports SDPA; ``PreTrainedModel.get_correct_attn_implementation``), which
    on H100/H200 in bf16 runs PyTorch's FlashAttention-2 kernel.
    """
    return catalog_attn_implementation(model, task) or "sdpa"


def _attention_kernels(job: JobSpec, ph: Physics, fwd_passes: int) -> list[Kernel]:
    """Attention of one step: fused (flash/flex) or eager with materialised S x S scores."""
    tok, d_attn = job.tokens_per_gpu, job.heads * job.head_dim
    qkv_bytes = ph.attn_io_bytes * tok * d_attn * job.layers * (fwd_passes + 2)
    if job.attention != "eager":
        # FlashAttention-2 (sdpa), flex_attention (torchtitan's gpt-oss, sinks through the LSE):
        # tiles in SRAM, causal (half the S x S products), backward recomputes the scores.
        attn_fwd = 4 * job.seq_len * d_attn / 2 * tok * job.layers
        return [
            Kernel(
                "attention",
                tensor_flops=attn_fwd * (fwd_passes + ph.attention_bwd_factor),
                efficiency=ph.attention_eff,
                dram_bytes=qkv_bytes,
            )
        ]
    # Eager (transformers' eager_attention_forward): QK^T and PV as batched GEMMs over the full
    # [B, H, S, S] matrix (the causal mask is added, not skipped): 4*S*d FLOPs per token and
    # layer forward, twice that backward (dQ, dK, dV, dP). Every score element crosses HBM.
    scores = tok * job.heads * job.seq_len * job.layers  # B*H*S*S per layer, all layers
    gemm_flops = 4 * job.seq_len * d_attn * tok * job.layers * (fwd_passes + 2)
    gemm_bytes = scores * (
        ph.eager_score_gemm_fwd_bytes * fwd_passes + ph.eager_score_gemm_bwd_bytes
    )
    chain = (
        (ph.eager_chain_fwd_bytes_compile, ph.eager_chain_bwd_bytes_compile)
        if job.compile
        else (ph.eager_chain_fwd_bytes, ph.eager_chain_bwd_bytes)
    )
    if not job.attention_sinks:  # no cat/slice of the sink column
        chain = (
            chain[0] - (0 if job.compile else ph.eager_sink_fwd_bytes),
            chain[1] - (0 if job.compile else ph.eager_sink_bwd_bytes),
        )
    chain_bytes = scores * (chain[0] * fwd_passes + chain[1])
    return [
        Kernel(
            "attention_gemm",
            tensor_flops=gemm_flops,
            efficiency=ph.dense_gemm_eff,
            dram_bytes=gemm_bytes + qkv_bytes,
        ),
        Kernel("attention_softmax", dram_bytes=chain_bytes, issue_bytes=chain_bytes),
    ]


def pipeline_stage(job: JobSpec) -> JobSpec:
    """What one GPU of a ``pp``-stage pipeline runs: ``layers / pp`` of the model and of every
    parameter count, embedding and LM head included (stages assumed balanced, as Perseus's
    profiled partitions make them), over all of its replica's tokens; the data-parallel group
    its collectives span is ``gpus / pp``. Stage-boundary sends (one activation and one gradient
    per token and hidden unit, bf16) are left out: BLOOM-3B's are ~0.1 % of its step at 246 GB/s."""
    if job.pp <= 1:
        return job
    if job.gpus % job.pp or job.microbatches < 1:
        raise ValueError(
            f"job {job.model}: pp {job.pp} must divide gpus {job.gpus}, microbatches >= 1"
        )
    k = job.pp
    return dataclasses.replace(
        job,
        layers=job.layers / k,
        total_params_b=job.total_params_b / k,
        active_params_b=job.active_params_b / k,
        expert_params_b=job.expert_params_b / k,
        vocab=job.vocab / k,
        gpus=job.gpus // k,
        pp=1,
        microbatches=1,
    )


def pipeline_bubble(job: JobSpec) -> float:
    """Idle time of a pipeline stage per unit of its busy time: GPipe and 1F1B schedules leave
    each stage idle for (pp - 1) micro-batch slots of the (m + pp - 1) a step takes (Narayanan
    et al. 2021, Megatron-LM, eq. 1: bubble fraction (p - 1) / m of the ideal time)."""
    return (job.pp - 1) / job.microbatches if job.pp > 1 else 0.0


def step_kernels(job: JobSpec, gpu: GPUSpec, physics: Physics = PHYSICS) -> list[Kernel]:
    """Kernel classes of one optimizer step on one GPU (see module docstring)."""
    ph = physics
    job = pipeline_stage(job)
    tok = job.tokens_per_gpu
    full = job.task == "pt"
    passes = (3 if full else 2) + (1 if job.grad_checkpointing else 0)
    fwd_passes = 1 + (1 if job.grad_checkpointing else 0)
    n_total = job.total_params_b * 1e9
    n_expert = job.expert_params_b * 1e9
    n_dense = n_total - n_expert
    # Embedding lookup is not a GEMM; the LM head is.
    n_dense_gemm = max(n_dense - job.vocab * job.hidden, 0.1 * n_dense)
    kernels: list[Kernel] = []

    # Dense GEMMs; weights read once per pass (bf16), activations streamed.
    kernels.append(
        Kernel(
            "dense_gemm",
            tensor_flops=2 * n_dense_gemm * tok * passes,
            efficiency=ph.dense_gemm_eff,
            dram_bytes=2 * n_dense_gemm * passes
            + ph.gemm_act_bytes * tok * job.hidden * job.layers * passes,
        )
    )
    if not full:
        kernels.append(_lora_linear_kernel(job, ph, tok, fwd_passes))
    kernels += _attention_kernels(job, ph, fwd_passes)
    if job.architecture == "moe" and job.experts:
        frac = job.experts_active / job.experts
        # Each GPU runs its local experts over the tokens routed to them; with EP the local
        # expert set shrinks by ep and the tokens per expert grow by ep.
        local_expert_weights = n_expert / job.ep
        pairs = tok * job.experts_active * job.layers  # routed (token, expert) pairs, all layers
        # The dense projections' GEMM class at a rate that falls with few rows per expert
        # (expert_gemm_rel_eff, grouped_gemm_m0_rows: fitted to DeepGEMM's grouped-GEMM table).
        rows_per_expert = tok * job.experts_active * job.ep / job.experts
        tile_fill = rows_per_expert / (rows_per_expert + ph.grouped_gemm_m0_rows)
        gemm_io = 2 * (2 * job.hidden + 3 * job.intermediate) * pairs * passes
        # LoRA on the fused experts (the harness's peft target_parameters, peft 0.21 ParamWrapper):
        # W' = W + s*lhs@rhs is a function of the trainable factors, so the backward also computes
        # the experts' full weight gradient dW' (one more grouped-GEMM pass than frozen experts),
        # and each forward folds the factors into every local expert (_LoraFactorsProxy's baddbmm).
        expert_passes = passes if full else passes + 1
        if not full:
            kernels.append(
                Kernel(
                    "lora_expert_fold",
                    tensor_flops=2 * local_expert_weights * job.lora_rank * (fwd_passes + 2),
                    efficiency=ph.lora_gemm_eff,
                    dram_bytes=local_expert_weights
                    * (ph.lora_fold_fwd_bytes * fwd_passes + ph.lora_fold_bwd_bytes),
                )
            )
        kernels.append(
            Kernel(
                "expert_gemm",
                tensor_flops=2 * n_expert * frac * tok * expert_passes,
                efficiency=ph.dense_gemm_eff * ph.expert_gemm_rel_eff * tile_fill,
                # weights read by the passes that use them; every pass streams its activations
                dram_bytes=2 * local_expert_weights * passes + gemm_io * expert_passes / passes,
            )
        )
        fwd_b, bwd_b = (
            (ph.route_fwd_bytes_compile, ph.route_bwd_bytes_compile)
            if job.compile
            else (ph.route_fwd_bytes, ph.route_bwd_bytes)
        )
        per_elem = (
            fwd_b * fwd_passes
            + bwd_b
            + (ph.ep_route_bytes * (fwd_passes + 1) if job.ep > 1 else 0.0)
        )
        route_bytes = per_elem * pairs * job.hidden
        kernels.append(Kernel("routing", dram_bytes=route_bytes, issue_bytes=route_bytes))
    # Element-wise, norms, activations, residuals, loss: bytes per hidden element per layer.
    per_elem = (ph.ew_bytes_compile if job.compile else ph.ew_bytes_eager) * (fwd_passes + 2)
    mlp_width = (
        job.experts_active * job.intermediate if job.architecture == "moe" else job.intermediate
    )
    ew_bytes = (
        tok * job.layers * (per_elem * job.hidden + ph.ew_mlp_bytes * mlp_width * (fwd_passes + 2))
    )
    ew_bytes += tok * job.vocab * ph.logits_bytes
    kernels.append(Kernel("elementwise", dram_bytes=ew_bytes, issue_bytes=ew_bytes))
    # AdamW over the local shard (fp32 master, m, v, grad read + write, bf16 copy).
    if full:
        kernels.append(
            Kernel(
                "optimizer",
                dram_bytes=ph.adamw_bytes * n_total / job.gpus,
                issue_bytes=ph.adamw_issue_bytes * n_total / job.gpus,
            )
        )
    # Collectives (bytes per GPU), clock independent, partly hidden behind compute.
    bw = (gpu.nvlink_gb_s if job.gpus <= GPUS_PER_NODE else gpu.internode_gb_s) * 1e9
    ring = (job.gpus - 1) / job.gpus
    fsdp_params = n_dense + n_expert / job.ep
    ag_bytes = 2 * fsdp_params * ring * (2 if job.grad_checkpointing or full else 1)
    rs_bytes = (
        2 * fsdp_params * ring
        if full
        else 4 * job.lora_rank * job.layers * job.hidden * ph.lora_rs_factor
    )
    a2a_bytes = 0.0
    if job.architecture == "moe" and job.ep > 1:
        # dispatch + combine, bf16, the (ep-1)/ep of the pairs whose expert is on another rank;
        # forward, the checkpointed recompute, and both again as gradients in the backward.
        a2a_bytes = (
            2
            * 2
            * tok
            * job.experts_active
            * job.hidden
            * (job.ep - 1)
            / job.ep
            * job.layers
            * (fwd_passes + 1)
        )
    kernels.append(Kernel("fsdp_comm", comm_s=(ag_bytes + rs_bytes) / bw))
    if a2a_bytes:
        kernels.append(Kernel("a2a_comm", comm_s=a2a_bytes / (gpu.nvlink_gb_s * 1e9)))
    launches = (
        (ph.launches_compile if job.compile else ph.launches_eager) * job.layers * (fwd_passes + 2)
    )
    kernels.append(Kernel("host", host_s=ph.host_base_s))
    kernels.append(Kernel("launch", launch_s=launches * ph.launch_s))
    return kernels


def lora_linear_dims(job: JobSpec) -> tuple[float, float]:
    """Summed input and output widths of the nn.Linear modules that carry LoRA adapters in one
    layer, as the harness targets them (``runs.training.models.lora_targets``): q, k, v, o, plus
    gate, up and down where the layer has a dense MLP (``JobSpec.lora_mlp_intermediate``)."""
    h, i = job.hidden, job.lora_mlp_intermediate
    q = job.heads * job.head_dim
    kv = (job.kv_heads or job.heads) * job.head_dim
    ins, outs = 3 * h + q, q + 2 * kv + h
    if i:
        ins, outs = ins + 2 * h + i, outs + 2 * i + h
    return float(ins), float(outs)


def _lora_linear_kernel(job: JobSpec, ph: Physics, tok: float, fwd_passes: int) -> Kernel:
    """peft's LoRA on the targeted nn.Linear modules: two rank-r GEMMs per module (2 r (in +
    out) FLOPs per token forward; the backward's input and weight gradients twice that), and
    the bytes counted from ``lora.Linear.forward`` (``Physics.lora_*_elems``): memory-bound at
    rank 32."""
    ins, outs = lora_linear_dims(job)
    out_fwd = ph.lora_out_elems_fwd_compile if job.compile else ph.lora_out_elems_fwd_eager
    elems = (ph.lora_in_elems_fwd * ins + out_fwd * outs) * fwd_passes + (
        ph.lora_in_elems_bwd * ins + ph.lora_out_elems_bwd * outs
    )
    return Kernel(
        "lora_gemm",
        tensor_flops=2 * job.lora_rank * (ins + outs) * tok * job.layers * (fwd_passes + 2),
        efficiency=ph.lora_gemm_eff,
        dram_bytes=2 * elems * tok * job.layers,
    )


def _overlap(name: str, physics: Physics) -> float:
    """Fraction of compute time behind which a collective can hide."""
    return {"fsdp_comm": physics.fsdp_overlap, "a2a_comm": physics.a2a_overlap}[name]


@dataclass
class Operating:
    """Steady state of one GPU at one SM clock."""

    sm_clock_mhz: float
    step_s: float
    power_w: float
    dram_active: float
    sm_active: float
    tensor_active: float
    gpu_util: float
    mem_copy_util: float


def operating_points(
    job: JobSpec,
    gpu: GPUSpec,
    leakage: float = 1.0,
    clocks: np.ndarray | None = None,
    physics: Physics = PHYSICS,
) -> dict[str, np.ndarray]:
    """Step time, average power and activity metrics at every SM clock bin (vectorised)."""
    f = gpu.clock_bins() if clocks is None else np.asarray(clocks, float)
    x = f / gpu.sm_clock_max_mhz
    ph = physics
    sm_dyn_w = ph.sm_dyn_w * ph.sm_dyn_scale
    v2 = voltage(x, ph) ** 2
    kernels = step_kernels(job, gpu, ph)
    compute = [k for k in kernels if not (k.comm_s or k.host_s or k.launch_s)]
    t_compute = sum(k.times(gpu, x, ph) for k in compute)
    energy = np.zeros_like(x)
    dram = np.zeros_like(x)
    sm = np.zeros_like(x)
    tensor = np.zeros_like(x)
    copy = np.zeros_like(x)
    for k in compute:
        t = k.times(gpu, x, ph)
        tu = (k.tensor_flops / gpu.tensor_flops_per_s(x)) / t if k.tensor_flops else 0.0
        du = (k.dram_bytes / (gpu.hbm_tb_s * 1e12)) / t if k.dram_bytes else 0.0
        busy = k.sm_activity(gpu, x, ph)
        p = (
            gpu.idle_w
            + gpu.mem_dyn_w * du
            + leakage * sm_dyn_w * x * v2 * (ph.sm_busy_weight * busy + ph.tensor_weight * tu)
        )
        energy += p * t
        dram += du * t
        sm += ph.sm_active_compute * t
        tensor += tu * t
        copy += np.minimum(1.0, ph.copy_per_dram * du) * t
    exposed = np.zeros_like(x)
    host_total = np.zeros_like(x)
    for k in kernels:
        if k.comm_s:
            exposed_k = np.maximum(0.0, k.comm_s - _overlap(k.name, ph) * t_compute)
            exposed = exposed + exposed_k
            # NCCL kernels keep a few SMs busy and move data through HBM.
            p = (
                gpu.idle_w
                + ph.nccl_extra_w
                + gpu.mem_dyn_w * ph.nccl_dram
                + leakage * sm_dyn_w * x * v2 * ph.nccl_sm
            )
            energy += p * exposed_k
            dram += ph.nccl_dram * exposed_k
            sm += ph.nccl_sm * exposed_k
            copy += ph.nccl_copy * exposed_k
        if k.host_s or k.launch_s:
            # CUDA launches are asynchronous: launch time shows only where it exceeds the GPU
            # work queued behind it; the per-step host work after the step's sync does not hide.
            host_k = k.host_s + np.maximum(0.0, k.launch_s - ph.launch_overlap * t_compute)
            exposed = exposed + host_k
            host_total = host_total + host_k
            energy += (
                gpu.idle_w + ph.host_extra_w + leakage * sm_dyn_w * x * v2 * ph.host_sm
            ) * host_k
    step = t_compute + exposed
    bubble = pipeline_bubble(job)
    if bubble:
        # the stage waits for the others' micro-batches: time that scales with theirs (the
        # same cap on every stage), at the power of a GPU waiting at a barrier
        wait = bubble * step
        energy += (gpu.idle_w + ph.barrier_extra_w) * wait
        step = step + wait
    return {
        "sm_clock_mhz": f,
        "step_s": step,
        "compute_s": t_compute,
        "power_w": energy / step,
        "dram_active": dram / step,
        "sm_active": sm / step,
        "tensor_active": tensor / step,
        "gpu_util": 100.0 * (t_compute + ph.comm_gpu_util * (exposed - host_total)) / step,
        "mem_copy_util": 100.0 * copy / step,
    }


def enforce_cap(points: dict[str, np.ndarray], cap_w: float) -> int:
    """Index of the highest clock bin whose step-average power fits under the cap."""
    fits = np.nonzero(points["power_w"] <= cap_w)[0]
    return int(fits[-1]) if fits.size else 0


@dataclass
class JobAtCap:
    """Synchronous data-parallel job on n GPUs at one cap: the slowest GPU sets the pace."""

    cap_w: float
    step_s: float
    tokens_per_s: float
    per_gpu: list[Operating] = field(default_factory=list)

    @property
    def power_w(self) -> float:
        """The job's power (W): the sum over its GPUs."""
        return float(sum(g.power_w for g in self.per_gpu))


def job_at_cap(
    job: JobSpec, gpu: GPUSpec, cap_w: float, leakages: np.ndarray, physics: Physics = PHYSICS
) -> JobAtCap:
    """Steady state of the whole job with every GPU capped at ``cap_w``."""
    return job_at_caps(job, gpu, [cap_w], leakages, physics=physics)[0]


def job_at_caps(
    job: JobSpec,
    gpu: GPUSpec,
    caps_w: Sequence[float],
    leakages: np.ndarray,
    physics: Physics = PHYSICS,
) -> list[JobAtCap]:
    """``job_at_cap`` at each cap; each GPU's operating points (cap-independent) computed once."""
    curves = [operating_points(job, gpu, leakage=float(leak), physics=physics) for leak in leakages]
    return [_synchronous_step(job, gpu, cap_w, curves, physics) for cap_w in caps_w]


def _synchronous_step(
    job: JobSpec, gpu: GPUSpec, cap_w: float, curves: list[dict[str, np.ndarray]], physics: Physics
) -> JobAtCap:
    return synchronous_step(
        job, gpu, cap_w, [(pts, enforce_cap(pts, cap_w)) for pts in curves], physics
    )


def synchronous_step(
    job: JobSpec,
    gpu: GPUSpec,
    cap_w: float,
    own: Sequence[tuple[dict[str, np.ndarray], int]],
    physics: Physics = PHYSICS,
) -> JobAtCap:
    """The job's step when each GPU runs at its own operating point (``own``: its curve and the
    index on it) and all meet at the barrier: the slowest sets the step."""
    step = max(pts["step_s"][i] for pts, i in own)
    # A faster GPU idles at the barrier; its average power and activity drop.
    wait_w = gpu.idle_w + physics.barrier_extra_w
    per_gpu = []
    for pts, i in own:
        wait = step - pts["step_s"][i]
        scale = pts["step_s"][i] / step
        per_gpu.append(
            Operating(
                sm_clock_mhz=float(pts["sm_clock_mhz"][i]),
                step_s=float(step),
                power_w=float((pts["power_w"][i] * pts["step_s"][i] + wait_w * wait) / step),
                dram_active=float(pts["dram_active"][i] * scale),
                sm_active=float(pts["sm_active"][i] * scale),
                tensor_active=float(pts["tensor_active"][i] * scale),
                gpu_util=float(pts["gpu_util"][i] * scale + 100 * (1 - scale)),
                mem_copy_util=float(pts["mem_copy_util"][i] * scale),
            )
        )
    return JobAtCap(
        cap_w=cap_w, step_s=float(step), tokens_per_s=job.tokens_per_step / step, per_gpu=per_gpu
    )


def gpu_leakages(seed: int, n: int, physics: Physics = PHYSICS) -> np.ndarray:
    """Per-GPU silicon variation of dynamic power, fixed per node set."""
    c = physics.leakage_clip
    return np.clip(np.random.default_rng(seed).normal(1.0, physics.leakage_sd, n), 1.0 - c, 1.0 + c)


def memory_footprint_gib(job: JobSpec, gpu: GPUSpec, physics: Physics = PHYSICS) -> float:
    """Framebuffer in use during training (bf16 weights, fp32 AdamW states, activations).
    Without checkpointing a layer keeps what the resource plan counts for it
    (``runs.plan.layer_activation_bytes``: bytes measured on real decoder layers per family and
    task, benchmarks/results/activation_bytes.md), so the two never disagree on a job's memory."""
    n_total = job.total_params_b * 1e9
    states = n_total * (2 + (16 if job.task == "pt" else 0)) / job.gpus
    if job.grad_checkpointing:
        acts = job.tokens_per_gpu * job.hidden * job.layers * physics.act_bytes_ckpt
    else:
        acts = job.layers * layer_activation_bytes(
            _plan_facts(job), job.task, job.seq_len, job.batch, job.attention, job.ep
        )
    return float(
        min(gpu.hbm_gib * physics.hbm_usable, (states + acts) / GIB + physics.framework_gib)
    )


def _plan_facts(job: JobSpec) -> dict[str, Any]:
    """The catalogue facts ``runs.plan`` reads for a layer's activation bytes."""
    return {
        "hf_model_type": job.family,
        "hidden": job.hidden,
        "heads": job.heads,
        "layers": job.layers,
        "vocab": job.vocab,
        "total_params_b": job.total_params_b,
        "expert_params_b": job.expert_params_b,
    }


def power_model_clock_for_cap(
    gpu: GPUSpec,
    cap_w: float,
    tensor_util: float | None = None,
    dram_util: float | None = None,
    physics: Physics = PHYSICS,
) -> float:
    """SM clock the model enforces for the calibration kernel (checks the H100 table fit)."""
    ph = physics
    tu = ph.calib_tensor_util if tensor_util is None else tensor_util
    du = ph.calib_dram_util if dram_util is None else dram_util
    f = gpu.clock_bins()
    x = f / gpu.sm_clock_max_mhz
    p = (
        gpu.idle_w
        + gpu.mem_dyn_w * du
        + ph.sm_dyn_w
        * ph.sm_dyn_scale
        * x
        * voltage(x, ph) ** 2
        * (ph.sm_busy_weight + ph.tensor_weight * tu)
    )
    fits = np.nonzero(p <= cap_w)[0]
    return float(f[fits[-1]]) if fits.size else float(f[0])
