"""Real GPUs through NVML (nvidia-ml-py's ``pynvml``): power-limit control and telemetry.

``NvmlGpu`` is one local GPU. It satisfies ``devices.base.PowerCapDevice`` (constraints,
set_cap, enforced_limit_w, restore) and ``TelemetrySource`` (one row per sample with the
columns of ``wattflex.telemetry.TELEMETRY_COLUMNS`` plus ``clock_event_reasons``):

* power_w: instantaneous board power (``NVML_FI_DEV_POWER_INSTANT``; the 1-s average from
  ``nvmlDeviceGetPowerUsage`` where the field is unsupported);
* energy_j: the total-energy counter, relative to the GPU's first sample;
* gpu_util / mem_copy_util: ``nvmlDeviceGetUtilizationRates`` (the latter is what DCGM
  calls DEV_MEM_COPY_UTIL);
* dram_active / sm_active / tensor_active (0-1): GPM metrics DRAM_BW_UTIL, SM_UTIL and
  ANY_TENSOR_UTIL on Hopper and later, when the driver lets this user profile. GPM is read
  between two samples: each row covers the time since the previous one (the first, since
  the GPU was opened). A permission (or any) GPM
  error disables GPM for the run with one logged warning; it never stops the run.
* power_limit_w: the management (set) limit; enforced_limit_w: what the firmware enforces.

pynvml is imported lazily (``nvml()``), so tests replace it with a stub in
``sys.modules["pynvml"]`` and nothing else.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Callable
from typing import Any

from wattflex.metrics import gpm_metrics
from wattflex.runs.devices.base import (
    LIMIT_TOLERANCE_W,
    CapError,
    CapPermissionError,
    check_cap,
    empty_row,
)
from wattflex.schema import section_defaults

_GPM = section_defaults("cuda")["gpm"]  # sample the GPM (profiling) metrics where supported
log = logging.getLogger("wattflex.runs.devices.nvml")
GIB = 1024**3

_initialised = False


def nvml():
    """The initialised ``pynvml`` module, or a clear error saying what is missing."""
    global _initialised
    try:
        import pynvml
    except ImportError as exc:
        raise RuntimeError("NVML is not available: install nvidia-ml-py (envs/train.yaml)") from exc
    if not _initialised:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise RuntimeError(
                f"NVML could not start ({exc}): no NVIDIA driver on this machine? "
                f"On a machine without GPUs use cuda.device: cpu with sampler: false and "
                f"cap_control: observe"
            ) from exc
        _initialised = True
    return pynvml


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _is_no_permission(nv: Any, exc: BaseException) -> bool:
    return getattr(exc, "value", None) == getattr(nv, "NVML_ERROR_NO_PERMISSION", 4)


class GpmReader:
    """GPM profiling metrics of one GPU between consecutive calls (fractions 0-1)."""

    def __init__(self, nv: Any, handle: Any, label: str):
        self.nv, self.handle, self.label = nv, handle, label
        self.metrics = {col: getattr(nv, const) for col, const in gpm_metrics().items()}
        self.status = "enabled"
        self._prev = None
        try:
            if not nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                self.status = "disabled: GPM not supported on this GPU"
                return
            self._prev = nv.nvmlGpmSampleGet(handle, nv.nvmlGpmSampleAlloc())
        except Exception as exc:
            self._disable(exc)

    @property
    def enabled(self) -> bool:
        return self.status == "enabled"

    def _disable(self, exc: BaseException) -> None:
        why = (
            "no permission to profile (driver option NVreg_RestrictProfilingToAdminUsers, or DCGM "
            "profiling holds the counters)"
            if _is_no_permission(self.nv, exc)
            else f"{type(exc).__name__}: {exc}"
        )
        self.status = f"disabled: {why}"
        self._prev = None
        log.warning("GPM disabled on %s: %s; dram/sm/tensor activity will be NaN", self.label, why)

    def read(self) -> dict[str, float]:
        if not self.enabled:
            return {}
        nv = self.nv
        try:
            cur = nv.nvmlGpmSampleGet(self.handle, nv.nvmlGpmSampleAlloc())
            req = nv.c_nvmlGpmMetricsGet_t()
            req.version = nv.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(self.metrics)
            req.sample1, req.sample2 = self._prev, cur
            for i, mid in enumerate(self.metrics.values()):
                req.metrics[i].metricId = mid
            nv.nvmlGpmMetricsGet(req)
            nv.nvmlGpmSampleFree(self._prev)
            self._prev = cur
        except Exception as exc:
            self._disable(exc)
            return {}
        out = {}
        for i, key in enumerate(self.metrics):
            m = req.metrics[i]
            out[key] = m.value / 100.0 if getattr(m, "nvmlReturn", 0) == 0 else math.nan
        return out


class NvmlGpu:
    """One local GPU. ``original_limit_w`` is the management limit found at construction:
    what ``restore`` puts back. ``set_limit`` (``(index, watts) -> None``) replaces the
    direct NVML call, e.g. an admin-approved command (``wattflex.runs.devices.caps.command_setter``)."""

    def __init__(
        self,
        index: int,
        set_limit: Callable[[int, float], None] | None = None,
        gpm: bool = _GPM,
        node: str | None = None,
    ):
        self.nv = nvml()
        self.index = int(index)
        self.handle = self.nv.nvmlDeviceGetHandleByIndex(self.index)
        self.model = _text(self.nv.nvmlDeviceGetName(self.handle))
        self.uuid = _text(self.nv.nvmlDeviceGetUUID(self.handle))
        self.node = node or socket.gethostname()
        self._set_limit = set_limit
        self.original_limit_w = self.power_limit_w()
        self.gpm = GpmReader(self.nv, self.handle, self.name) if gpm else None
        self._energy0_j: float | None = None
        self._instant_power = True
        self._field_errors: set[str] = set()

    @property
    def name(self) -> str:
        return f"GPU {self.index} ({self.model}, {self.uuid})"

    # ---- power limits (W) ---------------------------------------------------------------
    def constraints(self) -> tuple[float, float]:
        lo, hi = self.nv.nvmlDeviceGetPowerManagementLimitConstraints(self.handle)
        return lo / 1000.0, hi / 1000.0

    def default_limit_w(self) -> float:
        return self.nv.nvmlDeviceGetPowerManagementDefaultLimit(self.handle) / 1000.0

    def power_limit_w(self) -> float:
        return self.nv.nvmlDeviceGetPowerManagementLimit(self.handle) / 1000.0

    def enforced_limit_w(self) -> float:
        return self.nv.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000.0

    def set_limit_w(self, watts: float) -> None:
        """Set the management limit and check it reads back; no constraint check."""
        try:
            if self._set_limit is not None:
                self._set_limit(self.index, watts)
            else:
                self.nv.nvmlDeviceSetPowerManagementLimit(self.handle, int(round(watts * 1000)))
        except self.nv.NVMLError as exc:
            if _is_no_permission(self.nv, exc):
                raise CapPermissionError(
                    f"{self.name}: not permitted to set the power limit to {watts:g} W (NVML needs root). "
                    f"Use cap_control: command with an admin-approved wrapper (cap_command), or "
                    f"cap_control: observe to run at the GPU's current limit"
                ) from exc
            raise CapError(
                f"{self.name}: setting the power limit to {watts:g} W failed: {exc}"
            ) from exc
        now = self.power_limit_w()
        if abs(now - watts) > LIMIT_TOLERANCE_W:
            raise CapError(f"{self.name}: asked for a {watts:g} W limit, it reads back {now:g} W")

    def set_cap(self, cap_w: float) -> float:
        check_cap(self, cap_w)
        if abs(self.power_limit_w() - cap_w) > LIMIT_TOLERANCE_W / 2:
            self.set_limit_w(cap_w)
        enforced = self.enforced_limit_w()
        if enforced > cap_w + LIMIT_TOLERANCE_W:
            raise CapError(f"{self.name}: limit set to {cap_w:g} W but {enforced:g} W is enforced")
        if enforced < cap_w - LIMIT_TOLERANCE_W:
            log.warning(
                "%s: cap %g W, but a lower limit is enforced (%g W: another power policy, "
                "e.g. a chassis or datacenter limit)",
                self.name,
                cap_w,
                enforced,
            )
        return enforced

    def restore(self) -> None:
        if abs(self.power_limit_w() - self.original_limit_w) > LIMIT_TOLERANCE_W / 2:
            self.set_limit_w(self.original_limit_w)

    # ---- SM clock lock (MHz; wattflex.runs.devices.clocks.ClockGuard) -------------------
    def sm_clock_range(self) -> tuple[float, float]:
        """The SM clocks a lock may name: the catalogue's lowest clock for this model
        (``wattflex.gpus``; 0 for a model it lacks) to NVML's maximum SM clock."""
        from wattflex.gpus import GPUS

        hi = float(self.nv.nvmlDeviceGetMaxClockInfo(self.handle, self.nv.NVML_CLOCK_SM))
        lo = next((spec.sm_clock_min_mhz for key, spec in GPUS.items() if key in self.model), 0.0)
        return lo, hi

    def sm_clock_mhz(self) -> float:
        return float(self.nv.nvmlDeviceGetClockInfo(self.handle, self.nv.NVML_CLOCK_SM))

    def _clock_call(self, what: str, fn: Callable, *args: Any) -> None:
        try:
            fn(self.handle, *args)
        except self.nv.NVMLError as exc:
            if _is_no_permission(self.nv, exc):
                raise CapPermissionError(
                    f"{self.name}: not permitted to {what} (NVML needs root; "
                    f"or use SLURM --gpu-freq)"
                ) from exc
            raise CapError(f"{self.name}: {what} failed: {exc}") from exc

    def lock_clock(self, mhz: float) -> None:
        """``nvmlDeviceSetGpuLockedClocks(f, f)``: the SM clock held at ``mhz`` (the power limit still holds)."""
        f = int(round(mhz))
        self._clock_call(
            f"lock the SM clock at {f} MHz", self.nv.nvmlDeviceSetGpuLockedClocks, f, f
        )

    def reset_clock(self) -> None:
        """``nvmlDeviceResetGpuLockedClocks``: the firmware picks the SM clock again."""
        self._clock_call("reset the locked SM clock", self.nv.nvmlDeviceResetGpuLockedClocks)

    # ---- telemetry ----------------------------------------------------------------------
    def _read(self, field: str, fn: Callable, *args: Any) -> Any:
        try:
            return fn(self.handle, *args)
        except self.nv.NVMLError as exc:
            if field not in self._field_errors:
                self._field_errors.add(field)
                log.warning("%s: cannot read %s (%s); NaN", self.name, field, exc)
            return None

    def _power_w(self) -> float:
        nv = self.nv
        if self._instant_power:
            vals = self._read(
                "power (instant)", nv.nvmlDeviceGetFieldValues, [nv.NVML_FI_DEV_POWER_INSTANT]
            )
            if vals is not None and vals[0].nvmlReturn == 0:
                return vals[0].value.uiVal / 1000.0
            self._instant_power = False
            log.info(
                "%s: instant power field unsupported; using nvmlDeviceGetPowerUsage (1 s average)",
                self.name,
            )
        mw = self._read("power", nv.nvmlDeviceGetPowerUsage)
        return math.nan if mw is None else mw / 1000.0

    def sample(self, t_s: float) -> dict[str, Any]:
        nv = self.nv
        row = empty_row(t_s, self.node, self.index)
        row["power_w"] = self._power_w()
        mj = self._read("energy", nv.nvmlDeviceGetTotalEnergyConsumption)
        if mj is not None:
            if self._energy0_j is None:
                self._energy0_j = mj / 1000.0
            row["energy_j"] = mj / 1000.0 - self._energy0_j
        for col, clock in (
            ("sm_clock_mhz", nv.NVML_CLOCK_SM),
            ("mem_clock_mhz", nv.NVML_CLOCK_MEM),
        ):
            v = self._read(col, nv.nvmlDeviceGetClockInfo, clock)
            row[col] = math.nan if v is None else float(v)
        util = self._read("utilization", nv.nvmlDeviceGetUtilizationRates)
        if util is not None:
            row["gpu_util"], row["mem_copy_util"] = float(util.gpu), float(util.memory)
        mem = self._read("memory", nv.nvmlDeviceGetMemoryInfo)
        if mem is not None:
            row["fb_used_gib"] = mem.used / GIB
        temp = self._read("temperature", nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        row["temp_c"] = math.nan if temp is None else float(temp)
        for col, fn in (
            ("power_limit_w", nv.nvmlDeviceGetPowerManagementLimit),
            ("enforced_limit_w", nv.nvmlDeviceGetEnforcedPowerLimit),
        ):
            v = self._read(col, fn)
            row[col] = math.nan if v is None else v / 1000.0
        reasons_fn = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        reasons = self._read("clock event reasons", reasons_fn)
        row["clock_event_reasons"] = math.nan if reasons is None else float(reasons)
        if self.gpm is not None:
            row.update(self.gpm.read())
        return row

    def describe(self) -> dict[str, Any]:
        """Facts for run.json."""
        lo, hi = self.constraints()
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.model,
            "node": self.node,
            "min_limit_w": lo,
            "max_limit_w": hi,
            "default_limit_w": self.default_limit_w(),
            "original_limit_w": self.original_limit_w,
            "power_limit_w": self.power_limit_w(),
            "enforced_limit_w": self.enforced_limit_w(),
            "gpm": self.gpm.status if self.gpm is not None else "off",
        }


