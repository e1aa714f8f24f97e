"""What this machine offers wattflex, found without changing anything (``wattflex doctor``).

Each ``probe_*`` returns a small dict: what it found, and ``problems``, one
``{"what", "loses", "fix"}`` per missing piece saying what a user of wattflex loses
without it. ``check_config`` says what a campaign config needs of the machine and which of
it is missing (the command's exit status), including a group that cannot fit its GPUs or
host memory (``wattflex.runs.plan``, as ``snakemake -n`` refuses it); ``diagnose`` runs everything and
``format_report`` writes the human-readable form.

Observe-only: NVML is read, never set; whether this process may set power limits is
inferred, not tried: the NVIDIA driver allows it to callers with CAP_SYS_ADMIN (its
``NV_IS_SUSER()`` is ``capable(CAP_SYS_ADMIN)``), read from ``/proc/self/status``
(``CapEff``), with the effective uid as the fallback. The only network access is the
dcgm-exporter URL the user gives (2 s timeout) and ``dcgmi`` talking to its local host
engine; slurmctld is never contacted. pynvml and torch are imported inside the probes.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shlex
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from wattflex import __version__
from wattflex.config import REPO_ROOT, groups, load_config
from wattflex.errors import UserError
from wattflex.ingest.reader import MAX_DOC_BYTES, check_input_file
from wattflex.runs.devices import dcgm_sampler as dcgm_source
from wattflex.runs.devices import nvml as nvml_devices
from wattflex.runs.devices import setcap
from wattflex.runs.devices.caps import default_state_dir, restore_from_state_dir
from wattflex.runs.devices.hostpower import POWERCAP, RaplReader
from wattflex.runs.plan import enforced as plan_enforced
from wattflex.runs.plan import plan_campaign
from wattflex.runs.real_run import RunOptions

PROC_STATUS = Path("/proc/self/status")
CAP_SYS_ADMIN = 21  # bit in CapEff (linux/capability.h)
SLURM_PROFILE = REPO_ROOT / "profiles" / "slurm" / "config.yaml"
DEFAULT_CONFIG = Path("config/config.yaml")
NETWORK_TIMEOUT_S = 2.0
GPM_INTERVAL_S = 0.2  # between the two GPM samples of the readability check
LIMIT_TOLERANCE_W = 1.0
# The profile's values as shipped (lines marked CHANGE): still there = not yet adapted.
SHIPPED_PROFILE = {"slurm_partition": "gpu", "slurm_account": "my_account"}
PLAN_NEED = "GPU and host memory for every group (resource plan)"

LOSES_NVML = (
    "no power caps and no NVML telemetry: backend cuda runs need NVML unless cuda.sampler: false "
    "and cuda.cap_control: observe (CPU smoke runs); `wattflex control` and `wattflex restore-caps` "
    "cannot work here. The emulated backend needs none of it"
)


def problem(what: str, loses: str, fix: str) -> dict[str, str]:
    """One problem of the doctor's report: what is wrong, what the user loses by it, and the fix."""
    return {"what": what, "loses": loses, "fix": fix}


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


