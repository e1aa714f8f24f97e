"""Runs a command as the user of its job's FAKE GPUs (tests/workflow/test_slurm_knobs.py).

``gpu_user.py CMD...``: records this process's id as ``user_pid`` of the GPUs
CUDA_VISIBLE_DEVICES names (FAKE pynvml via tests/fakes/pynvml_path on PYTHONPATH, state in
FAKE_PYNVML_STATE), then replaces itself with CMD (same process id). The fake GPUs then read
their idle power while CMD is stopped (``scontrol suspend``) or gone (a requeue, its end), their
demand while it runs.
"""

import os
import sys

import pynvml  # FAKE: tests/fakes/pynvml_path must be on PYTHONPATH

from wattflex.runs.devices.nvml import local_gpu_indices

assert "fake" in (pynvml.__doc__ or "").lower() + getattr(pynvml, "__file__", ""), (
    "not the FAKE pynvml"
)
pynvml.claim(local_gpu_indices(), os.getpid())
os.execvp(sys.argv[1], sys.argv[1:])
