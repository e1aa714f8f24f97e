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
import re
import socket
import stat
import subprocess
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
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
        """Whether GPM metrics are read on this GPU (``status`` is ``enabled``)."""
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
        """The GPM metrics over the interval since the last read, as 0-1 fractions by column; ``{}``
        when GPM is not enabled. A failing read disables GPM for the run (logged once).
        """
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
        uuid: str | None = None,
    ):
        self.nv = nvml()
        try:  # by UUID where known: an index may name another GPU in another process
            if uuid:
                self.handle = self.nv.nvmlDeviceGetHandleByUUID(uuid)
                index = self.nv.nvmlDeviceGetIndex(self.handle)
            else:
                self.handle = self.nv.nvmlDeviceGetHandleByIndex(int(index))
        except self.nv.NVMLError as exc:
            which = f"GPU {uuid}" if uuid else f"GPU index {index}"
            why = "no permission: not this job's GPU" if _is_no_permission(self.nv, exc) else exc
            raise GpuIdentityError(f"{which}: NVML cannot open it ({why})") from None
        self.index = int(index)
        self.model = _text(self.nv.nvmlDeviceGetName(self.handle))
        self.uuid = _text(self.nv.nvmlDeviceGetUUID(self.handle))
        self.pci_bus_id = _text(self.nv.nvmlDeviceGetPciInfo(self.handle).busId)
        self._old_calls: set[str] = set()  # successors this module or driver lacks
        self.node = node or socket.gethostname()
        self._set_limit = set_limit
        self.original_limit_w = self.power_limit_w()
        self.gpm = GpmReader(self.nv, self.handle, self.name) if gpm else None
        self._energy0_j: float | None = None
        self._instant_power = True
        self._field_errors: set[str] = set()

    @property
    def name(self) -> str:
        """The GPU as messages name it: ``GPU <index> (<model>, <uuid>)``."""
        return f"GPU {self.index} ({self.model}, {self.uuid})"

    # ---- power limits (W) ---------------------------------------------------------------
    def constraints(self) -> tuple[float, float]:
        """The (lowest, highest) power limit in W NVML accepts for this GPU."""
        lo, hi = self.nv.nvmlDeviceGetPowerManagementLimitConstraints(self.handle)
        return lo / 1000.0, hi / 1000.0

    def default_limit_w(self) -> float:
        """The GPU's default power limit in W (NVML's value in mW / 1000)."""
        return self.nv.nvmlDeviceGetPowerManagementDefaultLimit(self.handle) / 1000.0

    def power_limit_w(self) -> float:
        """The power limit in W set now (NVML's value in mW / 1000)."""
        return self.nv.nvmlDeviceGetPowerManagementLimit(self.handle) / 1000.0

    def enforced_limit_w(self) -> float:
        """The power limit in W the GPU enforces now: the lowest of all limits set on it."""
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
        """Set the power limit to ``cap_w`` W (skipped when already within 0.5 W). Returns the enforced
        limit read back, in W; a lower enforced limit (another policy) is logged.

        Raises CapConstraintError outside the GPU's range, CapError when more than ``cap_w`` is
        enforced, CapPermissionError (via ``set_limit_w``) without the right.
        """
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
        """Put back the limit the GPU had when opened, if it differs by more than 0.5 W."""
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
        """The SM clock now, in MHz."""
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

    def _successor(self, new: str, old: str, *args: Any) -> Any:
        """NVML call ``new``, or the deprecated ``old`` it replaces ("will be removed in CUDA
        14.0", nvidia-ml-py 13.615) where the module lacks ``new`` or the driver answers
        ``NVML_ERROR_FUNCTION_NOT_FOUND``; the choice sticks for this GPU."""
        nv = self.nv
        if new not in self._old_calls and hasattr(nv, new):
            try:
                return getattr(nv, new)(self.handle, *args)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) != getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13):
                    raise
        self._old_calls.add(new)
        return getattr(nv, old)(self.handle, *args)

    def sample(self, t_s: float) -> dict[str, Any]:
        """One telemetry row at ``t_s`` s: power (W), energy since the first sample (J), SM and memory
        clocks (MHz), utilisations, temperature, the limits, throttle reasons and GPM fractions;
        NaN for what NVML cannot read on this GPU (each failure logged once).
        """
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
        temp = self._read(
            "temperature",
            lambda h: self._successor(
                "nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU
            ),
        )
        row["temp_c"] = math.nan if temp is None else float(temp)
        for col, fn in (
            ("power_limit_w", nv.nvmlDeviceGetPowerManagementLimit),
            ("enforced_limit_w", nv.nvmlDeviceGetEnforcedPowerLimit),
        ):
            v = self._read(col, fn)
            row[col] = math.nan if v is None else v / 1000.0
        reasons = self._read(
            "clock event reasons",
            lambda h: self._successor(
                "nvmlDeviceGetCurrentClocksEventReasons",
                "nvmlDeviceGetCurrentClocksThrottleReasons",
            ),
        )
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
            "pci_bus_id": self.pci_bus_id,
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


