# From NVIDIA/Megatron-LM megatron/training/training.py
# at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22),
# copied unchanged by tests/data/logs/megatron/make_lines.py extract: the file's
# stdlib and torch imports, then:
# logging.basicConfig, print_datetime, num_floating_point_operations, training_log, evaluate, evaluate_and_print_results.
# The file's notice: Copyright (c) 2025 NVIDIA CORPORATION & AFFILIATES. All rights reserved.

import time
import argparse
import copy
import dataclasses
import functools
import gc
import inspect
import logging
import math
import os
import sys
from collections import defaultdict
from contextlib import nullcontext
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Dict, Optional, Tuple
import torch
import torch.distributed


logging.basicConfig(handlers=[CustomHandler()], level=logging.INFO)


def print_datetime(string, override_timestamp=None):
    """Note that this call will sync across all ranks. Use override_timestamp if provided;
       otherwise use current timestamp."""
    torch.distributed.barrier()
    if override_timestamp is None:
        time_str = datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')
    else:
        time_str = datetime.fromtimestamp(override_timestamp).strftime('%Y-%m-%d %H:%M:%S.%f')
    print_rank_0(f'[{string}] datetime: {time_str} ')


def num_floating_point_operations(
    args,
    batch_size,
    seqlen_squared_sum_in_batch=None,
    total_real_tokens_in_batch=None,
):
    """Compute the number of floating-point operations for one global batch.

    Args:
        args: Megatron args (provides hidden size, num layers, seq length, ...).
        batch_size: Global batch size (samples per iteration). Only used to
            compute the default token counts for the BSHD path -- with THD
            both ``total_real_tokens_in_batch`` and ``seqlen_squared_sum_in_batch``
            are passed in explicitly and ``batch_size`` is irrelevant.
        seqlen_squared_sum_in_batch: ``sum_i(L_i ** 2)`` across all REAL
            (unpadded) sub-sequences in the global batch. Drives the
            core-attention L^2 FLOPs. For BSHD this equals
            ``batch_size * args.seq_length ** 2`` (the default when ``None``).
            For THD it is the actual ragged sum and is strictly less than the
            BSHD value, reflecting per-chunk causal masking AND the fact that
            padding tokens do not contribute to attention scores.
        total_real_tokens_in_batch: ``sum_i(L_i)``, the TOTAL REAL (unpadded)
            token count across the global batch. Drives all token-linear FLOPs
            (QKV+output projections, MLP, MoE, MTP norms/projs, logits). For
            BSHD this equals ``batch_size * args.seq_length`` (the default when
            ``None``). For THD it equals the real token count -- strictly less
            than ``batch_size * args.seq_length`` whenever the dataloader added
            CP-alignment padding or end-of-sequence padding, so neither kind of
            padding shows up in the reported FLOPs.
    """
    # Defaults: BSHD layout assumption (full causal mask, every sample length =
    # seq_length, no padding). For BSHD ``total_real_tokens = batch * s`` and
    # ``seqlen_squared_sum = batch * s^2`` recover the original closed-form.
    if seqlen_squared_sum_in_batch is None:
        seqlen_squared_sum_in_batch = batch_size * args.seq_length * args.seq_length
    if total_real_tokens_in_batch is None:
        total_real_tokens_in_batch = batch_size * args.seq_length

    def mlp_layer_flops(total_tokens, hidden_size, expansion=4.0, swiglu=False):
        """Calculate FLOPs for an MLP layer."""
        scale_factor = 3.0 / 2.0 if swiglu else 1.0
        return 4 * expansion * scale_factor * total_tokens * hidden_size**2

    def moe_layer_flops(total_tokens, hidden_size, moe_ffn_hidden_size,
                        shared_expert_ffn_hidden_size, num_experts_routed_to,
                        moe_latent_size=None, swiglu=False):
        """Calculate FLOPs for an MoE layer."""
        scale_factor = 3.0 / 2.0 if swiglu else 1.0
        if moe_latent_size is None:
            routed_flops = (4 * total_tokens * hidden_size *
                            moe_ffn_hidden_size * num_experts_routed_to * scale_factor)
        else:
            # Routed experts run on moe_latent_size.
            routed_flops = (4 * total_tokens * moe_latent_size *
                            moe_ffn_hidden_size * num_experts_routed_to * scale_factor)
            # Up proj and down proj.
            routed_flops += (4 * total_tokens * hidden_size * moe_latent_size)
        shared_flops = 4 * total_tokens * hidden_size * shared_expert_ffn_hidden_size * scale_factor
        return routed_flops + shared_flops

    def attn_layer_flops(
        total_tokens, seqlen_squared_sum, hidden_size, num_heads, gqa=True,
        gqa_groups=8, kv_channels=None,
    ):
        """Calculate FLOPs for an attention layer.

        Two parts:
          - Token-linear (QKV + output projections): scales with ``total_tokens``
            (= ``sum_i(L_i)``). Padding tokens are excluded by passing the real
            (unpadded) token count.
          - Core attention (``QK^T`` and ``softmax(QK^T) V``): scales with
            ``seqlen_squared_sum`` (= ``sum_i(L_i ** 2)``).
        """
        p = (kv_channels * num_heads / hidden_size) if kv_channels else 1
        g = gqa_groups if gqa else num_heads
        # 4 * total_tokens * h * p * (h + h*(g/n)): QKV + output projections (fwd*3, with FMA*2).
        # 2 * sum(L^2) * h * p: core attention (causal mask -> /2 cancels with FMA *2).
        return (
            4 * total_tokens * hidden_size * p
            * (hidden_size + hidden_size * (g / num_heads))
            + 2 * seqlen_squared_sum * hidden_size * p
        )

    def mamba_layer_flops(total_tokens, hidden_size, state_dim=16,
                          head_dim=64, num_groups=1, num_heads=128):
        """Calculate FLOPs for a Mamba layer."""
        # Note (rwaleffe): flops estimate for scan should be updated based on new SSD kernels,
        # but small percent of overall layer flops
        d_in = 2 * hidden_size
        if num_heads:
            nheads = num_heads
        else:
            nheads = d_in // head_dim
        return (
            (
                2
                * total_tokens
                * hidden_size
                * (2 * d_in + 2 * num_groups * state_dim + nheads)
            )  # in_proj
            + (7 * total_tokens * d_in * state_dim)  # scan
            + (2 * total_tokens * d_in * hidden_size)  # out_proj
        )

    def gated_delta_product_layer_flops(
        total_tokens,
        hidden_size,
        num_householder,
        state_dim=128,
        head_dim=64,
        num_groups=8,
        num_heads=None,
        conv_kernel_dim=4,
    ):
        """Calculate FLOPs for a Gated Delta Product (GDP) layer."""
        if num_heads is None:
            d_inner = 2 * hidden_size
            num_heads = d_inner // head_dim
        else:
            d_inner = num_heads * head_dim
        in_proj_dim = (
            d_inner * (1 + num_householder)
            + num_groups * state_dim * (1 + num_householder)
            + num_heads * (1 + num_householder)
        )
        conv_dim = d_inner * num_householder + num_groups * state_dim * (1 + num_householder)
        non_core_flops = 2 * total_tokens * (
            hidden_size * in_proj_dim
            + conv_kernel_dim * conv_dim
            + d_inner * hidden_size
        )
        # Best-case recurrent GDP core estimate. The FLA chunk kernel may do additional
        # score/solve/WY work, but this keeps the implementation-agnostic lower bound explicit.
        core_flops = (4 * num_householder + 3) * total_tokens * d_inner * state_dim
        return non_core_flops + core_flops

    def gdn_layer_flops(total_tokens, hidden_size,
                        qk_head_dim=128, v_head_dim=128,
                        num_qk_heads=16, num_v_heads=32,
                        conv_kernel_dim=4, use_gdn2=False):
        """Calculate FLOPs for a Gated Delta Net (GDN) layer."""
        qk_dim = qk_head_dim * num_qk_heads
        v_dim = v_head_dim * num_v_heads
        if use_gdn2:
            # GDN2 in_proj: hidden_size -> (4*qk_dim + 3*v_dim) for q, k, v, z, f, b, w
            in_proj_dim = 4 * qk_dim + 3 * v_dim
        else:
            # GDN in_proj: hidden_size -> (2*qk_dim + 2*v_dim + 2*num_v_heads)
            in_proj_dim = 2 * qk_dim + 2 * v_dim + 2 * num_v_heads
        return (
            2 * total_tokens * (
                # in_proj
                hidden_size * in_proj_dim
                # conv1d
                + conv_kernel_dim * (2 * qk_dim + v_dim)
                # gated delta rule: KK^T, VK^T, S(a(I-bKK^T)), and SQ
                + num_v_heads * (v_head_dim ** 2) * 4
                # out_proj: v_dim -> hidden_size
                + hidden_size * v_dim
            )
        )

    def hybrid_flops(total_tokens, seqlen_squared_sum, hidden_size,
                     num_attn_layers, num_mamba_layers, num_mlp_layers, num_moe_layers,
                     gdp_num_householder,
                     num_gdn_layers=0,
                     mamba_state_dim=128, mamba_head_dim=64,
                     mamba_num_groups=8, mamba_num_heads=128,
                     num_attn_heads=32, gqa=True,
                     gqa_groups=8, kv_channels=None,
                     mlp_expansion=4.0, swiglu=False,
                     moe_latent_size=None,
                     moe_ffn_hidden_size=2048, shared_expert_ffn_hidden_size=2048, num_experts_routed_to=1,
                     use_gated_delta_product=False,
                     gdn_qk_head_dim=128, gdn_v_head_dim=128,
                     gdn_num_qk_heads=16, gdn_num_v_heads=32,
                     gdn_conv_kernel_dim=4, gdn_use_gdn2=False,
                     vocab_size=256000, mtp_num_layers=0):
        """Calculate total FLOPs for the hybrid model."""
        mamba_flops = (
            gated_delta_product_layer_flops(total_tokens, hidden_size,
                                            gdp_num_householder,
                                            mamba_state_dim, mamba_head_dim,
                                            mamba_num_groups, mamba_num_heads)
            if use_gated_delta_product
            else mamba_layer_flops(total_tokens, hidden_size,
                                   mamba_state_dim, mamba_head_dim,
                                   mamba_num_groups, mamba_num_heads)
        )
        flops_fwd = (
                num_attn_layers * attn_layer_flops(total_tokens, seqlen_squared_sum,
                                                   hidden_size, num_attn_heads, gqa,
                                                   gqa_groups, kv_channels) +
                num_mlp_layers * mlp_layer_flops(total_tokens, hidden_size,
                                                 mlp_expansion, swiglu) +
                num_mamba_layers * mamba_flops +
                num_moe_layers * moe_layer_flops(total_tokens, hidden_size, moe_ffn_hidden_size,
                                                 shared_expert_ffn_hidden_size, num_experts_routed_to,
                                                 moe_latent_size, swiglu) +
                num_gdn_layers * gdn_layer_flops(total_tokens, hidden_size,
                                                  gdn_qk_head_dim, gdn_v_head_dim,
                                                  gdn_num_qk_heads, gdn_num_v_heads,
                                                  gdn_conv_kernel_dim, gdn_use_gdn2) +
                (2 * total_tokens * hidden_size * vocab_size * (1 + mtp_num_layers))  # logits computation
        )
        return flops_fwd * 3

    def transformer_flops():
        """Calculate FLOPs for a standard Transformer model."""
        # TODO(helenn/dnarayanan): Refactor this to reuse the helper methods.
        # Group Query Attention.
        if not args.group_query_attention:
            args.num_query_groups = args.num_attention_heads
        # MoE.
        if args.num_experts is None:
            # Every Transformer MLP is dense.
            num_dense_layers = args.num_layers
            num_moe_layers = 0
            num_experts_routed_to = 0
            last_layer_is_moe = 0
        else:
            # Calculate number of dense and MoE Transformer MLPs.
            if isinstance(args.moe_layer_freq, int):
                moe_layer_pattern = [
                    1 if (i % args.moe_layer_freq == 0) else 0 for i in range(args.num_layers)
                ]
            elif isinstance(args.moe_layer_freq, list):
                moe_layer_pattern = args.moe_layer_freq
            else:
                raise RuntimeError("Illegal --moe-layer-freq argument provided!")
            assert len(moe_layer_pattern) == args.num_layers, (
                f"Invalid length of moe_layer_pattern: {len(moe_layer_pattern)}, "
                f"expected {args.num_layers}, "
                f"current moe layer pattern: {args.moe_layer_freq}"
            )
            num_moe_layers = sum(moe_layer_pattern)  # Number of 1s in `moe_layer_pattern`.
            num_dense_layers = args.num_layers - num_moe_layers
            num_experts_routed_to = args.moe_router_topk
            last_layer_is_moe = moe_layer_pattern[-1]

        if args.mtp_num_layers is not None:
            mtp_num_layers = args.mtp_num_layers
            num_moe_layers += last_layer_is_moe * mtp_num_layers
            num_dense_layers += (1 - last_layer_is_moe) * mtp_num_layers
            num_layers = args.num_layers + mtp_num_layers
        else:
            mtp_num_layers = 0
            num_layers = args.num_layers

        moe_ffn_hidden_size = (
            args.moe_ffn_hidden_size
            if args.moe_ffn_hidden_size is not None
            else args.ffn_hidden_size
        )
        moe_latent_size = args.moe_latent_size
        shared_expert_ffn_hidden_size = (
            0
            if args.moe_shared_expert_intermediate_size is None
            else args.moe_shared_expert_intermediate_size
        )

        # - 3x: Each GEMM in the model needs to be performed 3 times (forward pass,
        #       backward wgrad [weight gradient], backward dgrad [data gradient]).
        forward_backward_expansion_factor = 3
        # - 2x: A GEMM of a m*n tensor with a n*k tensor requires 2mnk floating-point operations.
        fma_expansion_factor = 2
        # - 3x (SwiGLU enabled): h->2*ffn_h GEMM and ffn_h->h GEMM are stacked.
        # - 2x (SwiGLU disabled): h->ffn_h GEMM and ffn_h->h GEMM are stacked.
        ffn_expansion_factor = 3 if args.swiglu else 2

        # self_attn is split into a token-linear part (projections, multiplied by
        # ``batch_size * args.seq_length`` like all other token-linear work) and a
        # core-attention part (``QK^T`` and ``softmax(QK^T) V``) whose compute scales
        # with ``sum_i(L_i ** 2)`` instead of ``batch * seq^2``. With unpacked BSHD the
        # two are equal, so the BSHD result is unchanged. With THD/packed sequences
        # ``seqlen_squared_sum_in_batch`` is strictly smaller, reflecting the per-chunk
        # causal mask of packed attention.
        if args.multi_latent_attention:
            assert not args.group_query_attention
            '''
            Basic arithmetic
            let B is batch size, s is seq_len, h is embedding dim,
            for one self_attnetion block (prenorm is not included)
            qkv projection:  6Bsh^2
            attn:            2Bs^2h
            attn over value: 2Bs^2h
            oproj:           2Bsh^2

            references
            https://arxiv.org/abs/2305.10403
            https://arxiv.org/abs/2205.05198
            '''
            ## MLA
            if args.q_lora_rank is None:
                q_term = (
                    args.hidden_size
                    * args.num_attention_heads
                    * (args.qk_head_dim + args.qk_pos_emb_head_dim)
                )
            else:
                q_term = args.q_lora_rank * (
                    args.hidden_size
                    + args.num_attention_heads * (args.qk_head_dim + args.qk_pos_emb_head_dim)
                    + 1
                )
            # Token-linear part of MLA self-attention (lora projs, kv proj, RoPE, output proj).
            standard_self_attn_term = (
                forward_backward_expansion_factor
                * fma_expansion_factor
                * (
                    ## q lora + rope + q norm
                    q_term
                    ## kv lora + rope + kv norm
                    + args.kv_lora_rank
                    * (
                        args.hidden_size
                        + args.num_attention_heads * (args.qk_head_dim + args.v_head_dim)
                        + 1
                    )
                    + args.hidden_size * args.qk_pos_emb_head_dim
                    ## o proj
                    + (args.num_attention_heads * args.v_head_dim) * args.hidden_size
                )
            )
            # Core-attention (L^2) part: ``QK^T`` and ``(softmax(QK^T)) V``. The
            # ``/2`` accounts for the causal mask and the ``*2`` cancels it via FMA.
            standard_self_attn_core_term = (
                forward_backward_expansion_factor
                * fma_expansion_factor
                * (
                    args.num_attention_heads
                    * (args.qk_head_dim + args.qk_pos_emb_head_dim)
                    / 2
                    + args.num_attention_heads * args.v_head_dim / 2
                )
            )

        else:
            ## MHA or GQA
            query_projection_size = args.kv_channels * args.num_attention_heads
            key_projection_size = args.kv_channels * args.num_query_groups
            value_projection_size = args.kv_channels * args.num_query_groups
            gate_projection_size = query_projection_size if args.attention_output_gate else 0
            # Token-linear part of self-attention (QKV projection + output projection).
            standard_self_attn_term = (
                forward_backward_expansion_factor
                * fma_expansion_factor
                * (
                    ## qkv proj
                    args.hidden_size
                    * (
                        query_projection_size
                        + key_projection_size
                        + value_projection_size
                        + gate_projection_size
                    )
                    ## out proj
                    + query_projection_size
                    * args.hidden_size
                )
            )
            # Core-attention (L^2) part: ``QK^T`` and ``(softmax(QK^T)) V``.
            standard_self_attn_core_term = (
                forward_backward_expansion_factor
                * fma_expansion_factor
                * query_projection_size
                / 2  # causal mask (only half of the mask is non-zero)
                * 2  # QK^T and (QK^T)V
            )

        if is_linear_attention_variant(args.experimental_attention_variant):
            # Calculate number of dense and MoE Transformer MLPs.
            if isinstance(args.linear_attention_freq, int):
                linear_attention_pattern = [
                    # [1,1,...,1,0,1,1,...,1,0,...]
                    0 if ((i + 1) % args.linear_attention_freq == 0)
                    else 1 for i in range(num_layers)
                ]
            elif isinstance(args.linear_attention_freq, list):
                linear_attention_pattern = args.linear_attention_freq
                assert len(linear_attention_pattern) == num_layers, (
                    f"Invalid length of linear_attention_pattern: {len(linear_attention_pattern)}, "
                    f"expected {num_layers}, "
                    f"current linear attention pattern: {args.linear_attention_freq}"
                )
            elif args.linear_attention_freq is None:
                # This should be caught by config validation, but raise here as a safety check
                raise ValueError(
                    f"Linear attention type {args.experimental_attention_variant} is specified "
                    "but linear_attention_freq is None. "
                    "Please set linear_attention_freq to specify the LA/SDPA layer pattern."
                )
            else:
                raise ValueError(
                    f"Invalid linear_attention_freq: {type(args.linear_attention_freq)},"
                    f" {args.linear_attention_freq}"
                )
            num_linear_attention_layers = sum(linear_attention_pattern)
            num_standard_attention_layers = num_layers - num_linear_attention_layers

            if is_gated_delta_net_variant(args.experimental_attention_variant):
                # Calculate the FLOPs for the gated delta net attention.
                qk_head_dim = args.linear_key_head_dim
                v_head_dim = args.linear_value_head_dim
                num_qk_heads = args.linear_num_key_heads
                num_v_heads = args.linear_num_value_heads
                qk_dim = qk_head_dim * num_qk_heads
                v_dim = v_head_dim * num_v_heads
                if args.experimental_attention_variant == "gdn2":
                    # GDN2 in_proj: q, k, v, z, f, b, w
                    in_proj_dim = 4 * qk_dim + 3 * v_dim
                else:
                    in_proj_dim = 2 * qk_dim + 2 * v_dim + 2 * num_v_heads
                linear_self_attn_term = (
                    forward_backward_expansion_factor
                    * fma_expansion_factor
                    * (
                        ## in proj
                        args.hidden_size
                        * in_proj_dim
                        ## conv1d
                        + args.linear_conv_kernel_dim
                        * (2 * qk_dim + v_dim)
                        ## gated delta rule
                        + num_v_heads
                        * (v_head_dim ** 2)
                        * 4  # KK^T, VK^T, S(a(I-bKK^T)), and SQ
                        ## out proj
                        + args.hidden_size
                        * v_dim
                    )
                )
            else:
                raise ValueError(
                    "Invalid experimental_attention_variant: "
                    f"{args.experimental_attention_variant}"
                )
        else:
            num_linear_attention_layers = 0
            linear_self_attn_term = 0
            num_standard_attention_layers = num_layers

        # Token-linear self-attention work (projections + linear-attention variants).
        # Linear attention has no L^2 term, so it stays entirely token-linear.
        self_attn_term = (
            linear_self_attn_term * num_linear_attention_layers
            + standard_self_attn_term * num_standard_attention_layers
        )
        # Core attention (L^2) FLOPs per standard-attention layer.
        self_attn_core_term = standard_self_attn_core_term * num_standard_attention_layers

        # Token-linear FLOPs scale with the real (unpadded) token count.
        # For BSHD this falls back to ``batch_size * seq_length`` (no padding).
        total_floating_point_operations = (
            total_real_tokens_in_batch
            * (
                # MLP
                forward_backward_expansion_factor
                * fma_expansion_factor
                * args.hidden_size
                * (
                    # dense layer (deepseek v2, v3 style)
                    (args.ffn_hidden_size * ffn_expansion_factor)
                    * num_dense_layers
                    # routed experts
                    + (
                        (moe_ffn_hidden_size * num_experts_routed_to * ffn_expansion_factor)
                        if moe_latent_size is None
                        else (
                            (
                                moe_ffn_hidden_size
                                * num_experts_routed_to
                                * ffn_expansion_factor
                                * moe_latent_size
                                / args.hidden_size
                            )  # Routed experts run on moe_latent_size.
                            + 2 * moe_latent_size  # Up proj and down proj.
                        )
                    )
                    * num_moe_layers
                    # Shared Experts.
                    + (shared_expert_ffn_hidden_size * ffn_expansion_factor)
                    * num_moe_layers
                )
                # Self Attention (token-linear part).
                + self_attn_term
                # MTP norms and proj
                + forward_backward_expansion_factor
                * fma_expansion_factor
                * mtp_num_layers
                * (
                    # MTP eh norm + final nrom
                    3 * args.hidden_size
                    # MTH eh proj
                    + 2 * args.hidden_size * args.hidden_size
                )
                # Logit.
                + forward_backward_expansion_factor
                * fma_expansion_factor
                * args.hidden_size
                * args.padded_vocab_size
                * (mtp_num_layers + 1)  # MTP + final logit
            )
            # Self Attention (core L^2 part). For BSHD the default
            # ``seqlen_squared_sum_in_batch = batch_size * seq_length^2`` recovers the
            # original ``batch * seq^2 * Q_proj`` term; for THD this uses the actual
            # ragged ``sum(L_i^2)`` and so undercounts the BSHD figure correctly.
            + seqlen_squared_sum_in_batch * self_attn_core_term
        )
        return total_floating_point_operations

    def _uses_gated_delta_product_spec(args):
        """Return True when the selected hybrid stack spec swaps Mamba layers to GDP."""
        def _split_spec_part(part):
            return str(part).replace('[', ' ').replace(']', ' ').replace(',', ' ').split()

        spec = getattr(args, 'spec', None)
        if spec is None:
            return False
        if isinstance(spec, str):
            spec_parts = _split_spec_part(spec)
        else:
            spec_parts = []
            for part in spec:
                spec_parts.extend(_split_spec_part(part))
        if not spec_parts:
            return False
        return spec_parts[-1] in {'gdp_stack_spec', 'gated_delta_product_stack_spec'}

    # Main entrypoint for FLOPs calculation.
    if is_hybrid_model(args):
        # Calculate the number of each type of layer.
        from operator import itemgetter

        from megatron.core.models.hybrid.hybrid_layer_allocation import (
            Symbols,
            get_hybrid_layer_counts,
        )
        num_mamba_layers, num_gdn_layers, num_attn_layers, num_mlp_layers, num_moe_layers = (
            itemgetter(Symbols.MAMBA, Symbols.GDN, Symbols.ATTENTION, Symbols.MLP, Symbols.MOE)(
                get_hybrid_layer_counts(args.hybrid_layer_pattern)
            )
        )

        mtp_num_layers = args.mtp_num_layers
        if mtp_num_layers is None:
            mtp_num_layers = 0
        # Compute hybrid model FLOPs.
        return hybrid_flops(
            total_tokens=total_real_tokens_in_batch,
            seqlen_squared_sum=seqlen_squared_sum_in_batch,
            hidden_size=args.hidden_size,
            num_attn_layers=num_attn_layers,
            num_mamba_layers=num_mamba_layers,
            num_mlp_layers=num_mlp_layers,
            num_moe_layers=num_moe_layers,
            num_gdn_layers=num_gdn_layers,
            mamba_state_dim=args.mamba_state_dim,
            mamba_head_dim=args.mamba_head_dim,
            mamba_num_groups=args.mamba_num_groups,
            mamba_num_heads=args.mamba_num_heads,
            gdp_num_householder=args.gdp_num_householder,
            num_attn_heads=args.num_attention_heads,
            gqa=args.group_query_attention,
            gqa_groups=args.num_query_groups,
            kv_channels=args.kv_channels,
            mlp_expansion=args.ffn_hidden_size / args.hidden_size,
            swiglu=args.swiglu,
            use_gated_delta_product=_uses_gated_delta_product_spec(args),
            moe_latent_size=args.moe_latent_size,
            moe_ffn_hidden_size=(args.moe_ffn_hidden_size if args.moe_ffn_hidden_size is not None
                                 else args.ffn_hidden_size),
            shared_expert_ffn_hidden_size=(0 if args.moe_shared_expert_intermediate_size is None
                                           else args.moe_shared_expert_intermediate_size),
            num_experts_routed_to=args.moe_router_topk,
            gdn_qk_head_dim=args.linear_key_head_dim or 128,
            gdn_v_head_dim=args.linear_value_head_dim or 128,
            gdn_num_qk_heads=args.linear_num_key_heads or 16,
            gdn_num_v_heads=args.linear_num_value_heads or 32,
            gdn_conv_kernel_dim=args.linear_conv_kernel_dim or 4,
            gdn_use_gdn2=(args.experimental_attention_variant == "gdn2"),
            vocab_size=args.padded_vocab_size,
            mtp_num_layers=mtp_num_layers,
        )
    else:
        # Compute standard Transformer model FLOPs.
        return transformer_flops()


