"""The emulated backend: a virtual H200/H100 node set running one training job.

``EmulatedDevice`` has the same face as the NVML device (read constraints, set and
restore a cap) so cap logic is exercised identically; ``simulate_run`` turns the physics of
``wattflex.runs.emulator`` into the artifacts a real run writes: per-GPU telemetry at the
sampling period, a per-step log, and the run record.

Trace shape (paper §2): warmup (weights loading, framebuffer < 10 GiB, GPU util 0), startup
(weights resident, util 0; longer with torch.compile), training with an evaluation dip at
``eval_at_s`` and a checkpoint dip at ``checkpoint_at_s``. Noise: per-sample AR(1) jitter
(~1 % power, ~0.8 % step time), per-run factors (sd 0.6 % in tokens/s, 0.5 %
in power), fixed per-GPU silicon variation within a group (same nodes for every cap).
A cap schedule (list of ``(t_s, cap_w)``) lets a run change caps mid-run; the firmware's
response settles with a ~2 s time constant, so a sample right after a change is in
between. Deterministic per seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from wattflex.gpus import DEFAULT_GPU, GPUS, GPUS_PER_NODE, GPUSpec
from wattflex.metrics import telemetry_columns
from wattflex.runs.emulator.clock_knob import job_at_clock
from wattflex.runs.emulator.physics import PHYSICS, Physics, calibrated_physics, physics_for_gpu
from wattflex.runs.emulator.step import JobSpec, gpu_leakages, job_at_caps, memory_footprint_gib
from wattflex.runs.emulator.timeline import FIRST_STEPS_EXTRA, FIRST_STEPS_TAU_S, start_phases_s
from wattflex.runs.spec import RunSpec
from wattflex.schema import section_defaults
from wattflex.telemetry import STEP_COLUMNS

if (
    TYPE_CHECKING
):  # frames for callers that want them; a run's own job writes arrow tables (no pandas)
    import pandas as pd

SETTLE_TAU_S = 2.0
# Per-run factors (sd), drawn first (tokens/s) then second (power) from each run's generator;
# of the order of the paper's run-to-run repeatability (median CV 0.4 % power, 0.5 % tokens/s
# over 35 repeated runs; the summaries' top-10 % aggregate then gives ~0.3 %, docs/emulator.md).
RUN_NOISE = {"tokens_per_s_sd": 0.006, "power_sd": 0.005}


def numpy_table(columns: dict[str, np.ndarray]) -> pa.Table:
    """A pyarrow table of 1-D numeric numpy columns (zero-copy). ``pa.table``/``pa.array``
    would import pandas (~0.3 s of every emulated run job) to check for DataFrames."""
    arrays = []
    for values in columns.values():
        values = np.ascontiguousarray(values)
        arrays.append(
            pa.Array.from_buffers(
                pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)]
            )
        )
    return pa.Table.from_arrays(arrays, names=list(columns))


def stable_seed(*parts: Any) -> int:
    """A seed from strings/numbers that is stable across processes (unlike hash())."""
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "little")


def hardware_seed(seed: int, group_id: str) -> int:
    """Seed of a group's per-GPU silicon variation: the same virtual nodes at every cap."""
    return stable_seed(seed, "hardware", group_id)


def run_seed(seed: int, campaign: str, group_id: str, run_id: str) -> int:
    """Seed of one run's own generator (per-run factors, jitter, steps)."""
    return stable_seed(seed, campaign, group_id, run_id)


def run_factors(
    rng: np.random.Generator, noise: dict[str, float] = RUN_NOISE
) -> tuple[float, float]:
    """Per-run (tokens/s, power) factors: thermal/ambient and data-order variation between
    runs; the first two draws of a run's generator."""
    return rng.normal(1.0, noise["tokens_per_s_sd"]), rng.normal(1.0, noise["power_sd"])


def steady_temp_c(power_w: np.ndarray | float) -> np.ndarray | float:
    """GPU temperature a constant board power settles at (first-order thermal model)."""
    return 28.0 + 0.075 * np.asarray(power_w)


class CapOutOfRange(ValueError):
    """A cap outside the part's power-limit range (NVML refuses it the same way)."""