class GpuIdentityError(RuntimeError):
    """The job's GPUs cannot be told apart or opened: one line naming the GPU and why."""


@dataclass(frozen=True)
class JobGpu:
    """One GPU of this job: its NVML index in this process (``nvmlDeviceGetHandleByIndex``),
    UUID and PCI bus id (``nvmlDeviceGetPciInfo().busId``), the two names that never change."""

    index: int
    uuid: str
    pci_bus_id: str


def _accessible(nv: Any) -> tuple[list[JobGpu], list[int]]:
    """The GPUs NVML lets this process open, in NVML order, and the indices it refuses.

    ``nvmlDeviceGetCount`` (``_v2`` in pynvml) counts every GPU of the node, and
    ``nvmlDeviceGetHandleByIndex`` answers ``NVML_ERROR_NO_PERMISSION`` for those a device
    cgroup hides (nvml.h, notes on ``nvmlDeviceGetCount_v2``); the ``_v1`` behaviour counts only
    the accessible ones and numbers them from 0. Both end here as the same list."""
    out, refused = [], []
    for i in range(int(nv.nvmlDeviceGetCount())):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError as exc:
            if not _is_no_permission(nv, exc):
                raise
            refused.append(i)
            continue
        bus = _text(nv.nvmlDeviceGetPciInfo(h).busId)
        out.append(JobGpu(i, _text(nv.nvmlDeviceGetUUID(h)), bus))
    return out, refused


def _ints(value: str, var: str) -> list[int]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not all(v.isdigit() for v in items):
        raise GpuIdentityError(f"{var}={value!r}: expected GPU indices like 4,5,6,7")
    return [int(v) for v in items]


def _by_uuid(nv: Any, gpus: list[JobGpu], item: str) -> JobGpu:
    """The accessible GPU whose UUID starts with ``item`` (CUDA takes a unique prefix)."""
    hits = [g for g in gpus if g.uuid.startswith(item)]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise GpuIdentityError(f"CUDA_VISIBLE_DEVICES entry {item!r} matches {len(hits)} GPUs")
    try:
        nv.nvmlDeviceGetHandleByUUID(item)
    except nv.NVMLError as exc:
        if _is_no_permission(nv, exc):
            raise GpuIdentityError(
                f"GPU {item} is this job's (CUDA_VISIBLE_DEVICES) but NVML refuses to open it "
                f"(no permission): the node's device cgroup does not grant it"
            ) from None
    raise GpuIdentityError(f"CUDA_VISIBLE_DEVICES names {item!r}: no such GPU on this node")


def _by_slurm(gpus: list[JobGpu], refused: list[int], ids: list[int], var: str) -> list[JobGpu]:
    """SLURM's GPU indices (``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``: the node's GPUs in PCI bus
    order, SLURM ``gres_common.c``) as the job's GPUs. Where NVML counts every GPU they are
    NVML indices; where it counts only the accessible ones (``_v1``), those are the job's, in
    the same order."""
    by_index = {g.index: g for g in gpus}
    total = len(gpus) + len(refused)
    if refused or max(ids) < total:
        mine = [i for i in ids if i in refused]
        if mine:
            raise GpuIdentityError(
                f"GPU {mine[0]} is this job's ({var}) but NVML refuses to open it (no permission)"
            )
        missing = [i for i in ids if i not in by_index]
        if missing:
            raise GpuIdentityError(f"{var} names GPU {missing[0]}: NVML counts {total} GPUs here")
        return [by_index[i] for i in ids]
    if len(ids) != len(gpus):
        raise GpuIdentityError(
            f"{var} names {len(ids)} GPU(s) but NVML lets this process open {len(gpus)}"
        )
    order = {gid: k for k, gid in enumerate(sorted(ids))}
    return [gpus[order[i]] for i in ids]


