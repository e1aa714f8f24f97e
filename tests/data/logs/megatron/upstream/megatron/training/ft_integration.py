# From NVIDIA/Megatron-LM megatron/training/ft_integration.py
# at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22),
# copied unchanged by tests/data/logs/megatron/make_lines.py extract: the file's
# stdlib and torch imports, then:
# _GLOBAL_RANK_MONITOR_CLIENT, _is_setup_section_open, _curr_eval_iter_idx, _NUM_WARMUP_ITERS, get_rank_monitor_client, on_eval_step_start, on_eval_step_end.
# The file's notice: Copyright (c) 2025, NVIDIA CORPORATION. All rights reserved.

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from typing import Any, Optional
import torch


_GLOBAL_RANK_MONITOR_CLIENT = None


_is_setup_section_open = False


_curr_eval_iter_idx = 0


_NUM_WARMUP_ITERS = 1  # Will be set by --ft-num-warmup-iters (default: 5)


def get_rank_monitor_client() -> Optional[Any]:
    """Returns the underlying fault tolerance client instance

    Returns:
        RankMonitorClient: rank monitor client instance, or None if FT was not initialized
    """
    return _GLOBAL_RANK_MONITOR_CLIENT


def on_eval_step_start() -> None:
    """Should be called before each validation step"""
    rmon_cli = get_rank_monitor_client()
    if rmon_cli is not None:
        global _is_setup_section_open
        if _is_setup_section_open:
            # setup section can be open if there were no training iters before evaluation
            rmon_cli.end_section("setup")
            _is_setup_section_open = False
        if _curr_eval_iter_idx >= _NUM_WARMUP_ITERS:
            rmon_cli.start_section("step")


def on_eval_step_end() -> None:
    """Should be called after each validation step"""
    rmon_cli = get_rank_monitor_client()
    if rmon_cli is not None:
        global _curr_eval_iter_idx
        if _curr_eval_iter_idx >= _NUM_WARMUP_ITERS:
            rmon_cli.end_section("step")
        _curr_eval_iter_idx += 1
