# From NVIDIA/Megatron-LM megatron/core/_rank_utils.py
# at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22),
# copied unchanged by tests/data/logs/megatron/make_lines.py extract: the file's
# stdlib and torch imports, then:
# safe_get_rank.
# The file's notice: Copyright (c) 2024, NVIDIA CORPORATION. All rights reserved.

import logging
import os
import warnings
from typing import Any
import torch


def safe_get_rank() -> int:
    """Get the distributed rank safely, even if torch.distributed is not initialized.

    Fallback order:
    1. torch.distributed.get_rank() (if initialized)
    2. RANK environment variable (torchrun/torchelastic)
    3. SLURM_PROCID environment variable (SLURM)
    4. Default: 0 (with warning)

    Returns:
        int: The rank of the current process.
    """
    if torch.distributed.is_initialized():
        return torch.distributed.get_rank()

    # If torch.distributed is not initialized, try to read environment variables.
    if "RANK" in os.environ:
        return int(os.environ["RANK"])

    slurm_rank = resolve_slurm_rank()
    if slurm_rank is not None:
        return slurm_rank

    warnings.warn(
        "Could not determine rank from torch.distributed, RANK, or SLURM_PROCID. "
        "Defaulting to rank 0."
    )
    return 0