def training_log(
    loss_dict,
    total_loss_dict,
    learning_rate: float | None,
    iteration,
    loss_scale,
    report_memory_flag,
    skipped_iter,
    grad_norm,
    params_norm,
    num_zeros_in_grad,
    max_attention_logit,
    pg_collection=None,
    is_first_iteration=False,
    seqlen_squared_sum_in_batch: float | None = None,
    total_real_tokens_in_batch: float | None = None,
):
    """Log training information such as losses, timing, ...."""
    args = get_args()
    timers = get_timers()
    writer = get_tensorboard_writer()
    wandb_writer = get_wandb_writer()
    one_logger = get_one_logger()
    energy_monitor = get_energy_monitor()

    # On first iteration, log stats but don't reset accumulators so normal interval stats remain accurate.
    should_reset = not is_first_iteration

    # Advanced, skipped, and Nan iterations.
    advanced_iters_key = 'advanced iterations'
    skipped_iters_key = 'skipped iterations'
    nan_iters_key = 'nan iterations'
    # Advanced iterations.
    if not skipped_iter:
        total_loss_dict[advanced_iters_key] = total_loss_dict.get(advanced_iters_key, 0) + 1
    else:
        if advanced_iters_key not in total_loss_dict:
            total_loss_dict[advanced_iters_key] = 0
    # Skipped iterations.
    total_loss_dict[skipped_iters_key] = total_loss_dict.get(skipped_iters_key, 0) + skipped_iter
    # Update losses and set nan iterations
    got_nan = False
    for key in loss_dict:
        if not skipped_iter:
            total_loss_dict[key] = (
                total_loss_dict.get(key, torch.tensor([0.0], dtype=torch.float, device='cuda'))
                + loss_dict[key]
            )
        else:
            value = loss_dict[key].float().sum().item()
            is_nan = value == float('inf') or value == -float('inf') or value != value
            got_nan = got_nan or is_nan
    total_loss_dict[nan_iters_key] = total_loss_dict.get(nan_iters_key, 0) + int(got_nan)

    # Logging.
    timers_to_log = []
    if args.timing_log_level >= 1:
        timers_to_log.extend([
            'forward-backward',
            'layernorm-grads-all-reduce',
            'embedding-grads-all-reduce',
            'all-grads-sync',
            'params-all-gather',
            'optimizer-copy-to-main-grad',
            'optimizer-unscale-and-check-inf',
            'optimizer-clip-main-grad',
            'optimizer-count-zeros',
            'optimizer-inner-step',
            'optimizer-copy-main-to-model-params',
            'optimizer',
        ])
    if args.timing_log_level >= 2:
        timers_to_log.extend([
            'batch-generator',
            'forward-compute',
            'backward-compute',
            'forward-recv',
            'forward-send',
            'backward-recv',
            'backward-send',
            'forward-send-forward-recv',
            'forward-send-backward-recv',
            'backward-send-forward-recv',
            'backward-send-backward-recv',
            'forward-backward-send-forward-backward-recv',
        ])
    # Add timers from RL loop if needed.
    if args.perform_rl_step:
        timers_to_log.extend(RL_LOGGABLE_TIMER_NAMES)

    # Calculate batch size. data_parallel_size excludes the GTP-remat axis (it's folded into
    # total_model_size at arguments.py:446); each gtp-remat peer consumes a distinct microbatch,
    # so multiply it back in for the global sample count.
    batch_size = (
        args.micro_batch_size
        * args.data_parallel_size
        * args.gtp_weight_remat_size
        * get_num_microbatches()
    )

    # Track app tag & app tag ID
    one_logger_utils.track_app_tag(batch_size, args.world_size, args.seq_length)

    total_iterations = total_loss_dict[advanced_iters_key] + total_loss_dict[skipped_iters_key]

    # learning rate will be None on ranks without trainable params, so we must gather across mp ranks
    _lr_mp_group = pg_collection.mp if pg_collection is not None else None
    learning_rate: float | None = reduce_max_stat_across_model_parallel_group(
        learning_rate, group=_lr_mp_group
    )
    if learning_rate is None and args.freeze_all_layers:
        learning_rate = 0.0
    # Tensorboard values.
    if writer and (iteration % args.tensorboard_log_interval == 0):
        if wandb_writer:
            wandb_writer.log({'samples vs steps': args.consumed_train_samples}, iteration)
        if learning_rate is not None:
            writer.add_scalar('learning-rate', learning_rate, iteration)
            writer.add_scalar('learning-rate vs samples', learning_rate, args.consumed_train_samples)
            if wandb_writer:
                wandb_writer.log({'learning-rate': learning_rate}, iteration)
        if args.skipped_train_samples > 0:
            writer.add_scalar('skipped-train-samples', args.skipped_train_samples, iteration)
            if wandb_writer:
                wandb_writer.log({'skipped-train-samples': args.skipped_train_samples}, iteration)
        writer.add_scalar('batch-size', batch_size, iteration)
        writer.add_scalar('batch-size vs samples', batch_size, args.consumed_train_samples)
        if wandb_writer:
            wandb_writer.log({'batch-size': batch_size}, iteration)
        # Log bins for packed mode
        if has_rl_utils and args.rl_use_sequence_packing:
            packing_metrics = rl_utils.get_sequence_packing_tensorboard_metrics(args)
            for metric_name, metric_value in packing_metrics.items():
                writer.add_scalar(metric_name, metric_value, iteration)
            if wandb_writer and packing_metrics:
                wandb_writer.log(packing_metrics, iteration)
        for key in loss_dict:
            writer.add_scalar(key, loss_dict[key], iteration)
            writer.add_scalar(key + ' vs samples', loss_dict[key], args.consumed_train_samples)
            if wandb_writer:
                wandb_writer.log({key: loss_dict[key]}, iteration)
        if args.log_loss_scale_to_tensorboard:
            writer.add_scalar('loss-scale', loss_scale, iteration)
            writer.add_scalar('loss-scale vs samples', loss_scale, args.consumed_train_samples)
            if wandb_writer:
                wandb_writer.log({'loss-scale': loss_scale}, iteration)
        if args.log_world_size_to_tensorboard:
            writer.add_scalar('world-size', args.world_size, iteration)
            writer.add_scalar('world-size vs samples', args.world_size, args.consumed_train_samples)
            if wandb_writer:
                wandb_writer.log({'world-size': args.world_size}, iteration)
        if grad_norm is not None:
            writer.add_scalar('grad-norm', grad_norm, iteration)
            writer.add_scalar('grad-norm vs samples', grad_norm, args.consumed_train_samples)
            if wandb_writer:
                wandb_writer.log({'grad-norm': grad_norm}, iteration)
        if num_zeros_in_grad is not None:
            writer.add_scalar('num-zeros', num_zeros_in_grad, iteration)
            writer.add_scalar(
                'num-zeros vs samples', num_zeros_in_grad, args.consumed_train_samples
            )
            if wandb_writer:
                wandb_writer.log({'num-zeros': num_zeros_in_grad}, iteration)
        if params_norm is not None:
            writer.add_scalar('params-norm', params_norm, iteration)
            writer.add_scalar('params-norm vs samples', params_norm, args.consumed_train_samples)
            if wandb_writer:
                wandb_writer.log({'params-norm': params_norm}, iteration)
        if args.perform_rl_step:
            grpo_collection_iteration = iteration // (args.grpo_iterations * ( ( args.grpo_samples_per_iteration )// args.global_batch_size ))
            writer.add_scalar('grpo_collection_iteration', grpo_collection_iteration, iteration)
            if wandb_writer:
                wandb_writer.log({'grpo_collection_iteration': grpo_collection_iteration}, iteration)
        if args.log_memory_to_tensorboard:
            mem_stats = torch.cuda.memory_stats()
            writer.add_scalar(
                "mem-reserved-bytes", mem_stats["reserved_bytes.all.current"], iteration
            )
            writer.add_scalar(
                "mem-allocated-bytes", mem_stats["allocated_bytes.all.current"], iteration
            )
            writer.add_scalar(
                "mem-max-allocated-bytes", mem_stats["allocated_bytes.all.peak"], iteration
            )
            writer.add_scalar("mem-allocated-count", mem_stats["allocation.all.current"], iteration)
        if args.log_max_attention_logit:
            writer.add_scalar('max_attention_logit', max_attention_logit, iteration)
            if wandb_writer:
                wandb_writer.log({'max_attention_logit': max_attention_logit}, iteration)
    # Log MoE metrics.
    moe_log_string = ""
    if args.num_experts is not None:
        moe_loss_scale = 1 / get_num_microbatches()
        track_names = []
        if "aux_loss" in args.moe_router_load_balancing_type:
            track_names.append("load_balancing_loss")
        if "seq_aux_loss" in args.moe_router_load_balancing_type:
            track_names.append("seq_load_balancing_loss")
        if "global_aux_loss" in args.moe_router_load_balancing_type:
            track_names.append("global_load_balancing_loss")
        if args.moe_z_loss_coeff is not None:
            track_names.append("z_loss")

        if is_hybrid_model(args):
            from megatron.core.models.hybrid.hybrid_layer_allocation import (
                Symbols,
                parse_hybrid_pattern,
            )

            parsed_pattern = parse_hybrid_pattern(args.hybrid_layer_pattern)
            main_pattern = parsed_pattern.main_pattern or ""
            mtp_pattern = parsed_pattern.mtp_pattern or ""
            main_moe_layers = main_pattern.count(Symbols.MOE)
            mtp_moe_layers_per_depth = mtp_pattern.count(Symbols.MOE)
            if parsed_pattern.mtp_num_depths > 0 and mtp_moe_layers_per_depth > 0:
                mtp_moe_layers = (
                    mtp_moe_layers_per_depth
                    if args.mtp_use_repeated_layer
                    else mtp_moe_layers_per_depth * parsed_pattern.mtp_num_depths
                )
            else:
                mtp_moe_layers = 0
            num_moe_layers = main_moe_layers + mtp_moe_layers
        else:
            if args.moe_layer_freq is None:
                moe_layer_pattern = [1] * args.num_layers
            elif isinstance(args.moe_layer_freq, int):
                moe_layer_pattern = [
                    1 if (i % args.moe_layer_freq == 0) else 0 for i in range(args.num_layers)
                ]
            elif isinstance(args.moe_layer_freq, list):
                moe_layer_pattern = args.moe_layer_freq
            else:
                raise ValueError(f"Invalid moe_layer_freq: {args.moe_layer_freq}")
            main_moe_layers = sum(moe_layer_pattern)
            mtp_moe_layers = 0
            if args.mtp_num_layers and moe_layer_pattern[-1]:
                mtp_moe_layers = 1 if args.mtp_use_repeated_layer else args.mtp_num_layers
            num_moe_layers = main_moe_layers + mtp_moe_layers

        layers = args.num_layers + (args.mtp_num_layers or 0)

        moe_log_string = get_moe_metrics_tracker().report(
            loss_scale=moe_loss_scale,
            iteration=iteration,
            writer=writer,
            wandb_writer=wandb_writer,
            per_layer_logging=args.moe_per_layer_logging,
            force_initialize=True,
            track_names=track_names,
            num_layers=layers,
            num_moe_layers=num_moe_layers,
            moe_layer_freq=args.moe_layer_freq,
            pg_collection=pg_collection,
            total_loss_dict=total_loss_dict,
        )

    # Log MTP metrics.
    if args.mtp_num_layers is not None:
        mtp_loss_scale = 1 / get_num_microbatches()
        MTPLossLoggingHelper.track_mtp_metrics(
            mtp_loss_scale, iteration, writer, wandb_writer, total_loss_dict
        )

    # Track sparse attention indexer loss.
    if args.dsa_indexer_loss_coeff is not None and args.dsa_indexer_loss_coeff > 0:
        indexer_loss_scale = 1 / get_num_microbatches()
        DSAIndexerLossLoggingHelper.track_indexer_metrics(
            loss_scale=indexer_loss_scale,
            iteration=iteration,
            writer=writer,
            wandb_writer=wandb_writer,
            total_loss_dict=total_loss_dict,
        )

    # Dump memory snapshot and print metrics to stdout.
    if iteration % args.log_interval == 0 or is_first_iteration:
        should_prof_rank = (args.profile_ranks == [] or safe_get_rank() in args.profile_ranks)  # [] is all ranks
        if args.record_memory_history and (should_prof_rank or torch.distributed.get_backend() == 'fake'):
            rank = safe_get_rank()
            base, ext = os.path.splitext(args.memory_snapshot_path)
            snapshot_filename = f"{base}_{rank}{ext}"
            torch.cuda.memory._dump_snapshot(snapshot_filename)

        elapsed_time = timers('interval-time').elapsed(barrier=True, reset=should_reset)
        elapsed_time_per_iteration = elapsed_time / total_iterations

        throughput = num_floating_point_operations(
            args,
            batch_size,
            seqlen_squared_sum_in_batch=seqlen_squared_sum_in_batch,
            total_real_tokens_in_batch=total_real_tokens_in_batch,
        ) / (elapsed_time_per_iteration * 10**12 * args.world_size)

        one_logger_utils.track_e2e_metrics(args.log_throughput, throughput)

        # We log to stdout after the first iteration (controlled by `is_first_iteration`)
        # to document initialization overhead. Log statistics to TensorBoard and
        # WandB according to the regular schedule.
        if args.log_timers_to_tensorboard and not is_first_iteration:
            if writer:
                writer.add_scalar('iteration-time', elapsed_time_per_iteration, iteration)
            if wandb_writer:
                wandb_writer.log({'iteration-time': elapsed_time_per_iteration}, iteration)
        log_string = f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}]"
        log_string += ' iteration {:8d}/{:8d} |'.format(iteration, args.train_iters)
        log_string += ' consumed samples: {:12d} |'.format(args.consumed_train_samples)
        if has_rl_utils and args.rl_use_sequence_packing:
            log_string += rl_utils.get_sequence_packing_log_info(args)
        if args.skipped_train_samples > 0:
            log_string += ' skipped samples: {:12d} |'.format(args.skipped_train_samples)
        log_string += ' elapsed time per iteration (ms): {:.1f} |'.format(
            elapsed_time_per_iteration * 1000.0
        )
        if args.log_throughput:
            log_string += f' throughput per GPU (TFLOP/s/GPU): {throughput:.1f} |'
            if args.log_timers_to_tensorboard:
                if writer:
                    writer.add_scalar('throughput', throughput, iteration)
                if wandb_writer:
                    wandb_writer.log({'throughput': throughput}, iteration)
        if args.log_energy:
            energy = (energy_monitor.lap() / total_iterations) / args.world_size
            power = energy / elapsed_time_per_iteration
            log_string += f' energy per GPU (J/iter/GPU): {energy:.1f} |'
            log_string += f' power per GPU (W/GPU): {power:.1f} |'
            if writer:
                writer.add_scalar('iter-energy/gpu', energy, iteration)
                writer.add_scalar('power/gpu', power, iteration)
            if wandb_writer:
                wandb_writer.log({'iter-energy/gpu': energy}, iteration)
                wandb_writer.log({'power/gpu': power}, iteration)
        # Decoupled_learning_rate should be not None only on first and last pipeline stage.
        if learning_rate is not None:
            log_string += f' learning rate: {learning_rate:.6E} |'
        log_string += f' global batch size: {batch_size:5d} |'

        # OTel: snapshot the accumulator state BEFORE it is torn down. The loop directly
        # below zeroes each loss tensor when should_reset, and the should_reset block
        # further down zeroes advanced/skipped/nan_iters -- so anything read after that
        # point sees 0.0 loss and 0 skipped iterations on EVERY export, which is exactly
        # what the metrics emission (further below, where the other emission inputs like
        # `throughput` are in scope) used to do. Take the values here and emit them there.
        # The .item() is a device sync, so it stays inside the telemetry guard and is not
        # paid at all when telemetry is off -- the same guard the emission itself uses.
        _otel_telemetry_log = get_telemetry()
        _otel_loss_snapshot = None
        _otel_skipped_iters_snapshot = 0
        if _otel_telemetry_log is not None and _otel_telemetry_log.is_exporting:
            _meta_keys = (advanced_iters_key, skipped_iters_key, nan_iters_key)
            _loss_keys = [k for k in total_loss_dict if k not in _meta_keys]
            if _loss_keys:
                _otel_loss_snapshot = total_loss_dict[_loss_keys[0]].item() / float(
                    max(1, total_loss_dict.get(advanced_iters_key, 1))
                )
            _otel_skipped_iters_snapshot = int(total_loss_dict.get(skipped_iters_key, 0))

        for key in total_loss_dict:
            if key not in [advanced_iters_key, skipped_iters_key, nan_iters_key]:
                avg = total_loss_dict[key].item() / float(
                    max(1, total_loss_dict[advanced_iters_key])
                )
                if avg >= 0.0:
                    log_string += ' {}: {:.6E} |'.format(key, avg)
                if should_reset:
                    total_loss_dict[key] = torch.tensor([0.0], dtype=torch.float, device='cuda')
        if args.num_experts is not None and moe_log_string:
            log_string += moe_log_string
        log_string += f' loss scale: {loss_scale:.1f} |'
        if grad_norm is not None:
            log_string += f' grad norm: {grad_norm:.3f} |'
        if num_zeros_in_grad is not None:
            log_string += f' num zeros: {num_zeros_in_grad} |'
        if params_norm is not None:
            log_string += f' params norm: {params_norm:.3f} |'
        log_string += ' number of skipped iterations: {:3d} |'.format(
            total_loss_dict[skipped_iters_key]
        )
        log_string += ' number of nan iterations: {:3d} |'.format(total_loss_dict[nan_iters_key])

        # RL token throughput metrics.
        if args.perform_rl_step:
            log_string += rl_utils.log_rl_throughput_metrics(
                args, batch_size, elapsed_time_per_iteration, iteration, wandb_writer,
            )

        if should_reset:
            total_loss_dict[advanced_iters_key] = 0
            total_loss_dict[skipped_iters_key] = 0
            total_loss_dict[nan_iters_key] = 0
        print_rank_last(log_string)

        # OTel: emit training metrics at log interval (export rank only). Loss and
        # skipped-iteration counts come from the snapshot taken above, before the
        # accumulators were reset; everything else is still live at this point.
        if _otel_telemetry_log is not None and _otel_telemetry_log.is_exporting:
            from megatron.core.telemetry.training_metrics import record_training_metrics
            _avg_loss = _otel_loss_snapshot
            _tokens_per_sec = (
                batch_size * args.seq_length / elapsed_time_per_iteration
                if elapsed_time_per_iteration > 0 else None
            )
            _mem_gb = torch.cuda.max_memory_allocated() / (1024 ** 3) if torch.cuda.is_available() else None
            record_training_metrics(
                meter=_otel_telemetry_log.meter,
                step_duration_ms=elapsed_time_per_iteration * 1000.0,
                loss=_avg_loss,
                throughput_tflops=throughput if args.log_throughput else None,
                grad_norm=grad_norm,
                learning_rate=learning_rate,
                skipped_iters=_otel_skipped_iters_snapshot,
                tokens_per_sec=_tokens_per_sec,
                memory_allocated_gb=_mem_gb,
            )

        reported_memory_in_this_iteration = False
        if report_memory_flag:
            # Report memory after optimizer state has been initialized.
            if torch.distributed.get_rank() == 0:
                num_microbatches = get_num_microbatches()
                report_theoretical_memory(args, num_microbatches=num_microbatches, verbose=True)
            report_memory(
                f'(after {iteration} iterations)',
                process_group=pg_collection.dp if pg_collection is not None else None,
            )
            reported_memory_in_this_iteration = True
            loaded_iteration = max(get_loaded_iteration() or 0, 0)
            if iteration > (loaded_iteration + 1):
                # Make sure the memory after the second iteration is reported to include optimizer state memory.
                report_memory_flag = False
        if args.log_memory_interval is not None and iteration % args.log_memory_interval == 0 and \
            not reported_memory_in_this_iteration:
            report_memory(
                f'(after {iteration} iterations)',
                process_group=pg_collection.dp if pg_collection is not None else None,
            )
        # Log RL profiling data if enabled (must be before timers.log which resets timers).
        # Token throughput metrics are read from RLRuntimeState automatically.
        if args.rl_profile:
            log_iteration_profile(
                iteration=iteration,
                timers=timers,
                elapsed_time_ms=elapsed_time_per_iteration * 1000.0,
                throughput_tflops=throughput if args.log_throughput else None,
                global_batch_size=batch_size,
                wandb_writer=wandb_writer,
                tb_writer=writer,
            )

        # Write timers to wandb, don't reset the counts.
        if args.log_timers_to_tensorboard:
            timers.write(timers_to_log, writer, iteration, normalizer=args.log_interval, reset=False)
            timers.write(timers_to_log, wandb_writer, iteration, normalizer=args.log_interval, reset=False)
        # Log timers to stdout
        timers.log(timers_to_log, normalizer=args.log_interval, reset=should_reset)

    return report_memory_flag


