"""FAKE pynvml: a stand-in for nvidia-ml-py's ``pynvml`` module, for tests without a GPU.

Only the calls ``wattflex.runs.devices.nvml`` makes exist, with the real names, units (mW, mJ,
MHz, bytes) and error classes (``NVMLError`` with ``.value``; ``NVMLError_NoPermission``
...). Tests put it in ``sys.modules["pynvml"]`` — the narrowest boundary: everything above
it (NvmlGpu, the sampler, cap control, restore) is the real code.

The fake GPUs' state is a dict; with ``FAKE_PYNVML_STATE=/path.json`` in the environment it
lives in that file instead, so separate processes (a SIGTERM'd or SIGKILL'd run, a restore
command) see and change the same GPUs; ``{node}`` in that path is the SLURM node the process
runs on (SLURMD_NODENAME), so the nodes of a test cluster on one machine each have their own.
Processes the tests cannot patch (SLURM job steps) import it as ``pynvml`` through
``tests/fakes/pynvml_path`` on PYTHONPATH. Knobs (``reset(...)`` keywords or per-GPU keys):
``allow_set`` (False: setting a limit raises NoPermission; per GPU: ``deny_set``, or ``deny_set_mw``:
the limits in mW it refuses so), ``gpm`` ("ok" |
"no_permission" | "unsupported"), ``instant_power`` (False: the field read fails),
``demand_w`` (what the job would draw uncapped), ``locked_mhz`` (the SM clock lock FAKE
``nvmlDeviceSetGpuLockedClocks`` set, None when reset; ``deny_lock``: locking raises NoPermission), ``extra_limit_w`` (a lower limit enforced
by someone else), ``persistence`` (False: persistence mode off), ``user_pid`` (the process
using the GPU, :func:`claim`: while it is stopped, as ``scontrol suspend`` leaves a job, or gone,
the GPU reads its ``idle_w`` instead of its demand; unset: always its demand).

Device confinement (SLURM ``task/cgroup`` with ``ConstrainDevices=yes``) is per process, as a
cgroup is, so it comes from the environment, inherited by child processes: ``FAKE_PYNVML_DEVICES``
(the node's GPU indices this process's device cgroup grants, e.g. ``4,5,6,7``; unset: all) and
``FAKE_PYNVML_COUNT`` (``all``: ``nvmlDeviceGetCount`` counts every GPU and
``nvmlDeviceGetHandleByIndex`` answers ``NVML_ERROR_NO_PERMISSION`` for the others, as
``nvmlDeviceGetCount_v2`` does; ``accessible``: the ``_v1`` behaviour, which counts only the
granted GPUs and numbers them from 0 — both from nvml.h's notes on ``nvmlDeviceGetCount_v2``).
``nvmlDeviceGetHandleByUUID``/``ByPciBusId`` of a GPU not granted also answer NO_PERMISSION
(assumed: nvml.h does not list it, but opening the device file is what the cgroup denies).
Names, arity, units and error classes are checked against the real module
(tests/unit/runs/devices/test_fake_pynvml_conformance.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

STATE_ENV = "FAKE_PYNVML_STATE"
DEVICES_ENV = "FAKE_PYNVML_DEVICES"
COUNT_ENV = "FAKE_PYNVML_COUNT"

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_FI_DEV_POWER_INSTANT = 186
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRICS_GET_VERSION = 1
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
CLOCKS_EVENT_REASON_SW_POWER_CAP = 0x4


class NVMLError(Exception):
    """As pynvml's: ``NVMLError(value)`` is an instance of the subclass for ``value``."""

    _valClassMapping: dict[int, type] = {}
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    }

    def __new__(cls, value: int):
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return self._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")


def _error_class(name: str, value: int) -> type:
    cls = type(name, (NVMLError,), {"__new__": lambda typ, *a: NVMLError.__new__(typ, value)})
    NVMLError._valClassMapping[value] = cls
    return cls


NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _error_class("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_FunctionNotFound = _error_class(
    "NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND
)


def _default_gpu(i: int) -> dict[str, Any]:
    return {
        "name": "NVIDIA H200",
        "uuid": f"GPU-fake-{i:04d}",
        # FAKE PCI bus ids, in NVML's format (pynvml NVML_DEVICE_PCI_BUS_ID_FMT "%08X:%02X:%02X.0")
        "pci_bus_id": f"00000000:{0x18 + 0x10 * i:02X}:00.0",
        # the NVIDIA minor number (/dev/nvidia<minor>, character major 195): NVML order by default
        "minor": i,
        "min_mw": 200_000,
        "max_mw": 700_000,
        "default_mw": 700_000,
        "limit_mw": 700_000,
        "demand_w": 650.0,
        "extra_limit_w": None,
        "sm_clock_max": 1980,
        "mem_clock": 3201,
        "util": 98,
        "mem_util": 40,
        "fb_used": 80 * 1024**3,
        "temp": 55,
        "gpm_values": {"10": 45.0, "2": 90.0, "5": 60.0},
        "persistence": True,
        "sm_clock_min": 345,
        "locked_mhz": None,
        # FAKE idle board power: the catalogue's H200 idle_w (wattflex.gpus, assumed there), what
        # cluster-control charges a paused job's GPU
        "idle_w": 75.0,
        "user_pid": None,
    }