@dataclass
class EmulatedDevice:
    """A virtual GPU's power-limit interface (what NVML offers on a real one)."""

    spec: GPUSpec
    limit_w: float | None = None

    def __post_init__(self) -> None:
        """Remember the default limit as the original; start there unless a limit is given."""
        self.original_limit_w = self.spec.default_limit_w
        if self.limit_w is None:
            self.limit_w = self.original_limit_w

    @property
    def name(self) -> str:
        """The device name runs record, ``emulated-<part>``."""
        return f"emulated-{self.spec.name}"

    def constraints(self) -> tuple[float, float]:
        """(min, max) power limit in W, as NVML's power-management limit constraints."""
        return self.spec.min_limit_w, self.spec.max_limit_w

    def set_cap(self, cap_w: float) -> float:
        """Set the power limit; the limit enforced. ``CapOutOfRange`` outside the constraints."""
        lo, hi = self.constraints()
        if not lo <= cap_w <= hi:
            raise CapOutOfRange(
                f"{self.name}: cap {cap_w:g} W outside the allowed range {lo:g}-{hi:g} W"
            )
        self.limit_w = float(cap_w)
        return self.enforced_limit_w()

    def enforced_limit_w(self) -> float:
        """The limit in force (W): the one set, at most the part's maximum."""
        return float(min(self.limit_w, self.spec.max_limit_w))

    def restore(self) -> None:
        """Put the original (default) limit back."""
        self.limit_w = self.original_limit_w


def _ar1(
    rng: np.random.Generator, shape: tuple[int, int], sd: float, phi: float = 0.6
) -> np.ndarray:
    """AR(1) noise along axis 0 with stationary standard deviation ``sd``."""
    e = rng.normal(0.0, sd * np.sqrt(1 - phi**2), shape)
    out = np.empty(shape)
    out[0] = rng.normal(0.0, sd, shape[1])
    for i in range(1, shape[0]):
        out[i] = phi * out[i - 1] + e[i]
    return out


