"""The physics behind the emulated backend: a virtual H200/H100 running one training job.

Two models meet here.

**GPU power/DVFS model** (``GPUSpec``, ``power_w``). Board power of a kernel class at SM
clock ``f`` (``x = f / f_max``)::

    P = idle_w + mem_dyn_w * dram_util + sm_dyn_w * x * v(x)^2 * (0.30 * sm_busy + 0.70 * tensor_util)

``v(x) = v_min + (1 - v_min) * x**k`` is the normalised core voltage: flat at low clocks
(the voltage floor), rising steeply near the top of the DVFS curve. The memory clock does
not change under a power cap (the paper's mechanism, and what H100/H200 do), so memory-
bound work keeps its speed while the SM clock drops. A cap is enforced the way the
firmware does it: the highest SM clock (15 MHz bins) whose modelled step-average power
fits under the cap; realised power is at most the cap and below it when the job does not
need that much.

Calibration (global constants, never per group): the H100 SXM cap -> SM clock table of
Ujeniya et al. 2026 (arXiv:2604.11391), measured on a GEMM-heavy kernel
(200 W -> 625 MHz, 300 -> 1132, 400 -> 1501, 500 -> 1731, 600 -> 1889, 700 -> 1969).
A least-squares fit of the model above for a kernel mix at 30 % tensor-pipe activity and
20 % DRAM utilisation gives ``sm_dyn_w = 1257`` W, ``v_min = 0.798``, ``k = 7.63``, and
reproduces that table within 30 MHz. The source does not state its kernel's tensor
activity; 0.30 is our global choice. It puts uncapped dense LLM training (tensor activity
~0.6-0.7) at ~1.7 GHz under the 700 W limit, as seen on real H100/H200 nodes. With 0.45
instead, every group's PFI rises (dense median 1.59 instead of 1.23): this single constant
sets the absolute PFI level; the ordering across groups comes from the roofline. H200 idle power is
~75 W with ~42 W of it in memory (HBM3e); H200 and H100 share the GH100 die, so the SM
model is shared and they differ in HBM (4.8 vs 3.35 TB/s, 141 vs 80 GB) and memory power.
The SM-clock profiles of Perseus (SOSP'24; A100/A40, time and energy per micro-batch at
each locked clock; shipped in ``resources/external/perseus-sosp24``) show the same shape:
time ~ a + b/f for LLM stages, and power rising super-linearly near the top clock. No
benchmark compares the two quantitatively yet.

**Training-step roofline** (``JobSpec``, ``step_kernels``). One optimizer step per GPU is
split into kernel classes, each with tensor FLOPs, DRAM bytes and an SM issue cost, all
derived from the architecture (catalog facts), the task and the parallel layout:

* dense GEMMs (attention projections, dense MLP, LM head): ``2 * N * tokens`` per pass;
  3 passes for full training (forward, activation grads, weight grads), 2 for LoRA (the
  frozen weights get no weight-gradient GEMM), +1 with gradient checkpointing;
* flash attention: ``4 * S * d_attn / 2`` FLOPs per token per layer and pass (causal);
* routed-expert grouped GEMMs: FLOPs of the active experts, but bytes of *all* local
  experts' weights, and an efficiency that falls with the expert width (small GEMMs);
* element-wise / norm / routing permutation kernels: pure DRAM traffic (fewer bytes with
  torch.compile fusion), issue-limited when the SM clock is very low;
* AdamW (full training): ~36 bytes per local parameter;
* collectives: FSDP all-gathers / reduce-scatters and expert-parallel all-to-all over
  NVLink (<= 8 GPUs) or the inter-node fabric, overlapped with compute up to a fraction;
* host time per step (data loading, kernel launches; more launches without compile).

Compute-bound time scales with 1/f, memory and communication time do not; dense-vs-MoE
and PT-vs-LoRA differences in flexibility come out of these mechanics, not from labels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wattflex.gpus import GPUSpec

GIB = 1024**3

# Fitted once to the Ujeniya et al. H100 table (see module docstring).
V_MIN = 0.798
V_EXP = 7.63
SM_BUSY_WEIGHT = 0.30
TENSOR_WEIGHT = 0.70


def voltage(x: np.ndarray | float) -> np.ndarray | float:
    """Normalised core voltage at relative SM clock x."""
    return V_MIN + (1.0 - V_MIN) * np.power(x, V_EXP)


@dataclass(frozen=True)
class Kernel:
    """One class of work in a training step on one GPU."""
    name: str
    tensor_flops: float = 0.0      # bf16 tensor-core FLOPs
    efficiency: float = 0.75       # achievable fraction of peak tensor rate
    dram_bytes: float = 0.0
    issue_bytes: float = 0.0       # bytes whose handling costs SM issue slots (element-wise)
    comm_s: float = 0.0            # exposed communication time (clock-independent)
    host_s: float = 0.0            # GPU idle, waiting for the host

    def times(self, gpu: GPUSpec, x: np.ndarray) -> np.ndarray:
        t = np.zeros_like(x, dtype=float)
        if self.tensor_flops:
            t = np.maximum(t, self.tensor_flops / (gpu.peak_bf16_tflops * 1e12 * x * self.efficiency))
        if self.dram_bytes:
            t = np.maximum(t, self.dram_bytes / (gpu.hbm_tb_s * 1e12 * 0.80))
        if self.issue_bytes:
            # element-wise kernels issue ~2x HBM bandwidth worth of bytes/s at f_max
            t = np.maximum(t, self.issue_bytes / (2.0 * gpu.hbm_tb_s * 1e12 * x))
        return t + self.comm_s + self.host_s


@dataclass(frozen=True)
class JobSpec:
    """A training job as the emulator sees it (one sweep group)."""
    model: str
    architecture: str               # dense | moe
    task: str                       # pt | lora
    gpus: int
    seq_len: int
    batch: int                      # micro-batch per GPU (sequences)
    total_params_b: float
    active_params_b: float
    expert_params_b: float
    layers: int
    hidden: int
    heads: int
    head_dim: int
    intermediate: int
    vocab: int
    experts: int = 0
    experts_active: int = 0
    ep: int = 1
    compile: bool = True
    grad_checkpointing: bool = True
    lora_rank: int = 32

    @classmethod
    def from_config(cls, group: dict[str, Any], model: dict[str, Any]) -> "JobSpec":
        return cls(
            model=group["model"], architecture=model["architecture"], task=group["task"],
            gpus=int(group["gpus"]), seq_len=int(group["seq_len"]), batch=int(group["batch"]),
            total_params_b=float(model["total_params_b"]), active_params_b=float(model["active_params_b"]),
            expert_params_b=float(model.get("expert_params_b", 0.0)), layers=int(model["layers"]),
            hidden=int(model["hidden"]), heads=int(model["heads"]), head_dim=int(model["head_dim"]),
            intermediate=int(model["intermediate"]), vocab=int(model["vocab"]),
            experts=int(model.get("experts", 0) or 0), experts_active=int(model.get("experts_active", 0) or 0),
            ep=int(group.get("ep", 1)), compile=bool(group.get("compile", True)),
            grad_checkpointing=bool(group.get("grad_checkpointing", True)),
            lora_rank=int(group.get("lora_rank", 32)),
        )

    @property
    def tokens_per_gpu(self) -> int:
        return self.seq_len * self.batch

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.gpus / 8))


def step_kernels(job: JobSpec, gpu: GPUSpec) -> list[Kernel]:
    """Kernel classes of one optimizer step on one GPU (see module docstring)."""
    tok = job.tokens_per_gpu
    full = job.task == "pt"
    passes = (3 if full else 2) + (1 if job.grad_checkpointing else 0)
    fwd_passes = 1 + (1 if job.grad_checkpointing else 0)
    n_total = job.total_params_b * 1e9
    n_expert = job.expert_params_b * 1e9
    n_dense = n_total - n_expert
    # Embedding lookup is not a GEMM; the LM head is.
    n_dense_gemm = max(n_dense - job.vocab * job.hidden, 0.1 * n_dense)
    d_attn = job.heads * job.head_dim
    kernels: list[Kernel] = []

    # Dense GEMMs; weights read once per pass (bf16), activations streamed.
    kernels.append(Kernel("dense_gemm", tensor_flops=2 * n_dense_gemm * tok * passes, efficiency=0.70,
                          dram_bytes=2 * n_dense_gemm * passes + 4 * tok * job.hidden * job.layers * passes))
    # LoRA adapters: tiny extra GEMMs on q/k/v/o + MLP projections, all passes incl. weight grads.
    if not full:
        lora_params = job.layers * job.lora_rank * (4 * 2 * job.hidden + 3 * (job.hidden + job.intermediate))
        kernels.append(Kernel("lora_gemm", tensor_flops=2 * lora_params * tok * (passes + 1), efficiency=0.25,
                              dram_bytes=6 * tok * job.lora_rank * job.layers * 7 * passes))
    # Flash attention: causal, bwd ~2.5x fwd.
    attn_fwd = 4 * job.seq_len * d_attn / 2 * tok * job.layers
    kernels.append(Kernel("attention", tensor_flops=attn_fwd * (fwd_passes + 2.5), efficiency=0.55,
                          dram_bytes=2 * tok * 3 * d_attn * job.layers * (fwd_passes + 2)))
    if job.architecture == "moe" and job.experts:
        frac = job.experts_active / job.experts
        # Each GPU runs its local experts over the tokens routed to them; with EP the local
        # expert set shrinks by ep and the tokens per expert grow by ep.
        local_expert_weights = n_expert / job.ep
        width_eff = 0.78 * min(1.0, job.intermediate / 4096) ** 0.5
        kernels.append(Kernel("expert_gemm", tensor_flops=2 * n_expert * frac * tok * passes,
                              efficiency=width_eff,
                              dram_bytes=2 * local_expert_weights * passes
                              + 2 * tok * job.experts_active * (job.hidden + 2 * job.intermediate) * job.layers * passes))
        # Router, top-k, permutation / un-permutation (gather/scatter), fwd and bwd.
        route_bytes = 2 * tok * job.experts_active * job.hidden * job.layers * 6 * (fwd_passes + 1)
        kernels.append(Kernel("routing", dram_bytes=route_bytes, issue_bytes=route_bytes))
    # Element-wise, norms, activations, residuals, loss: bytes per hidden element per layer.
    per_elem = (22 if job.compile else 36) * (fwd_passes + 2)
    mlp_width = job.experts_active * job.intermediate if job.architecture == "moe" else job.intermediate
    ew_bytes = tok * job.layers * (per_elem * job.hidden + 6 * mlp_width * (fwd_passes + 2))
    ew_bytes += tok * job.vocab * 2 * 3  # logits, softmax, grad of logits
    kernels.append(Kernel("elementwise", dram_bytes=ew_bytes, issue_bytes=ew_bytes))
    # AdamW over the local shard (fp32 master, m, v, grad read + write, bf16 copy).
    if full:
        kernels.append(Kernel("optimizer", dram_bytes=36 * n_total / job.gpus, issue_bytes=18 * n_total / job.gpus))
    # Collectives (bytes per GPU), clock independent, partly hidden behind compute.
    bw = (gpu.nvlink_gb_s if job.gpus <= 8 else gpu.internode_gb_s) * 1e9
    ring = (job.gpus - 1) / job.gpus
    fsdp_params = n_dense + n_expert / job.ep
    ag_bytes = 2 * fsdp_params * ring * (2 if job.grad_checkpointing or full else 1)
    rs_bytes = 2 * fsdp_params * ring if full else 4 * job.lora_rank * job.layers * job.hidden * 14
    a2a_bytes = 0.0
    if job.architecture == "moe" and job.ep > 1:
        a2a_bytes = 2 * tok * job.experts_active * job.hidden * 4 * (job.ep - 1) / job.ep * job.layers / 8
    kernels.append(Kernel("fsdp_comm", comm_s=(ag_bytes + rs_bytes) / bw))
    if a2a_bytes:
        kernels.append(Kernel("a2a_comm", comm_s=a2a_bytes / (gpu.nvlink_gb_s * 1e9)))
    launches = (30 if job.compile else 70) * job.layers * (fwd_passes + 2)
    kernels.append(Kernel("host", host_s=0.012 + launches * 4e-6))
    return kernels


# Fraction of compute time behind which each collective can hide (FSDP prefetch overlaps
# well; expert-parallel all-to-all sits on the critical path).
_OVERLAP = {"fsdp_comm": 0.85, "a2a_comm": 0.25}


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


def operating_points(job: JobSpec, gpu: GPUSpec, leakage: float = 1.0,
                     clocks: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Step time, average power and activity metrics at every SM clock bin (vectorised)."""
    f = gpu.clock_bins() if clocks is None else np.asarray(clocks, float)
    x = f / gpu.sm_clock_max_mhz
    v2 = voltage(x) ** 2
    kernels = step_kernels(job, gpu)
    compute = [k for k in kernels if not (k.comm_s or k.host_s)]
    t_compute = sum(k.times(gpu, x) for k in compute)
    energy = np.zeros_like(x)
    dram = np.zeros_like(x)
    sm = np.zeros_like(x)
    tensor = np.zeros_like(x)
    copy = np.zeros_like(x)
    for k in compute:
        t = k.times(gpu, x)
        tu = (k.tensor_flops / (gpu.peak_bf16_tflops * 1e12 * x)) / t if k.tensor_flops else 0.0
        du = (k.dram_bytes / (gpu.hbm_tb_s * 1e12)) / t if k.dram_bytes else 0.0
        busy = 1.0
        p = gpu.idle_w + gpu.mem_dyn_w * du + leakage * gpu.sm_dyn_w * x * v2 * (SM_BUSY_WEIGHT * busy + TENSOR_WEIGHT * tu)
        energy += p * t
        dram += du * t
        sm += 0.92 * t
        tensor += tu * t
        copy += np.minimum(1.0, 1.6 * du) * t
    exposed = np.zeros_like(x)
    for k in kernels:
        if k.comm_s:
            exposed_k = np.maximum(0.0, k.comm_s - _OVERLAP[k.name] * t_compute)
            exposed = exposed + exposed_k
            # NCCL kernels keep a few SMs busy and move data through HBM.
            p = gpu.idle_w + 25 + gpu.mem_dyn_w * 0.15 + leakage * gpu.sm_dyn_w * x * v2 * 0.12
            energy += p * exposed_k
            dram += 0.15 * exposed_k
            sm += 0.12 * exposed_k
            copy += 0.2 * exposed_k
        if k.host_s:
            exposed = exposed + k.host_s
            energy += (gpu.idle_w + 15 + leakage * gpu.sm_dyn_w * x * v2 * 0.03) * k.host_s
    step = t_compute + exposed
    return {
        "sm_clock_mhz": f,
        "step_s": step,
        "compute_s": t_compute,
        "power_w": energy / step,
        "dram_active": dram / step,
        "sm_active": sm / step,
        "tensor_active": tensor / step,
        "gpu_util": 100.0 * (t_compute + 0.9 * (exposed - sum(k.host_s for k in kernels))) / step,
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
        return float(sum(g.power_w for g in self.per_gpu))


def job_at_cap(job: JobSpec, gpu: GPUSpec, cap_w: float, leakages: np.ndarray) -> JobAtCap:
    """Steady state of the whole job with every GPU capped at ``cap_w``."""
    own = []
    for leak in leakages:
        pts = operating_points(job, gpu, leakage=float(leak))
        own.append((pts, enforce_cap(pts, cap_w)))
    step = max(pts["step_s"][i] for pts, i in own)
    per_gpu = []
    for pts, i in own:
        wait = step - pts["step_s"][i]
        # A faster GPU idles at the barrier; its average power and activity drop.
        wait_w = gpu.idle_w + 20
        scale = pts["step_s"][i] / step
        per_gpu.append(Operating(
            sm_clock_mhz=float(pts["sm_clock_mhz"][i]), step_s=float(step),
            power_w=float((pts["power_w"][i] * pts["step_s"][i] + wait_w * wait) / step),
            dram_active=float(pts["dram_active"][i] * scale), sm_active=float(pts["sm_active"][i] * scale),
            tensor_active=float(pts["tensor_active"][i] * scale), gpu_util=float(pts["gpu_util"][i] * scale + 100 * (1 - scale)),
            mem_copy_util=float(pts["mem_copy_util"][i] * scale)))
    return JobAtCap(cap_w=cap_w, step_s=float(step), tokens_per_s=job.tokens_per_gpu * job.gpus / step, per_gpu=per_gpu)


def gpu_leakages(seed: int, n: int) -> np.ndarray:
    """Per-GPU silicon variation of dynamic power (sd 3 %), fixed per node set."""
    return np.clip(np.random.default_rng(seed).normal(1.0, 0.03, n), 0.9, 1.1)


def memory_footprint_gib(job: JobSpec, gpu: GPUSpec) -> float:
    n_total = job.total_params_b * 1e9
    states = n_total * (2 + (16 if job.task == "pt" else 0)) / job.gpus
    acts = job.tokens_per_gpu * job.hidden * job.layers * (2 if job.grad_checkpointing else 34)
    return float(min(gpu.hbm_gib * 0.95, (states + acts) / GIB + 6.0))


def power_model_clock_for_cap(gpu: GPUSpec, cap_w: float, tensor_util: float = 0.30, dram_util: float = 0.20) -> float:
    """SM clock the model enforces for the calibration GEMM (checks the H100 table fit)."""
    f = gpu.clock_bins()
    x = f / gpu.sm_clock_max_mhz
    p = gpu.idle_w + gpu.mem_dyn_w * dram_util + gpu.sm_dyn_w * x * voltage(x) ** 2 * (SM_BUSY_WEIGHT + TENSOR_WEIGHT * tensor_util)
    fits = np.nonzero(p <= cap_w)[0]
    return float(f[fits[-1]]) if fits.size else float(f[0])