_memory_state: dict[str, Any] = {}


def reset(n_gpus: int = 2, path: str | os.PathLike | None = None, **knobs: Any) -> dict[str, Any]:
    """Fresh fake GPUs (in memory, or in ``path`` which is then exported as FAKE_PYNVML_STATE)."""
    state = {
        "gpus": [_default_gpu(i) for i in range(n_gpus)],
        "allow_set": True,
        "gpm": "ok",
        "instant_power": True,
        "t_start": time.time(),
        "set_calls": [],
        "clock_calls": [],
    }
    state.update(knobs)
    if path is not None:
        os.environ[STATE_ENV] = str(path)
    else:
        os.environ.pop(STATE_ENV, None)
    _memory_state.clear()
    _save(state)
    return state


def _state_path() -> str | None:
    path = os.environ.get(STATE_ENV)
    return path.replace("{node}", os.environ.get("SLURMD_NODENAME", "local")) if path else None


def _load() -> dict[str, Any]:
    path = _state_path()
    if path:
        return json.loads(Path(path).read_text())
    if not _memory_state:
        reset()
    return _memory_state


def _save(state: dict[str, Any]) -> None:
    path = _state_path()
    if path:
        tmp = Path(f"{path}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(state))
        tmp.replace(path)
    else:
        _memory_state.update(state)


@contextmanager
def _mutate() -> Iterator[dict[str, Any]]:
    """The state to change, saved on leaving; with a state file, under an exclusive lock on
    ``<file>.lock``, so processes setting limits and clocks at once (a SLURM job and its agent on
    one node) never lose each other's change."""
    path = _state_path()
    if not path:
        s = _load()
        _accrue(s)
        yield s
        _save(s)
        return
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        s = _load()
        _accrue(s)
        yield s
        _save(s)


def state() -> dict[str, Any]:
    return _load()


def update_gpu(i: int, **kw: Any) -> None:
    with _mutate() as s:
        s["gpus"][i].update(kw)


def _gpu(handle: int) -> dict[str, Any]:
    return _load()["gpus"][handle]


def _enforced_mw(g: dict[str, Any]) -> int:
    extra = g.get("extra_limit_w")
    return min(g["limit_mw"], int(extra * 1000)) if extra else g["limit_mw"]


def _lock_fraction(g: dict[str, Any]) -> float:
    """Power fraction at the locked clock: (f / f_max)^2, the inverse of this fake's own
    clock-under-cap rule (``nvmlDeviceGetClockInfo``: clock = f_max * throttle^0.5)."""
    lock = g.get("locked_mhz")
    return 1.0 if lock is None else min(1.0, lock / g["sm_clock_max"]) ** 2


def _user_running(g: dict[str, Any]) -> bool:
    """Whether the GPU's user (``user_pid``) runs: not stopped (SIGSTOP), not a zombie, not gone
    (``/proc/PID/stat``'s state); a GPU without a recorded user is taken as busy."""
    pid = g.get("user_pid")
    if pid is None:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("T", "t", "Z", "X")


def _power_mw(g: dict[str, Any]) -> int:
    demand_w = g["demand_w"] if _user_running(g) else g.get("idle_w", 75.0)
    return int(min(demand_w * 1000 * _lock_fraction(g), _enforced_mw(g)))


def power_w(g: dict[str, Any]) -> float:
    """What NVML reads for the GPU ``g`` (an entry of the state's ``gpus``) now, in W."""
    return _power_mw(g) / 1000


def claim(indices: list[int], pid: int) -> None:
    """Record ``pid`` as the user of GPUs ``indices`` (its activity drives their power)."""
    with _mutate() as s:
        for i in indices:
            s["gpus"][i]["user_pid"] = pid


# ---- the pynvml API subset --------------------------------------------------------------------
def nvmlInit() -> None:
    _load()


def nvmlShutdown() -> None:
    pass


def nvmlSystemGetDriverVersion() -> str:
    return "570.124.06"


def nvmlSystemGetNVMLVersion() -> str:
    return "12.570.124.06"


def nvmlSystemGetCudaDriverVersion() -> int:
    return 12080  # 1000 * major + 10 * minor


def granted() -> list[int]:
    """The node's GPU indices this process's (modelled) device cgroup grants."""
    n = len(_load()["gpus"])
    raw = os.environ.get(DEVICES_ENV)
    if raw is None:
        return list(range(n))
    return sorted(i for i in (int(v) for v in raw.split(",") if v.strip()) if i < n)


def _count_all() -> bool:
    return os.environ.get(COUNT_ENV, "all") != "accessible"


def _open(i: int) -> int:
    """The handle of the node's GPU ``i``, or NO_PERMISSION where the cgroup denies it."""
    if i not in granted():
        raise NVMLError(NVML_ERROR_NO_PERMISSION)
    return i


def nvmlDeviceGetCount() -> int:
    return len(_load()["gpus"]) if _count_all() else len(granted())


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _open(index) if _count_all() else granted()[index]


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> int:
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    for i, g in enumerate(_load()["gpus"]):
        if g["uuid"] == uuid:
            return _open(i)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetHandleByPciBusId(pciBusId: str | bytes) -> int:
    bus = (pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId).upper()
    for i, g in enumerate(_load()["gpus"]):
        if g["pci_bus_id"] == bus:
            return _open(i)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle: int) -> int:
    return handle if _count_all() else granted().index(handle)


