"""The SM clock lock as a knob, emulated through the DVFS model.

A locked SM clock runs every GPU of a job at the same clock ``f`` (NVML
``nvmlDeviceSetGpuLockedClocks(f, f)``, SLURM ``--gpu-freq``); the board's power limit still
holds (the firmware lowers the clock below the lock when the power at ``f`` exceeds it).
Under a power cap, instead, each GPU's firmware picks the highest clock whose power fits
(:func:`wattflex.runs.emulator.step.enforce_cap`), so a leakier GPU runs slower and the others
wait for it at every step at a higher clock; a clock lock has no such straggler: locked at
the slowest GPU's clock under a cap, the job trains as fast at no more power (the DVFS
model's operating points, per GPU, are the same).

:func:`job_at_clock` is the steady state of a job at one locked clock and
:func:`clock_curve` the job's power -> throughput points over a list of clocks: the
clock knob's PFI-like curve, which the knob menu (:mod:`wattflex.allocation.knobs`) takes
beside the cap curve.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wattflex.gpus import GPUSpec
from wattflex.runs.emulator.physics import PHYSICS, Physics
from wattflex.runs.emulator.step import (
    JobAtCap,
    JobSpec,
    enforce_cap,
    operating_points,
    synchronous_step,
)

# Clocks a clock sweep locks at when none are given: 20 % to 100 % of the part's maximum SM
# clock in 6 even steps (chosen here, not measured: 20 % of the H100/H200's 1980 MHz, 390 MHz
# on its bin, is near their lowest 345 MHz, where a 200 W cap takes training kernels in the
# emulator), rounded to the 15 MHz bins NVML accepts.
DEFAULT_CLOCK_FRACTIONS = (0.2, 0.36, 0.52, 0.68, 0.84, 1.0)


def default_clocks(gpu: GPUSpec) -> list[float]:
    """The default lock points of ``gpu`` (MHz), on its clock bins."""
    bins = gpu.clock_bins()
    return [
        float(bins[np.argmin(np.abs(bins - x * gpu.sm_clock_max_mhz))])
        for x in DEFAULT_CLOCK_FRACTIONS
    ]


def job_at_clock(
    job: JobSpec,
    gpu: GPUSpec,
    clock_mhz: float,
    leakages: np.ndarray,
    physics: Physics = PHYSICS,
    limit_w: float | None = None,
) -> JobAtCap:
    """Steady state of ``job`` with every GPU locked at ``clock_mhz`` under the power limit
    ``limit_w`` (default: the part's default limit). ``cap_w`` of the result is the limit."""
    limit = gpu.default_limit_w if limit_w is None else float(limit_w)
    bins = gpu.clock_bins()
    lock = int(np.searchsorted(bins, float(clock_mhz) + 1e-9) - 1)
    if lock < 0:
        raise ValueError(f"clock {clock_mhz:g} MHz is below {gpu.name}'s lowest {bins[0]:g} MHz")
    own = []
    for leak in leakages:
        pts = operating_points(job, gpu, leakage=float(leak), physics=physics)
        own.append((pts, min(lock, enforce_cap(pts, limit))))
    return synchronous_step(job, gpu, limit, own, physics)


def clock_curve(
    job: JobSpec,
    gpu: GPUSpec,
    leakages: np.ndarray,
    clocks_mhz: Sequence[float] | None = None,
    physics: Physics = PHYSICS,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(clock_mhz, job power_w, tokens_per_s) at each locked clock, sorted by power."""
    clocks = default_clocks(gpu) if clocks_mhz is None else [float(c) for c in clocks_mhz]
    states = [job_at_clock(job, gpu, c, leakages, physics) for c in clocks]
    P = np.array([s.power_w for s in states])
    T = np.array([s.tokens_per_s for s in states])
    order = np.argsort(P, kind="stable")
    return np.asarray(clocks)[order], P[order], T[order]