# ---- NVML and its GPUs ------------------------------------------------------------------------
def probe_nvml() -> dict[str, Any]:
    """NVML present and started, its driver/NVML versions, and every GPU (``probe_gpu``)."""
    out: dict[str, Any] = {
        "available": False,
        "module": None,
        "error": None,
        "driver_version": None,
        "nvml_version": None,
        "cuda_driver_version": None,
        "gpus": [],
        "problems": [],
    }
    try:
        import pynvml
    except ImportError as exc:
        out["error"] = f"pynvml not importable ({exc})"
        out["problems"].append(
            problem(
                "nvidia-ml-py (pynvml) is not installed",
                LOSES_NVML,
                "pip install -e '.[train]' (nvidia-ml-py)",
            )
        )
        return out
    out["module"] = getattr(pynvml, "__file__", None) or pynvml.__name__
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        out["error"] = f"nvmlInit failed: {exc}"
        out["problems"].append(
            problem(
                f"NVML could not start ({exc}): no NVIDIA driver on this machine",
                LOSES_NVML,
                "run wattflex doctor on a GPU node (inside a SLURM job there)",
            )
        )
        return out
    try:
        out["available"] = True
        out["driver_version"] = _optional(lambda: _text(pynvml.nvmlSystemGetDriverVersion()))
        out["nvml_version"] = _optional(lambda: _text(pynvml.nvmlSystemGetNVMLVersion()))
        cuda = _optional(pynvml.nvmlSystemGetCudaDriverVersion)
        out["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
        out["node_gpus"] = _optional(pynvml.nvmlDeviceGetCount)
        try:  # the job's GPUs by UUID; NVML refuses the node's others inside a confined job
            mine = nvml_devices.job_gpus()
        except nvml_devices.GpuIdentityError as exc:
            mine = []
            out["problems"].append(
                problem(
                    f"this job's GPUs cannot be opened: {exc}",
                    "no caps and no NVML telemetry for this job's runs",
                    "ask the admin whether the node's device cgroup (SLURM ConstrainDevices, "
                    "gres.conf) grants the GPUs SLURM allocates",
                )
            )
        out["gpus"] = [probe_gpu(pynvml, g.index) for g in mine]
        if not out["gpus"] and not out["problems"]:
            out["problems"].append(
                problem(
                    "NVML sees no GPU",
                    "nothing to cap or sample on this machine",
                    "run on a GPU node; inside a container, pass the GPUs through",
                )
            )
        for g in out["gpus"]:
            out["problems"] += g.pop("problems")
    finally:
        _optional(pynvml.nvmlShutdown)
    return out


def _optional(fn: Callable[[], Any]) -> Any:
    """``fn()``, or None where NVML does not support or allow it."""
    try:
        return fn()
    except Exception:  # an unsupported query is a fact to report, not a failure
        return None


def probe_gpu(nv: Any, index: int) -> dict[str, Any]:
    """One GPU, read-only: model, limits (W), clocks (MHz), GPM readability, persistence."""
    h = nv.nvmlDeviceGetHandleByIndex(index)
    w = lambda fn: None if (v := _optional(lambda: fn(h))) is None else v / 1000.0  # noqa: E731  mW -> W
    constraints = _optional(lambda: nv.nvmlDeviceGetPowerManagementLimitConstraints(h))
    persistence = _optional(lambda: nv.nvmlDeviceGetPersistenceMode(h))
    g: dict[str, Any] = {
        "index": index,
        "name": _text(nv.nvmlDeviceGetName(h)),
        "uuid": _optional(lambda: _text(nv.nvmlDeviceGetUUID(h))),
        "pci_bus_id": _optional(lambda: _text(nv.nvmlDeviceGetPciInfo(h).busId)),
        "power_w": w(nv.nvmlDeviceGetPowerUsage),
        "power_limit_w": w(nv.nvmlDeviceGetPowerManagementLimit),
        "default_limit_w": w(nv.nvmlDeviceGetPowerManagementDefaultLimit),
        "min_limit_w": constraints[0] / 1000.0 if constraints else None,
        "max_limit_w": constraints[1] / 1000.0 if constraints else None,
        "enforced_limit_w": w(nv.nvmlDeviceGetEnforcedPowerLimit),
        "sm_clock_mhz": _optional(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        "mem_clock_mhz": _optional(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
        "sm_clock_max_mhz": _optional(lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
        "mem_clock_max_mhz": _optional(lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)),
        "persistence_mode": None
        if persistence is None
        else persistence == getattr(nv, "NVML_FEATURE_ENABLED", 1),
        **probe_gpm(nv, h, f"GPU {index}"),
    }
    label = f"GPU {index} ({g['name']})"
    probs = []
    if not g["gpm_readable"]:
        unsupported = "not supported" in g["gpm"]
        probs.append(
            problem(
                f"{label}: GPM metrics unreadable ({g['gpm']})",
                "dram_active / sm_active / tensor_active are NaN in telemetry: no DRAM copy product, so no PFI "
                "prediction from runs measured here and empty activity figures",
                "GPM needs Hopper or newer; capture DCGM profiling metrics instead (wattflex ingest)"
                if unsupported
                else "read them from DCGM where it holds the counters (cuda.telemetry: dcgm, or auto), or an admin allows "
                "profiling (driver option NVreg_RestrictProfilingToAdminUsers=0, or run as root) and pauses DCGM "
                "profiling while wattflex samples (dcgmi profile --pause)",
            )
        )
    if g["persistence_mode"] is False:
        probs.append(
            problem(
                f"{label}: persistence mode is off",
                "the driver may unload between jobs: each run pays driver start-up, and a limit set outside a "
                "running process does not stick",
                "an admin runs nvidia-persistenced (or nvidia-smi -pm 1)",
            )
        )
    lim, dflt, enf = g["power_limit_w"], g["default_limit_w"], g["enforced_limit_w"]
    if lim is not None and dflt is not None and lim < dflt - LIMIT_TOLERANCE_W:
        probs.append(
            problem(
                f"{label}: already capped at {lim:g} W (default {dflt:g} W)",
                "the uncapped reference run of every group would run capped: PFI and every curve would be wrong",
                "wattflex restore-caps if a killed run left it (see the cap state files), else ask the admin",
            )
        )
    if lim is not None and enf is not None and enf < lim - LIMIT_TOLERANCE_W:
        probs.append(
            problem(
                f"{label}: {enf:g} W enforced below its {lim:g} W limit (another power policy)",
                f"caps above {enf:g} W have no effect: those points of a sweep all measure the same thing",
                "ask the admin which policy (chassis, datacenter limit) sets it; sweep below it",
            )
        )
    g["problems"] = probs
    return g


def probe_gpm(nv: Any, handle: Any, label: str) -> dict[str, Any]:
    """Whether GPM activity metrics can be read, with the sampler's own reader
    (``devices.nvml.GpmReader``): two samples ``GPM_INTERVAL_S`` apart, one metrics read."""
    nvml_log = logging.getLogger(nvml_devices.__name__)
    level = nvml_log.level
    nvml_log.setLevel(logging.ERROR)  # the reason goes into the report, not a warning
    try:
        reader = nvml_devices.GpmReader(nv, handle, label)
        values = {}
        if reader.enabled:
            time.sleep(GPM_INTERVAL_S)
            values = reader.read()
    finally:
        nvml_log.setLevel(level)
    readable = reader.enabled and any(v == v for v in values.values())  # v == v: not NaN
    status = (
        reader.status
        if readable or not reader.enabled
        else "disabled: every GPM metric returned an error"
    )
    return {
        "gpm": status,
        "gpm_readable": readable,
        "gpm_values": {k: round(v, 4) for k, v in values.items() if v == v},
    }


def probe_cap_permission(
    euid: int | None = None, status_path: Path | None = None
) -> dict[str, Any]:
    """Whether this process could set power limits: inferred from CAP_SYS_ADMIN in ``CapEff``
    (what the driver checks) or, where that is unreadable, the effective uid. Never tried."""
    euid = os.geteuid() if euid is None else euid
    cap_eff = None
    try:
        for line in Path(status_path or PROC_STATUS).read_text().splitlines():
            if line.startswith("CapEff:"):
                cap_eff = int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        cap_eff = None
    if cap_eff is None:
        likely = euid == 0
        basis = f"effective uid {euid} (CapEff unreadable)"
    else:
        likely = bool(cap_eff >> CAP_SYS_ADMIN & 1)
        basis = f"effective uid {euid}, CAP_SYS_ADMIN {'in' if likely else 'not in'} CapEff"
        if euid == 0 and not likely:
            basis += " (root without it: a container?)"
    out: dict[str, Any] = {
        "likely": likely,
        "euid": euid,
        "cap_sys_admin": None if cap_eff is None else likely,
        "basis": basis,
        "inferred": True,
        "problems": [],
    }
    if not likely:
        out["problems"].append(
            problem(
                "no permission to set power limits (inferred: "
                + basis
                + "): setting one needs root",
                "runs with cuda.cap_control: nvml fail at the first cap, and so do `wattflex control` and "
                "sweep: staircase/adaptive",
                f"{without_root_fix()}; or cuda.cap_control: observe to run at the GPUs' current limits, or run as root",
            )
        )
    return out


def without_root_fix(wrapper: Path | None = None) -> str:
    """The documented unprivileged path, and whether its wrapper is installed here."""
    wrapper = Path(wrapper or setcap.DEFAULT_PATH)
    installed = (
        f"the wrapper is installed here ({wrapper})"
        if wrapper.is_file()
        else f"the admin installs the wrapper {wrapper} and its sudoers rule, both printed by "
        f"`wattflex setcap-rule`"
    )
    return (
        f"capping without root (docs/slurm.md, 'Capping without root'): {installed}; then use "
        f"cuda.cap_control: command with cuda.cap_command: '{setcap.cap_command(str(wrapper))}' "
        f"(`wattflex control --cap-control command --cap-command ...`)"
    )


def sudo_refusal(argv: list[str], timeout_s: float = NETWORK_TIMEOUT_S) -> str | None:
    """Why ``sudo`` would not run ``argv`` (``sudo -n ...``) without a password for this user;
    None when it would. Asked with ``sudo -n -l``, which lists and runs nothing."""
    try:
        r = subprocess.run(
            [argv[0], "-n", "-l", *argv[1:]], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]} -n -l could not run ({type(exc).__name__})"
    if r.returncode == 0:
        return None
    return (
        r.stderr.strip().splitlines()[-1:]
        or [f"no sudoers rule allows it (sudo -n -l exit {r.returncode})"]
    )[0]


# ---- DCGM, host power, torch, SLURM, cap state --------------------------------------------------
def probe_dcgm(
    exporter_url: str | None = None, timeout_s: float = NETWORK_TIMEOUT_S
) -> dict[str, Any]:
    """``dcgmi`` on PATH (and whether its local host engine answers), and the dcgm-exporter
    at ``exporter_url``: which telemetry columns its metrics fill."""
    out: dict[str, Any] = {
        "dcgmi": shutil.which("dcgmi"),
        "hostengine": None,
        "exporter_url": exporter_url,
        "exporter": None,
        "problems": [],
    }
    if out["dcgmi"]:
        try:
            r = subprocess.run(
                [out["dcgmi"], "discovery", "-l"], capture_output=True, text=True, timeout=timeout_s
            )
            out["hostengine"] = (
                "answers"
                if r.returncode == 0
                else f"error (exit {r.returncode}): {(r.stderr or r.stdout).strip().splitlines()[-1:] or ['']}"
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            out["hostengine"] = f"no answer ({type(exc).__name__})"
    else:
        out["problems"].append(
            problem(
                "dcgmi not on PATH",
                "nothing for wattflex runs (they read NVML directly); no `dcgmi dmon` captures from here for "
                "wattflex ingest, and DCGM's profiling cannot be paused here if it holds the GPM counters",
                "install DCGM (datacenter-gpu-manager) if you want DCGM captures",
            )
        )
    if exporter_url:
        if not exporter_url.startswith(("http://", "https://")):
            raise UserError(
                f"--dcgm-exporter {exporter_url!r}: expected an http(s) URL, "
                f"e.g. http://localhost:9400/metrics"
            )
        from wattflex.ingest.dcgm import EXPORTER_METRICS  # lazy: pandas, only when asked

        try:
            with urllib.request.urlopen(exporter_url, timeout=timeout_s) as resp:
                text = resp.read().decode(errors="replace")
            names = {
                line.split("{")[0].split()[0]
                for line in text.splitlines()
                if line and not line.startswith("#")
            }
            cols = sorted({EXPORTER_METRICS[n][0] for n in names if n in EXPORTER_METRICS})
            out["exporter"] = {"reachable": True, "metrics": len(names), "telemetry_columns": cols}
            missing = sorted({c for c, _ in EXPORTER_METRICS.values()} - set(cols))
            if missing:
                out["problems"].append(
                    problem(
                        f"dcgm-exporter at {exporter_url} lacks {', '.join(missing)}",
                        "those columns are NaN in telemetry ingested from its scrapes",
                        "add the fields to the exporter's counters CSV (DCGM_FI_PROF_* need profiling enabled)",
                    )
                )
        except (OSError, urllib.error.URLError, ValueError) as exc:
            out["exporter"] = {"reachable": False, "error": str(exc)}
            out["problems"].append(
                problem(
                    f"dcgm-exporter at {exporter_url} unreachable ({exc})",
                    "no DCGM exporter scrapes from it",
                    "check the URL and port (default 9400)",
                )
            )
    return out


def probe_host_power(root: str | Path = POWERCAP) -> dict[str, Any]:
    """RAPL energy counters readable (CPU package and DRAM power, ``devices.hostpower``)."""
    reader = RaplReader(root)
    out: dict[str, Any] = {
        "available": reader.available,
        "describe": reader.describe(),
        "zones": {k: [str(z) for z in v] for k, v in reader.zones.items()},
        "problems": [],
    }
    if not reader.available:
        out["problems"].append(
            problem(
                f"RAPL host power unreadable ({reader.root} absent or its energy_uj not readable)",
                "host_cpu_w / host_dram_w are NaN: GPU board power only (as in the paper)",
                "energy_uj is root-only on most kernels since 2020: run as root, or an admin makes it readable; "
                "VMs and containers often lack /sys/class/powercap",
            )
        )
    return out


def probe_torch() -> dict[str, Any]:
    """torch's version, the CUDA it was built with, and the GPUs it sees."""
    out: dict[str, Any] = {
        "version": None,
        "built_with_cuda": None,
        "cuda_available": False,
        "device_count": 0,
        "devices": [],
        "problems": [],
    }
    try:
        import torch
    except ImportError as exc:
        out["problems"].append(
            problem(
                f"torch not importable ({exc})",
                "no real training (backend cuda)",
                "pip install -e '.[train]'",
            )
        )
        return out
    out["version"] = torch.__version__
    out["built_with_cuda"] = torch.version.cuda
    out["cuda_available"] = bool(torch.cuda.is_available())
    out["device_count"] = int(torch.cuda.device_count()) if out["cuda_available"] else 0
    out["devices"] = [torch.cuda.get_device_name(i) for i in range(out["device_count"])]
    if not out["cuda_available"]:
        why = (
            "a CPU-only build"
            if torch.version.cuda is None
            else f"built with CUDA {torch.version.cuda}, but it sees no GPU (driver, CUDA_VISIBLE_DEVICES)"
        )
        out["problems"].append(
            problem(
                f"torch cannot use a GPU ({why})",
                "no real training on GPUs: cuda.device: cuda runs fail (cuda.device: cpu smoke runs still work)",
                "on GPU nodes install a CUDA build of torch matching the driver",
            )
        )
    return out


def probe_slurm(profile: str | Path = SLURM_PROFILE) -> dict[str, Any]:
    """SLURM clients on PATH and what the SLURM profile would request (read, not checked
    against the cluster: that needs slurmctld; ``check`` is the command that would)."""
    out: dict[str, Any] = {
        "commands": {c: shutil.which(c) for c in ("sinfo", "srun", "sbatch")},
        "profile": _shown(profile),
        "problems": [],
    }
    try:
        doc = yaml.safe_load(Path(profile).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        out["error"] = f"cannot read the profile: {exc}"
        doc = {}
    res, conf = doc.get("default-resources") or {}, doc.get("config") or {}
    unquote = lambda v: None if v is None else str(v).strip("'\"")  # noqa: E731  a Python string in YAML
    partition, account = unquote(res.get("slurm_partition")), unquote(res.get("slurm_account"))
    how, names = conf.get("slurm_gpu_model"), conf.get("slurm_gpu_names") or {}
    request = {"gpu_model": "--gpus={name}:<n>", "constraint": "--gpus=<n> -C {name}"}.get(
        how, "--gpus=<n>"
    )
    out.update(
        partition=partition,
        account=account,
        gpus_per_node=conf.get("slurm_gpus_per_node"),
        gpu_model=how,
        gpu_names=names,
        requests={m: request.format(name=n) for m, n in names.items()}
        if how in ("gpu_model", "constraint")
        else {"any": request},
        check=f"sinfo -p {partition} -o '%P %G %f %D'" if partition else None,
    )
    if not out["commands"]["sbatch"]:
        out["problems"].append(
            problem(
                "SLURM clients (sbatch) not on PATH",
                "snakemake --profile profiles/slurm cannot submit jobs from this machine",
                "run snakemake on a login node with the SLURM clients",
            )
        )
    shipped = [
        f"{k} {v!r}"
        for k, v in SHIPPED_PROFILE.items()
        if {"slurm_partition": partition, "slurm_account": account}[k] == v
    ]
    if shipped:
        out["problems"].append(
            problem(
                f"{out['profile']} still has the shipped {' and '.join(shipped)}",
                "jobs go to a partition/account that may not exist on your cluster and are refused",
                "edit the lines marked CHANGE (docs/slurm.md)",
            )
        )
    return out


def _shown(path: str | Path) -> str:
    """``path`` relative to the repository when inside it (as the docs name files)."""
    p = Path(path).resolve()
    return str(p.relative_to(REPO_ROOT)) if p.is_relative_to(REPO_ROOT) else str(path)


def probe_cap_state(state_dir: str | Path | None = None) -> dict[str, Any]:
    """Cap and clock-lock state files on this host: left by a run that was killed while its
    GPUs were capped or clock-locked (``knob: clock``), listed with ``restore-caps``'s dry run;
    nothing restored."""
    from wattflex.runs.devices.clocks import restore_clocks_from_state_dir

    where = Path(state_dir) if state_dir else default_state_dir()
    records = restore_from_state_dir(where, dry_run=True)
    clock_records = restore_clocks_from_state_dir(where, dry_run=True)
    stale = [r for r in records if r.get("action") == "would restore"]
    stale_clocks = [r for r in clock_records if r.get("action") == "would restore"]
    out: dict[str, Any] = {
        "state_dir": str(where),
        "files": records + clock_records,
        "stale": len(stale),
        "stale_clocks": len(stale_clocks),
        "problems": [],
    }
    if stale:
        out["problems"].append(
            problem(
                f"{len(stale)} cap state file(s) of killed runs in {where}",
                "their GPUs may still be capped: the next measurement starts from a wrong limit",
                "wattflex restore-caps (the SLURM epilog does it after each job)",
            )
        )
    if stale_clocks:
        out["problems"].append(
            problem(
                f"{len(stale_clocks)} clock-lock state file(s) of killed runs in {where}",
                "their GPUs' SM clocks may still be locked: the next measurement runs at a fixed clock",
                "wattflex restore-caps (it resets the locks; the SLURM epilog does it after each job)",
            )
        )
    records = records + clock_records
    for r in records:
        if r.get("action") == "untrusted":
            out["problems"].append(
                problem(
                    f"{r['path']}: {r['note']}",
                    "another user may have planted it; wattflex never reads it, and a run refuses an unsafe folder",
                    "remove it, or set cuda.state_dir / $WATTFLEX_STATE_DIR to a folder only you (or root) can write",
                )
            )
    return out


# ---- what a config needs -------------------------------------------------------------------------
def check_config(cfg: dict[str, Any], found: dict[str, Any]) -> dict[str, Any]:
    """What a campaign config needs of this machine (``found``: the probes' results) and which
    of it is missing. The emulated backend (and ingest campaigns) need nothing GPU-related."""
    backend = cfg["backend"]
    out: dict[str, Any] = {
        "backend": backend,
        "source": cfg["source"],
        "needs": [],
        "missing": [],
        "warnings": [],
    }
    if backend != "cuda" or out["source"] != "generate":
        return out
    cuda = dict(cfg.get("cuda") or {})
    try:
        opts = RunOptions.from_spec({"cuda": cuda, "group": {"gpus": 1}})
    except ValueError as exc:
        out["missing"].append({"need": "a valid cuda: section", "detail": str(exc)})
        return out
    out.update(
        device=opts.device, cap_control=opts.cap_control, sampler=opts.sampler, sweep=cfg["sweep"]
    )
    nvml_found, torch_found = found["nvml"], found["torch"]
    n_gpus = len(nvml_found["gpus"]) if nvml_found["available"] else torch_found["device_count"]

    def need(name: str, ok: bool, detail: str) -> None:
        out["needs"].append(name)
        if not ok:
            out["missing"].append({"need": name, "detail": detail})

    if opts.uses_nvml:
        need("NVML", nvml_found["available"], nvml_found["error"] or "NVML unavailable")
    if opts.device == "cuda" or opts.uses_nvml:
        need("at least one GPU", n_gpus > 0, "no GPU visible (NVML / torch) on this machine")
    if opts.device == "cuda":
        need(
            "torch with CUDA",
            torch_found["cuda_available"],
            f"torch {torch_found['version']} (CUDA build: {torch_found['built_with_cuda']}) sees no GPU",
        )
    if opts.cap_control == "nvml":
        perm = found["cap_permission"]
        need(
            "permission to set power limits",
            perm["likely"],
            f"cuda.cap_control: nvml needs root (inferred: "
            f"{perm['basis']}); {without_root_fix()}; or cuda.cap_control: observe",
        )
    elif opts.cap_control == "command":
        argv = shlex.split(opts.cap_command or "")
        need(
            "the cap command's program",
            bool(argv) and shutil.which(argv[0]) is not None,
            f"cuda.cap_command {opts.cap_command!r}: {argv[0] if argv else '(empty)'} not found on PATH",
        )
        if argv and Path(argv[0]).name == "sudo" and shutil.which(argv[0]):
            formatted = [a.format(gpu=0, watts=0) for a in argv]
            refusal = sudo_refusal(formatted)
            need(
                "sudo allowing the cap command without a password",
                refusal is None,
                f"cuda.cap_command {opts.cap_command!r}: sudo would not run it for this user ({refusal}); "
                f"{without_root_fix()}",
            )
    from wattflex.runs.command_run import program_path  # a group's own training command

    for g in groups(cfg):
        if g.get("command"):
            prog = str(g["command"]["launch"][0])
            need(
                f"group {g['id']}'s command program",
                program_path(prog) is not None,
                f"group {g['id']}: command.launch[0] {prog!r} not found (not on PATH, or not an executable "
                f"file): give its full path or install it on this node",
            )
    no_gpm = [g for g in nvml_found["gpus"] if not g.get("gpm_readable", True)]
    if opts.sampler and (opts.telemetry == "dcgm" or (opts.telemetry == "auto" and no_gpm)):
        # as the run decides (wattflex.runs.devices.dcgm_sampler.choose_source): dcgm fails a run whose
        # DCGM does not answer; auto asks DCGM only where GPM is unreadable, else stays on NVML
        why_not = dcgm_source.probe(opts.dcgm)
        out["telemetry"] = {
            "mode": opts.telemetry,
            "dcgm": opts.dcgm.describe(),
            "dcgm_answers": why_not is None,
            "detail": why_not,
        }
        if opts.telemetry == "dcgm":
            need(
                f"DCGM answering ({opts.dcgm.mode})",
                why_not is None,
                f"cuda.telemetry: dcgm: {why_not}",
            )
        elif why_not:
            out["warnings"].append(
                f"cuda.telemetry: auto: GPM is unreadable on {len(no_gpm)} GPU(s) and DCGM "
                f"does not answer ({why_not}): the profiling fields will be NaN"
            )
    if out["sweep"] in ("staircase", "adaptive"):
        need(
            f"sweep: {out['sweep']} on cuda: settable caps and the sampler",
            opts.cap_control != "observe" and opts.sampler,
            f"needs cuda.cap_control nvml or command (is {opts.cap_control}) "
            f"and cuda.sampler: true (is {opts.sampler})",
        )
    if plan_enforced(cfg):
        # the resource plan (wattflex.runs.plan): what snakemake -n refuses, one entry per group
        plans = plan_campaign(cfg, groups(cfg))
        out["needs"].append(PLAN_NEED)
        out["missing"] += [
            {"need": f"{PLAN_NEED}: group {p.group}", "detail": p.reason}
            for p in plans
            if not p.fits
        ]
        out["plan"] = [p.row() for p in plans]
    models = sorted({g["gpu"] for g in groups(cfg)})
    names = [g["name"] for g in nvml_found["gpus"]] or torch_found["devices"]
    if names and not any(m in n for m in models for n in names):
        out["warnings"].append(
            f"the config's groups are for {', '.join(models)}; "
            f"this machine has {', '.join(sorted(set(names)))}"
        )
    return out


# ---- everything ----------------------------------------------------------------------------------
PROBES: dict[str, Callable[..., dict[str, Any]]] = {
    "nvml": probe_nvml,
    "cap_permission": probe_cap_permission,
    "dcgm": probe_dcgm,
    "host_power": probe_host_power,
    "torch": probe_torch,
    "slurm": probe_slurm,
    "cap_state": probe_cap_state,
}


def diagnose(
    config_path: str | Path | None = None,
    exporter_url: str | None = None,
    state_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Every probe, then the config check (``config_path``; None: ``config/config.yaml`` in
    the current directory if present). A probe that crashes is reported, never raised."""
    report: dict[str, Any] = {
        "wattflex_version": __version__,
        "host": socket.gethostname(),
        "time_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "observe_only": True,
    }
    kwargs = {"dcgm": {"exporter_url": exporter_url}, "cap_state": {"state_dir": state_dir}}
    for name, probe in PROBES.items():
        try:
            report[name] = probe(**kwargs.get(name, {}))
        except UserError:
            raise
        except Exception as exc:  # a broken probe must not hide the others
            report[name] = {
                "error": f"{type(exc).__name__}: {exc}",
                "problems": [
                    problem(
                        f"the {name} probe failed ({type(exc).__name__}: {exc})",
                        "this part of the machine is unknown",
                        "report it",
                    )
                ],
            }
    if config_path is None and DEFAULT_CONFIG.is_file():
        config_path = DEFAULT_CONFIG
    if config_path is None:
        report["config"] = {
            "path": None,
            "needs": [],
            "missing": [],
            "warnings": [],
            "note": "no config given and no config/config.yaml here: nothing required",
        }
    else:
        check_input_file(config_path, "--configfile", MAX_DOC_BYTES)
        # This machine's part only: weights/data paths are checked where snakemake runs (runs.campaign_checks).
        report["config"] = {
            "path": str(config_path),
            **check_config(load_config(config_path, onto_default=True), report),
        }
    report["problems"] = [p for name in PROBES for p in report[name].get("problems", [])]
    report["ok"] = not report["config"]["missing"]
    return report


# ---- the human-readable form ---------------------------------------------------------------------
def _w(v: Any) -> str:
    return "?" if v is None else f"{v:g}"


def format_report(r: dict[str, Any]) -> str:
    """The doctor's report as text, one section per thing checked (NVML and its GPUs, DCGM, SLURM,
    the cap state folder, the config's needs) and the problems with their fixes.
    """
    lines = [
        f"wattflex doctor on {r['host']} ({r['time_utc']}); observe-only: nothing was changed",
        "",
    ]
    nv = r["nvml"]
    if nv.get("available"):
        lines.append(
            f"NVML        driver {nv['driver_version']}, NVML {nv['nvml_version']}, CUDA driver "
            f"{nv['cuda_driver_version']}, {len(nv['gpus'])} GPU(s) of this job "
            f"(NVML counts {nv.get('node_gpus')} on the node)   [pynvml: {nv['module']}]"
        )
        for g in nv["gpus"]:
            gpm = (
                f"GPM readable ({', '.join(f'{k} {v:g}' for k, v in g['gpm_values'].items())})"
                if g["gpm_readable"]
                else f"GPM {g['gpm']}"
            )
            pm = {True: "on", False: "off", None: "unknown"}[g["persistence_mode"]]
            lines += [
                f"  GPU {g['index']}     {g['name']} ({g['uuid']}, PCI {g.get('pci_bus_id')}), "
                f"drawing {_w(g['power_w'])} W",
                f"            power limit {_w(g['power_limit_w'])} W (default {_w(g['default_limit_w'])}, "
                f"range {_w(g['min_limit_w'])}-{_w(g['max_limit_w'])}, enforced {_w(g['enforced_limit_w'])})",
                f"            clocks SM {_w(g['sm_clock_mhz'])} MHz (max {_w(g['sm_clock_max_mhz'])}), memory "
                f"{_w(g['mem_clock_mhz'])} MHz (max {_w(g['mem_clock_max_mhz'])})",
                f"            {gpm}; persistence mode {pm}",
            ]
    else:
        lines.append(f"NVML        unavailable: {nv.get('error')}   [pynvml: {nv.get('module')}]")
    perm = r["cap_permission"]
    lines.append(
        f"Power caps  this process {'could likely' if perm.get('likely') else 'likely could not'} set power "
        f"limits (inferred from {perm.get('basis')}; not tried)"
    )
    dc = r["dcgm"]
    ex = dc.get("exporter")
    if not dc.get("exporter_url"):
        exporter = "no dcgm-exporter URL given (--dcgm-exporter URL)"
    elif ex and ex.get("reachable"):
        exporter = (
            f"dcgm-exporter {dc['exporter_url']}: {ex['metrics']} metrics, "
            f"fills {', '.join(ex['telemetry_columns']) or 'nothing'}"
        )
    else:
        exporter = f"dcgm-exporter {dc['exporter_url']}: unreachable ({(ex or {}).get('error')})"
    dcgmi = f"{dc['dcgmi']} (host engine: {dc['hostengine']})" if dc.get("dcgmi") else "not on PATH"
    lines.append(f"DCGM        dcgmi {dcgmi}; {exporter}")
    lines.append(f"Host power  {r['host_power'].get('describe', r['host_power'].get('error'))}")
    t = r["torch"]
    if t.get("version"):
        lines.append(
            f"torch       {t['version']}, built with CUDA {t['built_with_cuda'] or '- (CPU-only build)'}; "
            f"cuda available: {'yes' if t['cuda_available'] else 'no'}, {t['device_count']} device(s)"
            + (f": {', '.join(t['devices'])}" if t["devices"] else "")
        )
    else:
        lines.append("torch       not importable")
    s = r["slurm"]
    if "commands" in s:
        on_path = [c for c, p in s["commands"].items() if p]
        lines.append(
            f"SLURM       {', '.join(on_path) or 'no client'} on PATH; profile {s['profile']}: partition "
            f"{s.get('partition')}, account {s.get('account')}, {s.get('gpus_per_node')} GPUs/node, "
            f"GPU request {s.get('gpu_model')} "
            f"({', '.join(f'{m}: {q}' for m, q in s.get('requests', {}).items())})"
        )
        if s.get("check"):
            lines.append(f"            (not checked against the cluster; to check: {s['check']})")
    cs = r["cap_state"]
    if "state_dir" in cs:
        lines.append(
            f"Cap state   {len(cs['files'])} state file(s) in {cs['state_dir']}, {cs['stale']} of killed runs"
            + (f" ({cs['stale_clocks']} clock locks)" if cs.get("stale_clocks") else "")
        )
    for name in PROBES:
        if "error" in r[name] and name != "nvml":
            lines.append(f"{name}: probe failed: {r[name]['error']}")
    if r["problems"]:
        lines += ["", f"Missing here, and what you lose ({len(r['problems'])}):"]
        for p in r["problems"]:
            lines += [f"  - {p['what']}", f"      loses: {p['loses']}", f"      fix: {p['fix']}"]
    c = r["config"]
    lines.append("")
    if c.get("path") is None:
        lines.append(f"Config      {c['note']}")
    else:
        what = f"backend {c['backend']}"
        if c["backend"] == "cuda" and "device" in c:
            what += (
                f", cuda.device {c['device']}, cap_control {c['cap_control']}, "
                f"sampler {'on' if c['sampler'] else 'off'}"
            )
        if not c["needs"] and not c["missing"]:
            lines.append(
                f"Config      {c['path']} ({what}): needs nothing GPU-related from this machine: OK"
            )
        elif not c["missing"]:
            lines.append(
                f"Config      {c['path']} ({what}): has all it needs ({', '.join(c['needs'])}): OK"
            )
        else:
            lines.append(
                f"Config      {c['path']} ({what}) is missing {len(c['missing'])} thing(s) it needs:"
            )
            lines += [f"  - {m['need']}: {m['detail']}" for m in c["missing"]]
            lines.append(
                "  -> exit status 1 (runs of this config would fail here; "
                "on a cluster, run doctor on a GPU node)"
            )
        lines += [f"  warning: {w}" for w in c.get("warnings", [])]
    return "\n".join(lines) + "\n"