def nvmlDeviceGetPciInfo(handle: int) -> SimpleNamespace:
    """``nvmlPciInfo_t``'s identity fields (``busId`` as bytes, as the ctypes field reads)."""
    bus = _gpu(handle)["pci_bus_id"]
    return SimpleNamespace(
        busId=bus.encode(),
        busIdLegacy=bus[4:].encode(),
        domain=int(bus[:8], 16),
        bus=int(bus[9:11], 16),
        device=0,
    )


def nvmlDeviceGetMinorNumber(handle: int) -> int:
    return _gpu(handle)["minor"]


def nvmlDeviceGetName(handle: int) -> str:
    return _gpu(handle)["name"]


def nvmlDeviceGetUUID(handle: int) -> str:
    return _gpu(handle)["uuid"]


def nvmlDeviceGetPowerManagementLimitConstraints(handle: int) -> list[int]:
    g = _gpu(handle)
    return [g["min_mw"], g["max_mw"]]


def nvmlDeviceGetPowerManagementDefaultLimit(handle: int) -> int:
    return _gpu(handle)["default_mw"]


def nvmlDeviceGetPowerManagementLimit(handle: int) -> int:
    return _gpu(handle)["limit_mw"]


def nvmlDeviceGetEnforcedPowerLimit(handle: int) -> int:
    return _enforced_mw(_gpu(handle))


def nvmlDeviceSetPowerManagementLimit(handle: int, limit: int) -> None:
    with _mutate() as s:
        g = s["gpus"][handle]
        if not s["allow_set"] or g.get("deny_set") or int(limit) in g.get("deny_set_mw", []):
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        if not g["min_mw"] <= limit <= g["max_mw"]:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        g["limit_mw"] = int(limit)
        s["set_calls"].append([handle, int(limit)])
        s.setdefault("set_t", []).append(time.time())  # when: a ramp is per second, not per call


def nvmlDeviceSetGpuLockedClocks(handle: int, minGpuClockMHz: int, maxGpuClockMHz: int) -> None:
    """FAKE: holds the SM clock at [min, max] (wattflex locks min == max)."""
    with _mutate() as s:
        g = s["gpus"][handle]
        if not s["allow_set"] or g.get("deny_set") or g.get("deny_lock"):
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        if not g["sm_clock_min"] <= minGpuClockMHz <= maxGpuClockMHz <= g["sm_clock_max"]:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        g["locked_mhz"] = int(maxGpuClockMHz)
        s["clock_calls"].append([handle, int(minGpuClockMHz), int(maxGpuClockMHz)])


def nvmlDeviceResetGpuLockedClocks(handle: int) -> None:
    """FAKE: the firmware picks the SM clock again."""
    with _mutate() as s:
        g = s["gpus"][handle]
        if not s["allow_set"] or g.get("deny_set"):
            raise NVMLError(NVML_ERROR_NO_PERMISSION)
        g["locked_mhz"] = None
        s["clock_calls"].append([handle, "reset"])


def nvmlDeviceGetFieldValues(handle: int, fieldIds: list[int]) -> list[SimpleNamespace]:
    s, g = _load(), _gpu(handle)
    out = []
    for fid in fieldIds:
        ok = fid == NVML_FI_DEV_POWER_INSTANT and s["instant_power"]
        out.append(
            SimpleNamespace(
                fieldId=fid,
                nvmlReturn=NVML_SUCCESS if ok else NVML_ERROR_NOT_SUPPORTED,
                value=SimpleNamespace(uiVal=_power_mw(g) if ok else 0),
            )
        )
    return out


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    return _power_mw(_gpu(handle))


def nvmlDeviceGetTotalEnergyConsumption(handle: int) -> int:
    """mJ since "driver load": like NVML's counter it only grows, by the power each GPU drew
    since the last change of state (a cap, a clock lock, a demand: ``_mutate`` accrues first)."""
    with _mutate() as s:
        return int(s["gpus"][handle]["energy_mj"])


