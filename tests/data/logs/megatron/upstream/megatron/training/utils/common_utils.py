# From NVIDIA/Megatron-LM megatron/training/utils/common_utils.py
# at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22),
# copied unchanged by tests/data/logs/megatron/make_lines.py extract: the file's
# stdlib and torch imports, then:
# reduce_max_stat_across_model_parallel_group, report_memory, print_rank_0, is_last_rank, print_rank_last, is_hybrid_model.
# The file's notice: Copyright (c) 2025 NVIDIA CORPORATION & AFFILIATES. All rights reserved.

import json
import os
import sys
import warnings
from collections import defaultdict
from contextlib import contextmanager
from datetime import datetime
from typing import Optional
import torch


def reduce_max_stat_across_model_parallel_group(
    stat: float, group: Optional[torch.distributed.ProcessGroup] = None
) -> float | None:
    """
    Ranks without an optimizer will have no grad_norm or num_zeros_in_grad stats.
    We need to ensure the logging and writer rank has those values.
    This function reduces a stat tensor across the model parallel group.

    We use an all_reduce max since the values have already been summed across optimizer ranks where possible

    group: model-parallel process group; defaults to mpu.get_model_parallel_group().
    """
    if group is None:
        group = mpu.get_model_parallel_group()
    if stat is None:
        stat = -1.0
    stat = torch.tensor([stat], dtype=torch.float32, device=torch.cuda.current_device())
    torch.distributed.all_reduce(stat, op=torch.distributed.ReduceOp.MAX, group=group)
    if stat.item() == -1.0:
        # No rank has a valid stat, so return None to indicate that it is None across all ranks.
        return None
    else:
        return stat.item()


def report_memory(name, process_group=None):
    """Simple GPU memory report.

    process_group: optional data-parallel group to gate the rank-0 print on; None falls back
        to ``mpu.get_data_parallel_rank()`` (byte-identical for callers passing nothing).
    """
    args = get_args()
    mega_bytes = 1024.0 * 1024.0
    string = name + ' memory (MB)'
    string += f" | allocated: {torch.cuda.memory_allocated() / mega_bytes:.2f}"
    string += f" | max allocated: {torch.cuda.max_memory_allocated() / mega_bytes:.2f}"
    string += f" | reserved: {torch.cuda.memory_reserved() / mega_bytes:.2f}"
    string += f" | max reserved: {torch.cuda.max_memory_reserved() / mega_bytes:.2f}"
    if args.log_device_memory_used:
        string += f" | total device memory used: {torch.cuda.device_memory_used() / mega_bytes:.2f}"
    is_dp_rank_0 = (
        get_pg_rank(process_group) == 0
        if process_group is not None
        else mpu.get_data_parallel_rank() == 0
    )
    if is_dp_rank_0:
        print("[Rank {}] {}".format(torch.distributed.get_rank(), string), flush=True)


def print_rank_0(message, rank=None):
    """If distributed is initialized or rank is specified, print only on rank 0."""
    if rank is not None:
        if rank == 0:
            print(message, flush=True)
    else:
        if _safe_get_rank() == 0:
            print(message, flush=True)


def is_last_rank():
    """Returns true if called on last rank, false otherwise."""
    assert torch.distributed.is_initialized()
    return _safe_get_rank() == (torch.distributed.get_world_size() - 1)


def print_rank_last(message):
    """If distributed is initialized, print only on last rank."""
    if torch.distributed.is_initialized() and torch.distributed.get_backend() != 'fake':
        if is_last_rank():
            print(message, flush=True)
    else:
        print(message, flush=True)


def is_hybrid_model(args):
    """Returns True if the model is a hybrid Mamba-Transformer model."""
    return args.hybrid_layer_pattern is not None
