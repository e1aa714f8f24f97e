"""Runs a command with its job's FAKE GPUs' SM clock locked by the real ClockGuard (a SLURM
job's "clock knob" in tests/workflow/test_slurm_knobs.py).

``clock_locked_run.py MHZ CMD...``: locks the GPUs CUDA_VISIBLE_DEVICES names (FAKE pynvml via
tests/fakes/pynvml_path on PYTHONPATH, state in FAKE_PYNVML_STATE), prints CLOCK LOCKED, runs
CMD and exits with its status; the lock is reset on exit and on SIGTERM (a requeue, scancel).
"""

import subprocess
import sys

import pynvml  # FAKE: tests/fakes/pynvml_path must be on PYTHONPATH

from wattflex.runs.devices import clocks
from wattflex.runs.devices.nvml import open_gpus

assert "fake" in (pynvml.__doc__ or "").lower() + getattr(pynvml, "__file__", ""), (
    "not the FAKE pynvml"
)
with clocks.ClockGuard(open_gpus(gpm=False), float(sys.argv[1]), "nvml"):
    print("CLOCK LOCKED", flush=True)
    rc = subprocess.call(sys.argv[2:])
sys.exit(rc)