def job_gpus(count: int | None = None, env: Mapping[str, str] | None = None) -> list[JobGpu]:
    """The GPUs this job may use, known by UUID and PCI bus id: the one mapping every caller uses.

    ``CUDA_VISIBLE_DEVICES`` first: UUIDs (or unique prefixes) are matched to NVML's; digits
    are CUDA's numbering of the GPUs this process can open (job-local ``0,1,..`` under SLURM's
    ``ConstrainDevices``, the node's own indices without it: SLURM ``gres_common.c``
    ``common_gres_set_env``), so digit k is the k-th GPU NVML opens. Without it,
    ``SLURM_STEP_GPUS`` or ``SLURM_JOB_GPUS``; without those, every GPU NVML opens. GPUs NVML
    refuses (``NO_PERMISSION``) are skipped unless SLURM names them as the job's: then a
    one-line ``GpuIdentityError``. The first ``count`` are returned."""
    env = os.environ if env is None else env
    nv = nvml()
    gpus, refused = _accessible(nv)
    slurm_var = next((v for v in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS") if env.get(v)), None)
    slurm_ids = _ints(env[slurm_var], slurm_var) if slurm_var else []
    if slurm_var:
        out = _by_slurm(gpus, refused, slurm_ids, slurm_var)  # checks SLURM's GPUs open
    visible = (env.get("CUDA_VISIBLE_DEVICES") or "").strip()
    if visible:
        out = []
        for item in (v.strip() for v in visible.split(",") if v.strip()):
            if not item.isdigit():
                out.append(_by_uuid(nv, gpus, item))
            elif int(item) < len(gpus):
                out.append(gpus[int(item)])
            else:
                raise GpuIdentityError(
                    f"CUDA_VISIBLE_DEVICES={visible}: GPU {item} is not among the {len(gpus)} "
                    f"this process can open ({len(refused)} refused by NVML: no permission)"
                )
    elif not slurm_var:
        out = gpus
    if count is not None:
        if count > len(out):
            raise GpuIdentityError(
                f"the job wants {count} GPUs on this node but it may open {len(out)} "
                f"({', '.join(g.uuid for g in out) or 'none'})"
            )
        out = out[:count]
    return out


#: what ``slurm_job_gpu_uuids`` runs and reads (root edits these, never the caller's PATH)
SLURMD = "/usr/sbin/slurmd"
SLURM_CONF = "/etc/slurm/slurm.conf"  # slurmd -G reads gres.conf beside it
_TOOL_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
NVIDIA_MAJOR = 195  # "195 char  Nvidia graphics devices" (Documentation/admin-guide/devices.txt)


def slurm_job_gpu_uuids(indices: Collection[int], node: str | None = None) -> frozenset[str]:
    """The UUIDs of SLURM's job GPU ``indices`` on this node (``$SLURM_JOB_GPUS`` in the epilog).

    SLURM's IDX counts the node's GPU devices in gres.conf order (``slurmd -G``: each GPU record's
    first Index and its File list), not NVML's; so, as the sudo wrapper ``slurm/wattflex-setcap``
    does: IDX -> its device file -> that file's NVIDIA minor number (character major 195) -> the
    GPU NVML gives that minor (``nvmlDeviceGetMinorNumber``) -> its UUID. Anything that cannot be
    mapped so (no slurmd, an index without a record, a device that is not an NVIDIA one, no GPU
    of that minor) is a one-line ``GpuIdentityError``, never a guess from index digits."""
    # slurmd's own name for this node (the epilog passes it), else the short host name
    node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    argv = [SLURMD, "-G", "-f", SLURM_CONF, "-N", node]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_TOOL_ENV)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GpuIdentityError(f"{SLURMD} -G could not run: {exc}") from None
    if r.returncode != 0:
        said = (r.stderr.strip().splitlines() or [""])[-1][-200:]
        raise GpuIdentityError(f"{' '.join(argv)} failed (exit {r.returncode}): {said}")
    devices: dict[int, str] = {}
    for line in (r.stdout + r.stderr).splitlines():
        if re.search(r"\bGres Name=gpu ", line):
            count, first, files = (
                re.search(rf"\b{k}=(\S+)", line) for k in ("Count", "Index", "File")
            )
            if not (count and first and files and count[1].isdigit() and first[1].isdigit()):
                raise GpuIdentityError("slurmd -G: a GPU record without Count, Index and File")
            paths = _file_list(files[1])
            if len(paths) != int(count[1]):
                raise GpuIdentityError(f"slurmd -G: Count={count[1]} but File={files[1]}")
            devices.update({int(first[1]) + k: path for k, path in enumerate(paths)})
    nv = nvml()
    by_minor: dict[int, str] = {}
    try:
        for i in range(int(nv.nvmlDeviceGetCount())):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            by_minor[int(nv.nvmlDeviceGetMinorNumber(h))] = _text(nv.nvmlDeviceGetUUID(h))
    except nv.NVMLError as exc:
        raise GpuIdentityError(f"NVML cannot list the GPUs' minor numbers ({exc})") from None
    out = set()
    for i in sorted(indices):
        if i not in devices:
            raise GpuIdentityError(f"SLURM's GPU {i} on {node} is not in slurmd -G's GPU records")
        try:
            st = os.stat(devices[i])
        except OSError as exc:
            raise GpuIdentityError(f"{devices[i]} (SLURM's GPU {i}): {exc.strerror}") from None
        if not stat.S_ISCHR(st.st_mode) or os.major(st.st_rdev) != NVIDIA_MAJOR:
            raise GpuIdentityError(
                f"{devices[i]} (SLURM's GPU {i}) is not an NVIDIA GPU device (char {NVIDIA_MAJOR}:N)"
            )
        if os.minor(st.st_rdev) not in by_minor:
            raise GpuIdentityError(
                f"{devices[i]} (SLURM's GPU {i}): NVML has no GPU of minor {os.minor(st.st_rdev)}"
            )
        out.add(by_minor[os.minor(st.st_rdev)])
    return frozenset(out)


def _file_list(text: str) -> list[str]:
    """slurmd's ranged File list (``/dev/nvidia[0-3]``, ``/dev/nvidia0,/dev/nvidia2``) as paths."""
    parts = re.findall(r"([^,\[\]]+)(?:\[([0-9,-]+)\]([^,\[\]]*))?(,|$)", text)
    if "".join(h + (f"[{r}]{t}" if r else "") + c for h, r, t, c in parts) != text:
        raise GpuIdentityError(f"slurmd -G: cannot read the File list {text[:100]!r}")
    out = []
    for head, ranges, tail, _ in parts:
        if not ranges:
            out.append(head)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or not (hi or lo).isdigit():
                raise GpuIdentityError(f"slurmd -G: cannot read the File list {text[:100]!r}")
            out += [f"{head}{n:0{len(lo)}d}{tail}" for n in range(int(lo), int(hi or lo) + 1)]
    return out


def local_gpu_indices(count: int | None = None, visible: str | None = None) -> list[int]:
    """NVML indices of :func:`job_gpus` (``visible``: a ``CUDA_VISIBLE_DEVICES`` to use instead
    of the environment's, "" for none)."""
    env = dict(os.environ)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return [g.index for g in job_gpus(count, env)]


def open_gpus(
    count: int | None = None,
    set_limit: Callable[[int, float], None] | None = None,
    gpm: bool = _GPM,
    indices: list[int] | None = None,
    node: str | None = None,
) -> list[NvmlGpu]:
    """The job's GPUs (:func:`job_gpus`, or the NVML ``indices`` given) opened as ``NvmlGpu``,
    named on ``node`` (default: the host name)."""
    chosen = indices if indices is not None else local_gpu_indices(count)
    return [NvmlGpu(i, set_limit=set_limit, gpm=gpm, node=node) for i in chosen]


def _bare_uuid(uuid: str) -> str:
    """A GPU UUID without NVML's ``GPU-`` prefix, lower case: CUDA's (torch's ``props.uuid``) form."""
    u = uuid.strip().lower()
    return u[4:] if u.startswith("gpu-") else u


def identity_table(
    gpus: list[JobGpu], cuda_uuids: list[str] | None, smi_csv: str | None
) -> list[dict[str, Any]]:
    """The job's GPUs under each name: NVML index, UUID and PCI bus id (:func:`job_gpus`), the
    CUDA ordinal with the same UUID (``cuda_uuids[i]`` of CUDA device i; None: not asked), and
    the ``nvidia-smi`` index with the same UUID (``smi_csv``: the output of ``nvidia-smi
    --query-gpu=index,uuid,pci.bus_id --format=csv,noheader``; None: not run) — the number
    ``nvidia-smi -i`` (the sudo cap wrapper) would be given."""
    smi = {}
    for line in (smi_csv or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            smi[_bare_uuid(parts[1])] = int(parts[0])
    cuda = {_bare_uuid(u): i for i, u in enumerate(cuda_uuids or [])}
    return [
        {
            "nvml_index": g.index,
            "uuid": g.uuid,
            "pci_bus_id": g.pci_bus_id,
            "cuda_ordinal": cuda.get(_bare_uuid(g.uuid)) if cuda_uuids is not None else None,
            "nvidia_smi_index": smi.get(_bare_uuid(g.uuid)) if smi_csv is not None else None,
        }
        for g in gpus
    ]