def _accrue(state: dict[str, Any]) -> None:
    """Add each GPU's energy since the state last changed, at the power it drew meanwhile."""
    now = time.time()
    for g in state["gpus"]:
        g["energy_mj"] = g.get("energy_mj", 1e9) + _power_mw(g) * (
            now - g.get("energy_t", state["t_start"])
        )
        g["energy_t"] = now


def _throttle(g: dict[str, Any]) -> float:
    return min(1.0, _enforced_mw(g) / 1000 / g["demand_w"])


def nvmlDeviceGetClockInfo(handle: int, type: int) -> int:  # noqa: A002 (pynvml's name)
    g = _gpu(handle)
    if type == NVML_CLOCK_SM:
        capped = g["sm_clock_max"] * _throttle(g) ** 0.5
        return int(capped if g.get("locked_mhz") is None else min(capped, g["locked_mhz"]))
    return g["mem_clock"]


def nvmlDeviceGetMaxClockInfo(handle: int, type: int) -> int:  # noqa: A002 (pynvml's name)
    g = _gpu(handle)
    return g["sm_clock_max"] if type == NVML_CLOCK_SM else g["mem_clock"]


def nvmlDeviceGetPersistenceMode(handle: int) -> int:
    return NVML_FEATURE_ENABLED if _gpu(handle).get("persistence", True) else NVML_FEATURE_DISABLED


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    g = _gpu(handle)
    return SimpleNamespace(gpu=g["util"], memory=g["mem_util"])


def nvmlDeviceGetMemoryInfo(handle: int, version: int | None = None) -> SimpleNamespace:
    g = _gpu(handle)
    total = 141 * 1024**3
    return SimpleNamespace(total=total, used=g["fb_used"], free=total - g["fb_used"])


def nvmlDeviceGetTemperature(handle: int, sensor: int) -> int:
    """Deprecated in nvidia-ml-py 13 (removed in CUDA 14.0): answers FUNCTION_NOT_FOUND
    when the state's ``old_calls`` is False, as a driver without it would."""
    if _load().get("old_calls") is False:
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    return _gpu(handle)["temp"]


def nvmlDeviceGetTemperatureV(handle: int, sensor: int, version: int = 0x100000C) -> int:
    """The successor (``nvmlTemperature_v1`` = 0x100000C); FUNCTION_NOT_FOUND with
    ``new_calls`` False, as a driver older than the module answers."""
    if _load().get("new_calls") is False:
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    return _gpu(handle)["temp"]


def nvmlDeviceGetCurrentClocksEventReasons(handle: int) -> int:
    if _load().get("new_calls") is False:
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    g = _gpu(handle)
    return CLOCKS_EVENT_REASON_SW_POWER_CAP if _throttle(g) < 1.0 else 0


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: int) -> int:
    """Deprecated (removed in CUDA 14.0); FUNCTION_NOT_FOUND with ``old_calls`` False."""
    if _load().get("old_calls") is False:
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    g = _gpu(handle)
    return CLOCKS_EVENT_REASON_SW_POWER_CAP if _throttle(g) < 1.0 else 0


# ---- GPM ----------------------------------------------------------------------------------
class _GpmSample:
    def __init__(self) -> None:
        self.values: dict[str, float] | None = None


class c_nvmlGpmMetricsGet_t:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [
            SimpleNamespace(metricId=0, nvmlReturn=NVML_SUCCESS, value=0.0) for _ in range(16)
        ]


def nvmlGpmQueryDeviceSupport(device: int) -> SimpleNamespace:
    return SimpleNamespace(version=1, isSupportedDevice=int(_load()["gpm"] != "unsupported"))


def nvmlGpmSampleAlloc() -> _GpmSample:
    return _GpmSample()


def nvmlGpmSampleFree(gpmSample: _GpmSample) -> None:
    gpmSample.values = None


def nvmlGpmSampleGet(device: int, gpmSample: _GpmSample) -> _GpmSample:
    mode = _load()["gpm"]
    if mode == "no_permission":
        raise NVMLError(NVML_ERROR_NO_PERMISSION)
    if mode == "unsupported":
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    gpmSample.values = dict(_gpu(device)["gpm_values"])
    return gpmSample


def nvmlGpmMetricsGet(metricsGet: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
    if (
        metricsGet.version != NVML_GPM_METRICS_GET_VERSION
        or metricsGet.sample1 is None
        or metricsGet.sample2 is None
    ):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if metricsGet.sample1.values is None or metricsGet.sample2.values is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    for m in metricsGet.metrics[: metricsGet.numMetrics]:
        m.value = float(metricsGet.sample2.values.get(str(m.metricId), 0.0))
    return metricsGet