def local_gpu_indices(count: int | None = None, visible: str | None = None) -> list[int]:
    """NVML indices of the GPUs this job may use: ``CUDA_VISIBLE_DEVICES`` (indices or
    UUIDs, as SLURM sets it) when set, else all; the first ``count`` of them."""
    nv = nvml()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    if visible is not None and visible.strip():
        out = []
        for item in (v.strip() for v in visible.split(",") if v.strip()):
            if item.isdigit():
                out.append(int(item))
            else:
                out.append(int(nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByUUID(item))))
    else:
        out = list(range(nv.nvmlDeviceGetCount()))
    if count is not None:
        if count > len(out):
            raise RuntimeError(
                f"the job wants {count} GPUs on this node but NVML/CUDA_VISIBLE_DEVICES "
                f"offers {len(out)}"
            )
        out = out[:count]
    return out


def open_gpus(
    count: int | None = None,
    set_limit: Callable[[int, float], None] | None = None,
    gpm: bool = _GPM,
    indices: list[int] | None = None,
    node: str | None = None,
) -> list[NvmlGpu]:
    """The local GPUs (``indices``, else the first ``count`` visible), named on ``node``
    (default: the host name)."""
    return [
        NvmlGpu(i, set_limit=set_limit, gpm=gpm, node=node)
        for i in (indices or local_gpu_indices(count))
    ]
