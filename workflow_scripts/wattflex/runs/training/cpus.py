"""Per-rank CPU binding (``cuda.cpu_binding``, on by default): each of a node's ranks runs on its
own share of the CPUs the node's task may use, so that 8 workers do not contend for one
task's CPUs (noise in the step times and host power being measured).

The share is cut from the process's allowed set (``os.sched_getaffinity``: SLURM's cpuset,
``taskset``), the same in every rank, so the shares are disjoint without any exchange.
torchrun's own ``--numa-binding`` binds by the GPUs' NUMA nodes (NVML) and cannot bind a CPU
run. The CPUs are ordered by socket, then core, so a contiguous share stays on one NUMA node
where it can and a core's hyperthreads go to the same rank. Kept free of torch imports: it
runs in ``python -m wattflex.runs.training`` before torch starts a thread, so every thread
inherits the binding.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

SYSFS_CPU = Path("/sys/devices/system/cpu")


def parse_cpu_list(text: str) -> list[int]:
    """A kernel CPU list (``0-3,8,10-11``) as its CPU ids."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def topology_order(cpus: Iterable[int], sysfs: Path = SYSFS_CPU) -> list[int]:
    """``cpus`` by socket, then physical core (a core's hyperthreads side by side); by id where
    sysfs does not say (a container without /sys)."""

    def place(cpu: int) -> tuple[int, int, int]:
        top = sysfs / f"cpu{cpu}" / "topology"
        return (
            int((top / "physical_package_id").read_text()),
            min(parse_cpu_list((top / "thread_siblings_list").read_text())),
            cpu,
        )

    try:
        return sorted(set(cpus), key=place)
    except (OSError, ValueError):
        return sorted(set(cpus))


def split_cpus(ordered: list[int], local_rank: int, local_world: int) -> list[int]:
    """Local rank ``local_rank``'s share of ``ordered``: ``local_world`` contiguous blocks whose
    sizes differ by at most one; with fewer CPUs than ranks, one CPU each, in turn."""
    if not ordered:
        raise ValueError("no CPUs to split")
    if not 0 <= local_rank < local_world:
        raise ValueError(
            f"local rank {local_rank} of {local_world}: must be in 0..{local_world - 1}"
        )
    if len(ordered) < local_world:
        return [ordered[local_rank % len(ordered)]]
    size, extra = divmod(len(ordered), local_world)
    start = local_rank * size + min(local_rank, extra)
    return ordered[start : start + size + (local_rank < extra)]


def bind_this_rank(env: Mapping[str, str] = os.environ) -> list[int]:
    """Bind this process to its local rank's share (torchrun's LOCAL_RANK, LOCAL_WORLD_SIZE)
    of the CPUs it may use; the CPUs it is bound to."""
    share = split_cpus(
        topology_order(os.sched_getaffinity(0)),
        int(env.get("LOCAL_RANK", "0")),
        int(env.get("LOCAL_WORLD_SIZE", "1")),
    )
    os.sched_setaffinity(0, share)
    return share
