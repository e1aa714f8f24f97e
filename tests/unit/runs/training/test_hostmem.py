"""training.hostmem: glibc's malloc made to give freed tensors back, and the steps' own peak RSS.
Real glibc, real torch CPU tensors, each case in a fresh interpreter (the
threshold is a process's for good once set)."""

import json
import os
import subprocess
import sys

from wattflex.runs.training import hostmem

from .test_training import REPO

# Tensors of 8 MiB, under glibc's 32 MiB ceiling of the rising threshold: after one 24 MiB tensor
# is freed they come from the heap; all freed but the last, which pins the top of the heap, so
# none of it can be trimmed. With the threshold fixed each is a mapping of its own, unmapped on free.
FRAGMENTS = """
import json, os, sys, torch
from wattflex.runs.training import hostmem
fixed = hostmem.fixed_mmap_threshold()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
big = torch.ones(24 << 20, dtype=torch.uint8); del big
base = rss()
kept = [torch.ones(8 << 20, dtype=torch.uint8) for _ in range(40)]
last = kept.pop()
del kept
print(json.dumps({"fixed": fixed, "held": rss() - base}))
"""


def fragments(env: dict) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", FRAGMENTS],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO / "workflow_scripts"), **env},
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_freed_tensors_go_back_to_the_kernel_with_the_threshold_fixed_and_stay_without():
    glibc = fragments({hostmem.KEEP_DYNAMIC_ENV: "1"})
    harness = fragments({hostmem.KEEP_DYNAMIC_ENV: "0"})
    assert not glibc["fixed"] and harness["fixed"]
    assert glibc["held"] > 39 * (8 << 20) * 0.9, glibc  # 39 freed tensors still resident
    assert harness["held"] < 2 * (8 << 20), harness  # the one kept


def test_the_steps_peak_is_the_kernels_mark_since_its_reset():
    grown = bytearray(64 << 20)  # 64 MiB touched, then freed: the mark keeps it
    for i in range(0, len(grown), 4096):
        grown[i] = 1
    del grown
    before = hostmem.hwm_bytes()
    assert hostmem.reset_peak_rss()
    after = hostmem.hwm_bytes()
    assert after is not None and before - after > 32 << 20, (before, after)