@_otel_trace_fn('evaluate', 'megatron.evaluate')
def evaluate(
    forward_step_func,
    data_iterator,
    model,
    process_non_loss_data_func,
    config,
    verbose=False,
    non_loss_data_func=None,
    eval_iters=None,
    pg_collection=None,
    p2p_communicator=None,
):
    """Evaluation."""
    args = get_args()
    timers = get_timers()

    timers('evaluate', log_level=0).start(barrier=True)

    # Turn on evaluation mode which disables dropout.
    for model_module in model:
        model_module.eval()

    # Disable result validation during evaluation
    rerun_state_machine = get_rerun_state_machine()
    rerun_mode = rerun_state_machine.get_mode()
    rerun_state_machine.set_mode(RerunMode.DISABLED)

    total_loss_dict = {}

    # make validation batch size independent from training batch size
    eval_batch_size = args.eval_global_batch_size
    eval_micro_batch_size = args.eval_micro_batch_size
    # data_parallel_size excludes the GTP-remat axis (it's folded into total_model_size at
    # arguments.py:446); each gtp-remat peer consumes a distinct microbatch, so include it in the
    # global sample breadth we divide out to recover the microbatch count.
    eval_num_microbatches = eval_batch_size // (
        eval_micro_batch_size * args.data_parallel_size * args.gtp_weight_remat_size
    )
    forward_backward_func = get_forward_backward_func(schedule_pg_collection=pg_collection)
    # Reductions source per-rank groups from the model (encoder rank -> encoder groups).
    eval_pgc = get_attr_wrapped_model(model[0], "pg_collection")
    if eval_pgc is None:
        eval_pgc = ProcessGroupCollection.use_mpu_process_groups()
    # gtp_remat-inclusive, mirroring train_step: gtp_remat peers hold distinct micro-batches, so
    # the reduction must cover every distinct-data rank. Reducing over the replicate dp_cp would
    # average a 1/gtp_remat subsample of the eval batch (768 sequences read, 12 averaged at
    # dp=6/gtp_remat=64) while consumed_valid_samples still books the full eval_batch_size.
    eval_dp_cp_group = getattr(eval_pgc, 'dp_cp_gtp_remat', None) or eval_pgc.dp_cp
    if args.cuda_graph_impl == "full_iteration":
        forward_backward_func = FullCudaGraphWrapper(
            forward_backward_func,
            cuda_graph_warmup_steps=args.cuda_graph_warmup_steps,
            use_single_mempool=config.cuda_graph_use_single_mempool,
        )
    # Wrap forward_backward_func for overflow handling with moe_expert_rank_capacity_factor
    if args.moe_expert_rank_capacity_factor is not None:
        copy_main_params = args.reuse_grad_buf_for_mxfp8_param_ag and args.overlap_param_gather
        forward_backward_func = PagedStashRunner(
            config,
            copy_main_params,
            model,
            None,
            forward_backward_func,
        )

    if has_nvidia_modelopt and getattr(args, "modelopt_enabled", False):
        # [ModelOpt]: Pipeline-parallel Distillation stacks student and teacher tensors
        adjust_tensor_shapes_fn = get_tensor_shapes_adjust_fn_for_distillation(
            model,
            seq_length=args.seq_length,
            micro_batch_size=eval_micro_batch_size,
            decoder_seq_length=args.decoder_seq_length,
        )
    else:
        adjust_tensor_shapes_fn = None

    if eval_iters is None:
        eval_iters = args.eval_iters

    with torch.no_grad():
        iteration = 0
        if verbose:
            print_rank_0(f'Evaluating on {eval_iters * eval_batch_size} samples')
        while iteration < eval_iters:
            iteration += 1
            if verbose:
                print_rank_0(f'Evaluating iter {iteration}/{eval_iters}')

            # Don't care about timing during evaluation
            config.timers = None
            ft_integration.on_eval_step_start()
            with _otel_managed_span('evaluate', 'megatron.evaluate.step',
                                    **{'megatron.eval_iteration': iteration}):
                loss_dicts = forward_backward_func(
                    forward_step_func=forward_step_func,
                    data_iterator=data_iterator,
                    model=model,
                    num_microbatches=eval_num_microbatches,
                    seq_length=args.seq_length,
                    micro_batch_size=eval_micro_batch_size,
                    decoder_seq_length=args.decoder_seq_length,
                    forward_only=True,
                    adjust_tensor_shapes_fn=adjust_tensor_shapes_fn,
                    pg_collection=pg_collection,
                    p2p_communicator=p2p_communicator,
                )
            ft_integration.on_eval_step_end()
            config.timers = get_timers()

            # Empty unused memory
            if args.empty_unused_memory_level >= 1:
                torch.cuda.empty_cache()

            if is_pp_last_stage(eval_pgc.pp) and loss_dicts:
                # Reduce across processes.
                for key in loss_dicts[0].keys():
                    if key not in total_loss_dict:
                        total_loss_dict[key] = torch.tensor([0.0, 0.0], dtype=torch.float, device='cuda')
                    val = [x[key].view(-1) for x in loss_dicts]

                    if val[0].numel() == 2:
                        if args.sft:
                            # normalize over micro batch instead of global
                            val = torch.vstack(val)
                            val = val[:, 0] / val[:, 1].clamp(min=1)
                            val = val.mean()
                            torch.distributed.all_reduce(val, group=eval_dp_cp_group)
                            val /= torch.distributed.get_world_size(group=eval_dp_cp_group)
                            total_loss_dict[key][0] += val
                            total_loss_dict[key][1] += 1
                        else :
                            val = torch.vstack(val).sum(dim=0)
                            torch.distributed.all_reduce(val, group=eval_dp_cp_group)
                            total_loss_dict[key] += val
                    elif val[0].numel() == 1:
                        val = torch.cat(val).sum()
                        total_loss_dict[key][0] += val
                        total_loss_dict[key][1] += len(loss_dicts)
                    else:
                        raise ValueError(f"Invalid value shape: {val[0].shape} for key {key}")

            args.consumed_valid_samples += eval_batch_size

            if args.exit_duration_in_mins:
                train_time = (time.time() - _TRAIN_START_TIME) / 60.0
                done_cuda = torch.tensor(
                    [train_time > args.exit_duration_in_mins], dtype=torch.int, device='cuda'
                )
                torch.distributed.all_reduce(done_cuda, op=torch.distributed.ReduceOp.MAX)
                done = done_cuda.item()
                if done:
                    rerun_state_machine.set_mode(rerun_mode)
                    print_rank_0('Exiting during evaluation, timelimit reached')
                    return None, None, True

        collected_non_loss_data = None
        if non_loss_data_func is not None:
            collected_non_loss_data = non_loss_data_func(model)
        elif process_non_loss_data_func is not None and is_last_rank():
            collected_non_loss_data = forward_backward_func(
                forward_step_func=forward_step_func,
                data_iterator=data_iterator,
                model=model,
                num_microbatches=eval_num_microbatches,
                seq_length=args.seq_length,
                micro_batch_size=eval_micro_batch_size,
                decoder_seq_length=args.decoder_seq_length,
                forward_only=True,
                collect_non_loss_data=True,
                pg_collection=pg_collection,
                p2p_communicator=p2p_communicator,
            )

    # Move model back to the train mode.
    for model_module in model:
        model_module.train()

    for key in total_loss_dict:
        numerator, denominator = total_loss_dict[key]
        total_loss_dict[key] = numerator / denominator

    timers('evaluate').stop()
    timers.log(['evaluate'])

    rerun_state_machine.set_mode(rerun_mode)


    # OTel: set eval_iters on the active span started by the @_otel_trace_fn decorator.
    # get_current_span() always returns a NonRecordingSpan (no-op) when no span is active,
    # so this is safe whether or not the group is enabled or the decorator fell back to no-op.
    try:
        from opentelemetry import trace as _ot
        _ot.get_current_span().set_attribute(
            'megatron.eval_iters', eval_iters if eval_iters is not None else 0
        )
    except Exception:  # noqa: BLE001 — OTel must never crash evaluation
        pass

    return total_loss_dict, collected_non_loss_data, False


