"""Host memory of a training rank: glibc's malloc kept from hoarding freed tensors, and the
peak resident memory of the steps alone.

Why (benchmarks/results/step_memory.md): glibc serves a request of at least
``M_MMAP_THRESHOLD`` bytes by a mapping of its own, unmapped when freed; smaller ones come from
the heap (the arenas), whose free memory goes back to the kernel only from the top of each heap.
The threshold starts at 128 KiB and, by default, rises to the size of every mapped chunk freed,
up to 32 MiB on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``, mallopt(3) "M_MMAP_THRESHOLD"). A CPU
training step frees tensors of a few MiB to a few tens of MiB by the hundred (FSDP2's gathered
unit storages, ``untyped_storage().resize_(0)``; activations; logits): after the first
ones every such tensor comes from the heap, and the holes they leave are reused only by requests
that fit. On 4 gloo ranks of a 337M-parameter fp32 Llama LoRA the bytes malloc had handed out
peaked at 1.05 GB per rank, while RSS climbed step after step to 2.95 GB, 1.8 GB of it free in the
arenas. ``fixed_mmap_threshold`` sets the threshold to glibc's own starting value, which
mallopt(3) documents disables the dynamic rise: freed tensors go back to the kernel at once
(same run: 1.63 GB). On a GPU the tensors live in HBM under CUDA's caching allocator; this is
about the host side (rank 0's checkpoint read, DCP's host staging, every CPU run).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import re
import resource

log = logging.getLogger("wattflex.runs.training")

M_MMAP_THRESHOLD = -3  # glibc malloc.h
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MIN, its starting threshold
KEEP_DYNAMIC_ENV = "WATTFLEX_GLIBC_DYNAMIC_MMAP"  # "1": leave glibc's rising threshold (measuring)


def fixed_mmap_threshold() -> bool:
    """Fix glibc malloc's mmap threshold at ``MMAP_THRESHOLD_BYTES`` in this process (True where
    done; False on a C library without ``mallopt``, or with ``WATTFLEX_GLIBC_DYNAMIC_MMAP=1``)."""
    if os.environ.get(KEEP_DYNAMIC_ENV) == "1":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Start the kernel's peak-RSS mark (VmHWM) again from the current RSS (``5`` to
    /proc/self/clear_refs, Linux >= 4.0, proc(5)); False where it cannot. getrusage's ru_maxrss
    reads the same mark: take it before."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def hwm_bytes() -> int | None:
    """VmHWM, the peak RSS since the last ``reset_peak_rss`` (or the process start)."""
    try:
        with open("/proc/self/status") as f:
            m = re.search(r"^VmHWM:\s+(\d+) kB", f.read(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None
