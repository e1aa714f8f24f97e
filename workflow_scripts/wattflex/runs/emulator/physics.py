"""The emulator's physics: every global constant (``Physics``, each with its source), the
calibration they take (``calibrated_physics``, ``physics_for_gpu``) and the voltage curve.

Never per group: a ``Physics`` applies to every job alike. How the constants enter the power
model and the step's roofline is in ``wattflex.runs.emulator.step``; how the fitted ones are
fitted is in ``wattflex.analysis.calibration``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wattflex.gpus import GPUSpec
from wattflex.runs.plan import FRAMEWORK_GIB, HBM_USABLE

# dense_gemm_eff as benchmarks/derive_gemm_efficiency.py derives it (tests/unit/runs/test_emulator_efficiency.py
# checks the emulator still reproduces the published throughput it was derived from)
DENSE_GEMM_EFF = 0.39


def _c(default: float, source: str, sensitivity: bool = True) -> Any:
    """A physics constant with its source (``sensitivity``: a +-25 % perturbation is meaningful)."""
    return field(default=default, metadata={"source": source, "sensitivity": sensitivity})


@dataclass(frozen=True)
class Physics:
    """Every global constant of the emulator's physics, one field each, with its source.

    Never per group: a ``Physics`` applies to every job alike. ``dataclasses.replace`` gives a
    perturbed copy (the fidelity report's sensitivity table); ``metadata["sensitivity"]`` is
    False where a +-25 % change is not a physical alternative (exponents of a fitted curve
    whose other parameters were fitted with them, bin sizes, clip bounds).
    """

    # --- SM power / voltage curve: the anchor (wattflex.analysis.calibration) and what it implies ---
    anchor_clock_mhz: float = _c(
        1680.0,
        "fitted on public measurements, never on the paper's tables: the SM clock a bf16 GEMM "
        "at tensor activity anchor_tensor_util holds under 700 W on the H100, carried over at "
        "the same fraction of f_max (0.848) from the A100 anchor (1195 MHz) fitted on the Perseus "
        "SOSP'24 A100 power-limit sweeps (measured draw and throughput per cap, "
        "resources/external/perseus-sosp24; wattflex.analysis.calibration.public_anchor), 5 MHz grid. "
        "The carry-over is assumed (each part's default limit holds such a GEMM at the same "
        "relative clock). A fixed point with dense_gemm_eff, which the A100 jobs use too. Replaces "
        "1505 MHz, fitted on Tables 7-8's PFIs",
        False,
    )
    sm_dyn_w: float = _c(
        1168.1,
        "fitted with the anchor (wattflex.analysis.calibration.fit_power_curve): SM dynamic power at "
        "f_max, v = 1, full activity, at which the anchor's GEMM draws 700 W on the H100. One die "
        "(GH100) for the three Hopper parts: no H200 power-clock table was found",
        False,
    )
    v_min: float = _c(
        0.729,
        "fitted (wattflex.analysis.calibration.fit_voltage_curve): normalised voltage floor, least "
        "squares of the measured non-memory draw against the measured SM clock of the Ujeniya "
        "et al. 2026 v2 reading (94 GB H100; resources/external/ujeniya2026-v2), on the draws, "
        "never the caps (647 W at the 700 W cap); residuals <= 1.4 W",
        False,
    )
    v_exp: float = _c(3.93, "fitted with v_min (above); exponent of the voltage rise", False)
    sm_busy_weight: float = _c(
        0.30,
        "assumed: share of SM dynamic power drawn by a busy SM with idle "
        "tensor pipes (issue, register file, L1)",
    )
    sm_stall_activity: float = _c(
        0.50,
        "assumed: issue activity of an SM whose warps wait on HBM (memory-bound "
        "kernels), relative to a fully issuing one; the SM term of a kernel follows its "
        "roofline: max(compute, issue) time over kernel time, floored at this (no "
        "published per-SM power split of a stalled SM was found)",
    )
    anchor_tensor_util: float = _c(
        0.70,
        "definition: the tensor activity of the anchor's reference kernel, a large "
        "bf16 GEMM (the earlier value, kept so the anchor and the fitted curve keep their "
        "meaning); not a training job's efficiency (dense_gemm_eff and the other per-class "
        "efficiencies below)",
        False,
    )
    tensor_weight: float = _c(
        0.70, "assumed: 1 - sm_busy_weight (tensor pipes at full activity)", False
    )
    calib_tensor_util: float = _c(
        0.174,
        "fitted with sm_dyn_w (above): the reading's workload's fitted SM power at f_max "
        "(492 W) in units of bf16 tensor activity, given the anchor. Its workload is disputed "
        "(wattflex.analysis.calibration.WORKLOAD_LABEL); only the calibration check reads it",
        False,
    )
    sm_dyn_scale: float = _c(
        1.0,
        "1 = sm_dyn_w as fitted (above); scales the SM dynamic power of every job "
        "alike, the knob through which the sensitivity table perturbs the calibration",
    )
    calib_dram_util: float = _c(
        0.20, "assumed: DRAM utilisation of the anchor's bf16 GEMM (compute-bound)"
    )
    # --- roofline rates ----------------------------------------------------------------
    hbm_efficiency: float = _c(
        0.80,
        "achievable fraction of HBM peak bandwidth for streaming kernels "
        "(STREAM-like copy on H100/H200 reaches ~80-90 % of datasheet)",
    )
    issue_bw_factor: float = _c(
        2.0,
        "assumed: element-wise kernels issue ~2x HBM bandwidth worth of "
        "bytes/s at f_max (issue-limited below ~half clock)",
    )
    dense_gemm_eff: float = _c(
        DENSE_GEMM_EFF,
        "derived (benchmarks/derive_gemm_efficiency.py): the achieved fraction "
        "of the bf16 peak at the running clock at which this emulator reproduces torchtitan's "
        "published 6,667 tokens/s per GPU (docs/performance.md, Table 1: Llama 3.1 8B, 8 H100 "
        "96 GB HBM2e at their 500 W default limit, FSDP + torch.compile, local batch 2, seq "
        "8192; 39 % MFU); Megatron-LM's published 47 % MFU (390 TFLOPS/GPU, GPT-3 175B, H100) "
        "bounds it from above for a tuned stack. Replaces the assumed 0.70",
    )
    expert_gemm_rel_eff: float = _c(
        1.04,
        "derived: grouped expert GEMMs at many rows per expert relative to the dense GEMM of the "
        "same N, K: least squares of a * M / (M + grouped_gemm_m0_rows) to the ten grouped-GEMM "
        "rows of DeepGEMM's README (deepseek-ai/DeepGEMM, H800, FP8; contiguous layout 4096-8192 "
        "rows per group: 1297/1304, 1099/1025, 1288/1304, 1093/1025 TFLOPS; masked layout "
        "256-1024 rows: 932-1233/1304, 815-925/1025), residuals <= 0.065. A kernel-level ratio; "
        "routing and all-to-all are modelled apart. Its carry-over from FP8 DeepGEMM to bf16 "
        "torch._grouped_mm (CUTLASS sm90) is assumed. Replaces 0.71, a whole-job Megatron-Core "
        "MoE/dense ratio that counted routing and all-to-all twice",
    )
    lora_gemm_eff: float = _c(
        0.25,
        "assumed: skinny rank-32 LoRA GEMMs (no published per-kernel figure found). It does not "
        "set their time: at rank r a LoRA GEMM does 2 r FLOPs per bf16 element of its input it "
        "reads (r = 32 FLOP/B), below the H100/H200 ridge (989 TFLOPS over 3.35-4.8 TB/s: "
        "206-295 FLOP/B), so HBM sets it at any efficiency above ~0.11 (the counted bytes "
        "lora_*_elems below)",
    )
    attention_eff: float = _c(
        0.35,
        "FlashAttention-3 paper (Shah et al. 2024, arXiv:2407.08608): FlashAttention-2, "
        "the kernel PyTorch sdpa runs on H100 in bf16, reaches 35 % of the H100's peak. "
        "Replaces the assumed 0.55",
    )
    attention_bwd_factor: float = _c(
        2.5, "FlashAttention-2 paper: backward ~2.5x forward FLOPs incl. recompute"
    )
    grouped_gemm_m0_rows: float = _c(
        105.0,
        "derived with expert_gemm_rel_eff (above, the same fit to DeepGEMM's README): the rows "
        "per expert at which a grouped GEMM runs at half its many-row rate (small expert shapes "
        "fill tiles and waves worse). Replaces half a 128-row CUTLASS tile (64), which the "
        "DeepGEMM rows contradict by up to 0.105",
    )
    # --- bytes per element -------------------------------------------------------------
    gemm_act_bytes: float = _c(
        4.0, "bf16 activation in + out per hidden element per layer and pass"
    )
    # LoRA on nn.Linear modules, elements (bf16, 2 B) per token and module, counted from peft
    # 0.22 lora.Linear.forward (`result = result + lora_B(lora_A(dropout(x))) * scaling`, dropout
    # an Identity at the harness's lora_dropout 0) and its autograd backward; rank-sized tensors
    # (r = 32 of thousands) are left out. Which modules carry adapters: the harness's
    # models.lora_targets (attention projections; MLP projections only where the model has a
    # dense MLP: benchmarks/results/lora_targets.md).
    lora_in_elems_fwd: float = _c(
        1.0, "counted (above): lora_A reads the module input x once more", False
    )
    lora_in_elems_bwd: float = _c(
        5.0,
        "counted (above): dA = dt^T x reads x (1), dx = dt A written (1), added to the base "
        "layer's input gradient (read 2, write 1)",
        False,
    )
    lora_out_elems_fwd_eager: float = _c(
        6.0,
        "counted (above): lora_B writes u (1), `* scaling` reads and writes it (2), "
        "`result +` reads two and writes one (3)",
        False,
    )
    lora_out_elems_fwd_compile: float = _c(
        4.0,
        "counted (above), with torch.compile: the scaling and the add fuse into one pointwise "
        "kernel after lora_B's extern GEMM (write u 1, read u and result, write 3)",
        False,
    )
    lora_out_elems_bwd: float = _c(
        4.0,
        "counted (above): the grad of `* scaling` reads and writes the output grad (2); "
        "dB and dt each read it (2)",
        False,
    )
    attn_io_bytes: float = _c(
        6.0, "bf16 q, k, v read per attention element per pass (flash: no S^2 traffic)"
    )
    # Eager attention, bytes per score element (bf16, 2 B) counted from the ops of transformers
    # 5.24 gpt_oss eager_attention_forward and their autograd backward (PyTorch 2.x kernels):
    #   GEMMs fwd: QK^T writes the logits (2), PV reads the probs (2)                      = 4
    #   GEMMs bwd: dP = dO V^T writes (2), dV reads P (2), dQ and dK read dS (2 + 2)       = 8
    #   chain fwd, eager: *scaling r+w (4), +mask r+r+w (6), cat sinks r+w (4), max r (2),
    #     -max r+w (4), softmax r+w (4), [..., :-1] made contiguous for PV r+w (4)          = 28
    #   chain fwd, compiled layer (inductor fuses the pointwise/reduction chain into one
    #     persistent-reduction kernel): read logits (2), read the bf16 mask (2), write P (2)  = 6
    #   chain bwd, eager: slice grad zeros+copy (6), softmax_backward r P, r dP, w (6),
    #     max grad: sum (2) + zeros/scatter (2) + grad accumulation r+r+w (6), *scaling (4)   = 26
    #   chain bwd, compiled: read P, read dP, write dS (6)                                  = 6
    # Without sinks (other families run eagerly) the cat (4) and slice copy (4) fwd and the
    # slice grad (6) bwd are absent. Compiled, with activation checkpointing (forward twice):
    # 2 x (4 + 6) + (8 + 6) = 34 B per score element per step.
    eager_score_gemm_fwd_bytes: float = _c(
        4.0, "counted: QK^T writes logits, PV reads probs (bf16)", False
    )
    eager_score_gemm_bwd_bytes: float = _c(
        8.0, "counted: dP write, P read for dV, dS read for dQ and dK", False
    )
    eager_chain_fwd_bytes: float = _c(
        28.0, "counted: eager softmax chain with sinks, forward (see above)"
    )
    eager_chain_bwd_bytes: float = _c(
        26.0, "counted: eager softmax chain with sinks, backward (see above)"
    )
    eager_chain_fwd_bytes_compile: float = _c(6.0, "counted: inductor-fused softmax chain, forward")
    eager_chain_bwd_bytes_compile: float = _c(6.0, "counted: inductor-fused softmax backward")
    eager_sink_fwd_bytes: float = _c(
        8.0, "counted: sink cat + slice copy, forward (eager only)", False
    )
    eager_sink_bwd_bytes: float = _c(
        6.0, "counted: slice grad zeros + copy, backward (eager only)", False
    )
    # Routing bytes per routed (token, expert) hidden element, counted from transformers 5.24
    # integrations/moe.py grouped_mm_experts_forward and its autograd backward (bf16, 2 B):
    #   fwd eager: gather hidden_states[perm // k] r+w (4), * routing weights r+w (4),
    #     [inv_perm] r+w (4), view(..., k, d).sum(1) r (2)                                  = 14
    #   fwd compiled (layer compiled): the gather is materialised as the grouped GEMM input
    #     (4); weighting, inverse permutation and the top-k sum fuse into one read (2)       = 6
    #   bwd eager: inverse-permutation grad zeros + index_put r+w (6), weighting grads: input
    #     grad r+w (4), weight grad product + sum (8), gather grad index_put r+w (4)        = 22
    #   bwd compiled: read proj_out and write its grad (4), gather grad accumulate r+w (4)   = 8
    # The grouped GEMMs' own activations (up reads d, writes 2I; down reads I, writes d per
    # pair and pass) are in the expert GEMM kernel; the gate activation is in element-wise.
    route_fwd_bytes: float = _c(
        14.0, "counted: routing bytes per routed element, forward, eager (above)"
    )
    route_bwd_bytes: float = _c(
        22.0, "counted: routing bytes per routed element, backward, eager (above)"
    )
    route_fwd_bytes_compile: float = _c(
        6.0, "counted: routing bytes per routed element, forward, compiled"
    )
    route_bwd_bytes_compile: float = _c(
        8.0, "counted: routing bytes per routed element, backward, compiled"
    )
    lora_fold_fwd_bytes: float = _c(
        4.0,
        "counted: peft 0.21.2 ParamWrapper/_LoraFactorsProxy, LoRA on fused bf16 experts: "
        "each forward's baddbmm reads W and writes W' = W + s*lhs@rhs, per expert weight",
        False,
    )
    lora_fold_bwd_bytes: float = _c(
        6.0,
        "counted: the same backward: dW' written by the grouped GEMM's weight gradient, "
        "read twice by baddbmm's backward (d lhs, d rhs), per expert weight",
        False,
    )
    ep_route_bytes: float = _c(
        8.0,
        "counted: transformers 5.24 distributed/expert_parallel.py: send gather r+w (4) "
        "and combine scatter token_outputs[order] r+w (4) per routed element and pass",
    )
    ew_bytes_compile: float = _c(
        22.0,
        "assumed: element-wise bytes per hidden element per layer and pass with torch.compile fusion",
    )
    ew_bytes_eager: float = _c(
        36.0, "assumed: the same without compile (unfused norms, residuals, rotary)"
    )
    ew_mlp_bytes: float = _c(6.0, "assumed: activation (SiLU/GLU) bytes per MLP element per pass")
    logits_bytes: float = _c(6.0, "bf16 logits written, softmax read, logit grads written")
    adamw_bytes: float = _c(
        36.0, "AdamW per parameter: fp32 master, m, v read+write, grad read, bf16 copy"
    )
    adamw_issue_bytes: float = _c(
        18.0, "assumed: share of the AdamW bytes that costs SM issue slots"
    )
    # --- communication -----------------------------------------------------------------
    lora_rs_factor: float = _c(
        14.0, "assumed: LoRA gradient reduce-scatter bytes per rank*hidden per layer (/4 B)"
    )
    fsdp_overlap: float = _c(
        0.85, "assumed: fraction of compute time behind which FSDP prefetch hides"
    )
    a2a_overlap: float = _c(
        0.0,
        "transformers 5.24 expert_parallel.py: split sizes by .tolist() (a host sync), "
        "the experts wait on the received rows (_WaitTensor), combine waits on the experts: "
        "no compute runs beside the all-to-all",
        False,
    )
    nccl_extra_w: float = _c(
        25.0, "assumed: board power above idle of NCCL kernels (a few SMs, NVLink)"
    )
    nccl_dram: float = _c(0.15, "assumed: DRAM activity during collectives")
    nccl_sm: float = _c(0.12, "assumed: SM activity of NCCL kernels")
    nccl_copy: float = _c(0.20, "assumed: memory-copy utilisation during collectives")
    # --- host ---------------------------------------------------------------------------
    host_base_s: float = _c(
        0.012, "assumed: per-step host time (data loading, optimizer bookkeeping)"
    )
    launches_compile: float = _c(
        30.0, "assumed: kernel launches per layer and pass with torch.compile"
    )
    launches_eager: float = _c(70.0, "assumed: kernel launches per layer and pass eager")
    launch_s: float = _c(
        4e-6, "CUDA kernel launch overhead ~4 us (PyTorch eager dispatch + cudaLaunchKernel)"
    )
    launch_overlap: float = _c(
        1.0,
        "CUDA C Programming Guide, Asynchronous Concurrent Execution: kernel launches "
        "return before the kernel completes, so launch time hides behind queued GPU work "
        "(1 = all of a step's GPU work; an upper bound, hence no +25 %)",
        False,
    )
    host_extra_w: float = _c(
        15.0, "assumed: board power above idle while the GPU waits for the host"
    )
    host_sm: float = _c(0.03, "assumed: SM activity while waiting for the host")
    # --- telemetry / activity -----------------------------------------------------------
    sm_active_compute: float = _c(0.92, "assumed: DCGM SM-active fraction during compute kernels")
    copy_per_dram: float = _c(
        1.6, "assumed: DCGM mem-copy utilisation per unit of DRAM activity", False
    )
    comm_gpu_util: float = _c(0.9, "assumed: NVML GPU util counts NCCL kernels as busy", False)
    barrier_extra_w: float = _c(
        20.0, "assumed: power above idle of a GPU spinning at a collective barrier"
    )
    # --- per-GPU variation and memory footprint ----------------------------------------
    leakage_sd: float = _c(
        0.03, "assumed: silicon-to-silicon sd of dynamic power (few % in GPU fleet studies)"
    )
    leakage_clip: float = _c(0.10, "clip of the per-GPU leakage factor at 1 +- this", False)
    hbm_usable: float = _c(
        HBM_USABLE, "fraction of HBM the caching allocator can hand out (runs.plan)", False
    )
    act_bytes_ckpt: float = _c(2.0, "bf16 checkpointed layer input per hidden element", False)
    framework_gib: float = _c(
        FRAMEWORK_GIB,
        "assumed: CUDA context, NCCL buffers, allocator slack (GiB; runs.plan)",
        False,
    )


PHYSICS = Physics()
DEFAULT_DIE = (
    "GH100"  # the die PHYSICS's power curve is fitted for (the H100 table and the anchor above)
)
# The constants a calibration (wattflex.analysis.calibration.Calibration, a calibration file) sets.
CALIBRATED = ("anchor_clock_mhz", "sm_dyn_w", "v_min", "v_exp", "calib_tensor_util")


def calibrated_physics(calibration: dict[str, Any] | None, base: Physics = PHYSICS) -> Physics:
    """``base`` with the anchor and power curve of a calibration file's JSON (None: ``base``)."""
    if not calibration:
        return base
    curve = calibration["curve"]
    return dataclasses.replace(
        base,
        anchor_clock_mhz=float(calibration["anchor_clock_mhz"]),
        **{k: float(curve[k]) for k in CALIBRATED[1:]},
    )


def physics_for_gpu(
    gpu: GPUSpec, calibration: dict[str, Any] | None, base: Physics = PHYSICS
) -> Physics:
    """:func:`calibrated_physics` for a run on ``gpu``: a calibration fitted on another die's
    sweeps is refused, and so is a part whose die has no default power curve (``PHYSICS`` is
    fitted on GH100 facts) when no calibration of its die is given."""
    die = str((calibration or {}).get("gpu_die", DEFAULT_DIE))
    if gpu.die != die:
        how = (
            "no calibration is given"
            if not calibration
            else f"emulator.calibration was fitted on {die} sweeps ({calibration.get('source', '?')})"
        )
        raise ValueError(
            f"the emulator has no power curve for {gpu.name} ({gpu.die} die): {how}; fit one with "
            f"`wattflex calibrate --runs <sweeps measured on {gpu.name}>` and set emulator: "
            "{calibration: FILE}"
        )
    return calibrated_physics(calibration, base)


def voltage(x: np.ndarray | float, physics: Physics = PHYSICS) -> np.ndarray | float:
    """Normalised core voltage at relative SM clock x."""
    return physics.v_min + (1.0 - physics.v_min) * np.power(x, physics.v_exp)