def evaluate_and_print_results(
    prefix,
    forward_step_func,
    data_iterator,
    model,
    iteration,
    process_non_loss_data_func,
    config,
    verbose=False,
    write_to_tensorboard=True,
    non_loss_data_func=None,
    pg_collection=None,
    p2p_communicator=None,
):
    """Helper function to evaluate and dump results on screen."""
    args = get_args()
    if write_to_tensorboard:
        writer = get_tensorboard_writer()
    else:
        writer = None

    wandb_writer = get_wandb_writer()

    data_iterators = data_iterator if args.multiple_validation_sets else [data_iterator]

    if not args.multiple_validation_sets:
        eval_iters = [args.eval_iters]
    else:
        eval_iters = args.eval_iters

    if args.full_validation:
        assert len(eval_iters) == len(data_iterators)

        # with full validation we need to distribute eval_iters to all ranks
        if mpu.get_tensor_model_parallel_rank() == 0:
            eval_iters = torch.tensor(args.eval_iters, dtype=torch.long, device='cuda')
        else:
            eval_iters = torch.tensor([0] * len(eval_iters), dtype=torch.long, device='cuda')
        torch.distributed.broadcast(eval_iters, 0)
        eval_iters = eval_iters.tolist()
        args.eval_iters = eval_iters[0] if not args.multiple_validation_sets else eval_iters
    elif not args.multiple_validation_sets:
        eval_iters = [args.eval_iters]
    else:
        eval_iters = args.eval_iters

    if args.validation_set_names:
        assert args.multiple_validation_sets, \
            "--validation-set-names requires --multiple-validation-sets"
        assert len(args.validation_set_names) == len(data_iterators), \
            f"Number of --validation-set-names ({len(args.validation_set_names)}) must match " \
            f"the number of validation datasets ({len(data_iterators)})"

    for index, (iterator, iterations) in enumerate(zip(data_iterators, eval_iters)):
        suffix = ""
        if args.multiple_validation_sets:
            if args.validation_set_names:
                suffix = f"-{args.validation_set_names[index]}"
            else:
                suffix = f"-{index}"
        total_loss_dict, collected_non_loss_data, timelimit = evaluate(
            forward_step_func,
            iterator,
            model,
            process_non_loss_data_func,
            config,
            verbose,
            non_loss_data_func,
            eval_iters=iterations,
            pg_collection=pg_collection,
            p2p_communicator=p2p_communicator,
        )
        # Timelimit hit during evaluation
        if timelimit:
            return
        string = f' validation{suffix} loss at {prefix} | '
        for key in total_loss_dict:
            string += '{} value: {:.6E} | '.format(key, total_loss_dict[key].item())
            ppl = math.exp(min(20, total_loss_dict[key].item()))
            string += '{} PPL: {:.6E} | '.format(key, ppl)
            if writer:
                writer.add_scalar('{} validation{}'.format(key, suffix), total_loss_dict[key].item(), iteration)
                writer.add_scalar(
                    '{} validation{} vs samples'.format(key, suffix),
                    total_loss_dict[key].item(),
                    args.consumed_train_samples,
                )
                if args.log_validation_ppl_to_tensorboard:
                    writer.add_scalar('{} validation{} ppl'.format(key, suffix), ppl, iteration)
                    writer.add_scalar(
                        '{} validation{} ppl vs samples'.format(key, suffix), ppl, args.consumed_train_samples
                    )
                if wandb_writer and is_last_rank():
                    wandb_writer.log(
                        {'{} validation{}'.format(key, suffix): total_loss_dict[key].item()}, iteration
                    )

        if process_non_loss_data_func is not None and writer and is_last_rank():
            process_non_loss_data_func(collected_non_loss_data, iteration, writer)

        length = len(string) + 1
        print_rank_last('-' * length)
        print_rank_last(string)
        print_rank_last('-' * length)