def simulate_run(
    job: JobSpec,
    gpu: GPUSpec,
    cap_schedule: Sequence[tuple[float, float]],
    run_cfg: dict[str, Any],
    seed: int,
    hw_seed: int,
    model_name: str = "",
    physics: Physics = PHYSICS,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Telemetry, step log and run facts of one emulated run."""
    tel, steps, facts = simulate_run_tables(
        job, gpu, cap_schedule, run_cfg, seed, hw_seed, model_name, physics
    )
    return tel.to_pandas(), steps.to_pandas(), facts


def simulate_run_tables(
    job: JobSpec,
    gpu: GPUSpec,
    cap_schedule: Sequence[tuple[float, float]],
    run_cfg: dict[str, Any],
    seed: int,
    hw_seed: int,
    model_name: str = "",
    physics: Physics = PHYSICS,
    clock_mhz: float | None = None,
) -> tuple[pa.Table, pa.Table, dict[str, Any]]:
    """``simulate_run`` as pyarrow tables (what a run writes), without loading pandas.
    ``clock_mhz``: every GPU's SM clock locked there (``knob: clock``; the schedule's caps
    are then the power limits the lock runs under, :func:`wattflex.runs.emulator.clock_knob.job_at_clock`)."""
    run_defaults = section_defaults("run")  # a run_cfg from wattflex.config.run_spec has both
    duration = float(run_cfg.get("duration_s", run_defaults["duration_s"]))
    dt = float(run_cfg.get("sample_period_s", run_defaults["sample_period_s"]))
    eval_at = run_cfg.get("eval_at_s")
    ckpt_at = run_cfg.get("checkpoint_at_s")
    rng = np.random.default_rng(seed)
    leak = gpu_leakages(hw_seed, job.gpus, physics)
    device = EmulatedDevice(gpu)

    schedule = sorted((float(t), float(c)) for t, c in cap_schedule)
    enforced = [device.set_cap(cap) for _, cap in schedule]
    if clock_mhz is None:
        states = job_at_caps(job, gpu, [cap for _, cap in schedule], leak, physics=physics)
    else:
        states = [
            job_at_clock(job, gpu, clock_mhz, leak, physics, limit_w=cap) for _, cap in schedule
        ]
    seg_start = np.array([t for t, _ in schedule])

    fb_gib = memory_footprint_gib(job, gpu, physics)
    warmup_s, startup_s = start_phases_s(job)
    train_start = warmup_s + startup_s
    eval_len = 45.0
    ckpt_len = 20.0 + 0.25 * fb_gib
    windows = []  # (start, length, kind) of non-training periods inside the training phase
    if eval_at is not None and train_start < eval_at < duration:
        windows.append((float(eval_at), eval_len, "eval"))
    if ckpt_at is not None and train_start < ckpt_at < duration:
        windows.append((float(ckpt_at), ckpt_len, "checkpoint"))
    windows.sort()

    run_tput, run_power = run_factors(rng)  # nothing drew from rng before (run_factors)

    # ---- step log ----------------------------------------------------------------------
    steps_t, tokens_per_step = [], job.tokens_per_step
    step_noise = rng.normal(0.0, 0.008, 200_000)
    t, i = train_start, 0
    wi = 0
    while True:
        seg = max(0, int(np.searchsorted(seg_start, t, side="right")) - 1)
        # first steps slower (allocator, caches)
        ramp = 1.0 + FIRST_STEPS_EXTRA * np.exp(-(t - train_start) / FIRST_STEPS_TAU_S)
        t += states[seg].step_s * ramp * (1.0 + step_noise[i % step_noise.size]) / run_tput
        while wi < len(windows) and t > windows[wi][0]:
            t += windows[wi][1]
            wi += 1
        if t > duration:
            break
        steps_t.append(t)
        i += 1
    n_steps = len(steps_t)
    step_idx = np.arange(1, n_steps + 1)
    loss0, loss_inf = (10.5, 2.4) if job.task == "pt" else (2.2, 1.3)
    loss = (
        loss_inf
        + (loss0 - loss_inf) * np.exp(-step_idx / max(50.0, n_steps / 3))
        + rng.normal(0, 0.02, n_steps)
    )
    steps = numpy_table(
        {
            "step": step_idx,
            "t_end_s": np.round(steps_t, 4),
            "tokens": np.full(n_steps, tokens_per_step, dtype=np.int64),
            "loss": loss,
        }
    )

    # ---- telemetry -------------------------------------------------------------------
    ts = np.arange(dt, duration + 1e-9, dt)
    n, G = ts.size, job.gpus
    seg_idx = np.clip(np.searchsorted(seg_start, ts, side="right") - 1, 0, len(states) - 1)

    def per_gpu(attr: str) -> np.ndarray:
        table = np.array([[getattr(g, attr) for g in s.per_gpu] for s in states])  # (segments, G)
        cur = table[seg_idx]
        # Settling after a cap change: exponential approach from the previous segment.
        prev = table[np.maximum(seg_idx - 1, 0)]
        since = ts - seg_start[seg_idx]
        w = np.where(seg_idx > 0, np.exp(-since / SETTLE_TAU_S), 0.0)[:, None]
        return cur + (prev - cur) * w

    power = per_gpu("power_w") * run_power * (1 + _ar1(rng, (n, G), 0.010))
    clock = per_gpu("sm_clock_mhz")
    dram = per_gpu("dram_active") * (1 + _ar1(rng, (n, G), 0.006))
    sm = per_gpu("sm_active") * (1 + _ar1(rng, (n, G), 0.004))
    tensor = per_gpu("tensor_active") * (1 + _ar1(rng, (n, G), 0.006))
    util = np.minimum(100.0, per_gpu("gpu_util") + rng.normal(0, 0.5, (n, G)))
    copy = np.minimum(100.0, per_gpu("mem_copy_util") * (1 + _ar1(rng, (n, G), 0.006)))
    fb = np.full((n, G), fb_gib) + rng.normal(0, 0.05, (n, G))

    idle = gpu.idle_w * (1 + rng.normal(0, 0.01, (n, G)))
    warm = ts < warmup_s
    start = (ts >= warmup_s) & (ts < train_start)
    for mask, p_w, u in ((warm, idle + 5, 0.0), (start, idle + 15, 0.0)):
        power[mask] = p_w[mask]
        util[mask] = u
        for arr in (dram, sm, tensor, copy):
            arr[mask] = 0.0
        clock[mask] = (
            gpu.sm_clock_max_mhz
            if clock_mhz is None
            else min(float(clock_mhz), gpu.sm_clock_max_mhz)
        )
    fb[warm] = (0.5 + 7.5 * ts[warm] / warmup_s)[:, None]
    for w0, wl, kind in windows:
        m = (ts > w0) & (ts <= w0 + wl)
        if kind == "eval":  # forward only, smaller batches: partial activity
            power[m] = idle[m] + 0.55 * (power[m] - idle[m])
            util[m] = 62.0 + rng.normal(0, 3, util[m].shape)
            for arr in (dram, sm, tensor, copy):
                arr[m] *= 0.55
        else:  # checkpoint: GPUs wait on storage
            power[m] = idle[m] + 30
            util[m] = 4.0
            for arr in (dram, sm, tensor, copy):
                arr[m] *= 0.05
    caps_at = np.array([c for _, c in schedule])[seg_idx]
    enforced_at = np.array(enforced)[seg_idx]
    power = np.minimum(
        power, caps_at[:, None] * 1.01
    )  # firmware holds the limit (1 % sensor slack)
    temp = np.empty((n, G))
    temp[0] = 30.0
    a = 1 - np.exp(-dt / 60.0)
    for k in range(1, n):
        temp[k] = temp[k - 1] + a * (steady_temp_c(power[k]) - temp[k - 1])
    energy = np.cumsum(power * dt, axis=0)

    gpu_ids = np.arange(G)
    columns = {
        "t_s": np.repeat(ts, G),
        "node": np.tile(gpu_ids // GPUS_PER_NODE, n),
        "gpu": np.tile(gpu_ids % GPUS_PER_NODE, n),
        "power_w": power.ravel(),
        "energy_j": energy.ravel(),
        "sm_clock_mhz": clock.ravel(),
        "mem_clock_mhz": np.full(n * G, gpu.mem_clock_mhz),
        "gpu_util": util.ravel(),
        "mem_copy_util": copy.ravel(),
        "dram_active": dram.ravel(),
        "sm_active": sm.ravel(),
        "tensor_active": tensor.ravel(),
        "fb_used_gib": fb.ravel(),
        "temp_c": temp.ravel(),
        "power_limit_w": np.repeat(caps_at, G),
        "enforced_limit_w": np.repeat(enforced_at, G),
    }
    # the registry's columns, in its order; a metric the emulator does not model is NaN
    tel = numpy_table({c: columns.get(c, np.full(n * G, np.nan)) for c in telemetry_columns()})
    device.restore()
    facts = {
        "backend": "emulated",
        "device_model": gpu.name,
        "device": device.name,
        "gpus": G,
        "cap_schedule": [{"t_s": t0, "cap_w": c} for t0, c in schedule],
        "enforced_limit_w": enforced,
        "original_limit_w": device.original_limit_w,
        "limit_restored_w": device.limit_w,
        "phases_s": {"warmup": warmup_s, "startup": startup_s},
        "events": [{"kind": k, "t_s": w0, "length_s": wl} for w0, wl, k in windows],
        "model_tokens_per_s": [s.tokens_per_s for s in states],
        "model_power_w": [s.power_w for s in states],
        "n_steps": n_steps,
        "model": model_name,
        "emulator_anchor_clock_mhz": physics.anchor_clock_mhz,
    }
    if clock_mhz is not None:
        facts["clock_lock"] = {"clock_control": "emulated", "clock_mhz_requested": float(clock_mhz)}
    return tel, steps.select(STEP_COLUMNS), facts


def run_emulated(
    spec: dict[str, Any] | RunSpec,
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """One emulated run from a run spec (``wattflex.config.run_spec``)."""
    tel, steps, facts = run_emulated_tables(spec)
    return tel.to_pandas(), steps.to_pandas(), facts


def run_emulated_tables(
    spec: dict[str, Any] | RunSpec,
) -> tuple[pa.Table, pa.Table, dict[str, Any]]:
    """``run_emulated`` as pyarrow tables, the files' contents (the runner writes these)."""
    spec = RunSpec.of(spec, backend="emulated")
    group = spec.group
    gpu = GPUS[group.get("gpu", DEFAULT_GPU)]
    job = JobSpec.from_config(group, spec.model_facts)
    schedule = spec.cap_schedule or [(0.0, float(spec.cap_w))]
    seed = run_seed(spec.seed, spec.campaign, group["id"], spec.run_id)
    hw_seed = hardware_seed(spec.seed, group["id"])
    return simulate_run_tables(
        job,
        gpu,
        schedule,
        spec.run,
        seed,
        hw_seed,
        model_name=group["model"],
        physics=spec_physics(spec, gpu),
        clock_mhz=spec.clock_mhz,
    )


def spec_physics(spec: dict[str, Any] | RunSpec, gpu: GPUSpec | None = None) -> Physics:
    """The emulator's physics for a run spec: the campaign's calibration file
    (``emulator: {calibration: FILE}``, its JSON in ``spec["emulator"]["calibration"]``), else
    the default ``PHYSICS``; on ``gpu``, one of its die (``emulator.physics_for_gpu``)."""
    calibration = RunSpec.of(spec, backend="emulated").calibration
    return calibrated_physics(calibration) if gpu is None else physics_for_gpu(gpu, calibration)
