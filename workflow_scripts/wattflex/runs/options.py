"""A real run's measurement options: the ``cuda:`` section of its spec as ``RunOptions``
(caps, sampler, telemetry, torchrun layout, NCCL and gloo environment). Its own module so the
run spec (``runs.spec``) and the harness (``runs.real_run``) both read it without an import
cycle. ``torchrun_layout`` is also the plan's (``wattflex.runs.plan``), which the Snakefile loads:
the device modules (pandas) are imported where a spec is parsed, not with this module."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wattflex.gpus import GPUS_PER_NODE
from wattflex.schema import section_defaults

if TYPE_CHECKING:
    from wattflex.runs.devices.dcgm_sampler import DcgmSettings

# A spec from wattflex.config.run_spec has these keys (the schema's defaults filled); one without takes them.
_CUDA, _RUN = section_defaults("cuda"), section_defaults("run")


@dataclass
class RunOptions:
    """The measurement side of ``spec["cuda"]`` (the training side is ``TrainConfig``)."""

    device: str = _CUDA["device"]
    cap_control: str = _CUDA["cap_control"]
    cap_command: str | None = None
    sampler: bool = _CUDA["sampler"]
    sampler_period_s: float = _RUN["sample_period_s"]
    gpm: bool = _CUDA["gpm"]
    host_power: bool = True
    state_dir: str | None = None
    nproc_per_node: int = 1
    nnodes: int = 1
    nccl: dict[str, str] | None = None  # NCCL's environment for every torchrun (nccl_env)
    telemetry: str = _CUDA["telemetry"]  # nvml | dcgm | auto (wattflex.runs.devices.dcgm_sampler)
    dcgm: DcgmSettings | None = None

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> RunOptions:
        """The run's device options from its spec's ``cuda``, ``run`` and ``group`` blocks (schema
        defaults for what they leave out): capping, sampling, DCGM, torchrun layout, NCCL.

        Raises ValueError for an unknown telemetry or cap control mode or a bad cap command
        template.
        """
        from wattflex.runs.devices import caps
        from wattflex.runs.devices import dcgm_sampler as dcgm_source

        cuda, run, group = spec.get("cuda", {}), spec.get("run", {}), spec.get("group", {})
        nproc, nnodes = torchrun_layout(group, cuda)
        opts = cls(
            device=str(cuda.get("device", _CUDA["device"])),
            cap_control=str(cuda.get("cap_control", _CUDA["cap_control"])),
            cap_command=cuda.get("cap_command"),
            sampler=bool(cuda.get("sampler", _CUDA["sampler"])),
            sampler_period_s=float(
                cuda.get("sampler_period_s")
                or run.get("sample_period_s")
                or _RUN["sample_period_s"]
            ),
            gpm=bool(cuda.get("gpm", _CUDA["gpm"])),
            host_power=bool(cuda.get("host_power", True)),
            state_dir=cuda.get("state_dir"),
            nproc_per_node=nproc,
            nnodes=nnodes,
            nccl=nccl_env(cuda.get("nccl")),
            telemetry=str(cuda.get("telemetry", _CUDA["telemetry"])),
            dcgm=dcgm_source.DcgmSettings.from_spec(cuda.get("dcgm")),
        )
        if opts.telemetry not in dcgm_source.TELEMETRY_MODES:
            raise ValueError(
                f"cuda.telemetry {opts.telemetry!r}: expected one of {', '.join(dcgm_source.TELEMETRY_MODES)}"
            )
        if opts.cap_control not in caps.MODES:
            raise ValueError(
                f"cuda.cap_control {opts.cap_control!r}: expected one of {', '.join(caps.MODES)}"
            )
        caps.limit_setter(opts.cap_control, opts.cap_command)  # validates the command template
        return opts

    @property
    def uses_nvml(self) -> bool:
        """Whether the run needs NVML: it samples telemetry or sets caps (not ``observe``)."""
        return self.sampler or self.cap_control != "observe"


def torchrun_layout(group: Mapping[str, Any], cuda: Mapping[str, Any]) -> tuple[int, int]:
    """(ranks per node, nodes) of a group's job: ``cuda.nproc_per_node`` and ``cuda.nnodes``,
    else on ``device: cuda`` the group's GPUs over nodes of ``GPUS_PER_NODE``, on ``cpu`` one
    rank on one node. The harness launches this layout and the plan budgets for it."""
    device = str(cuda.get("device", _CUDA["device"]))
    gpus = int(group.get("gpus", 1))
    nproc = int(cuda.get("nproc_per_node") or (min(gpus, GPUS_PER_NODE) if device == "cuda" else 1))
    nnodes = cuda.get("nnodes")
    if nnodes is None:
        nnodes = max(1, math.ceil(gpus / nproc)) if device == "cuda" else 1
    return nproc, int(nnodes)


def layout_problem(group: Mapping[str, Any], cuda: Mapping[str, Any], per_node: int) -> str | None:
    """Why the harness's layout (:func:`torchrun_layout`) would not match the nodes SLURM gives a
    group on ``per_node``-GPU nodes (``slurm_gpus_per_node``: ⌈gpus / per_node⌉ nodes, the same
    count on each), or None. Off ``device: cuda`` the harness runs one CPU rank: nothing to match."""
    if str(cuda.get("device", _CUDA["device"])) != "cuda":
        return None
    gpus = int(group.get("gpus", 1))
    nodes = -(-gpus // per_node)
    want = (gpus // nodes, nodes)
    got = torchrun_layout(group, cuda)
    if got == want:
        return None
    return (
        f"group {group.get('id')}: SLURM gives its {gpus} GPUs as {nodes} node(s) x {want[0]} "
        f"({per_node}-GPU nodes, slurm_gpus_per_node) but the harness would start {got[1]} x "
        f"{got[0]} ranks (cuda.nnodes x cuda.nproc_per_node, default {GPUS_PER_NODE} per node): "
        f"set cuda.nproc_per_node: {want[0]}"
    )


def nccl_env(nccl: dict[str, Any] | None) -> dict[str, str]:
    """NCCL's settings (``cuda.nccl``) as the environment of every node's torchrun: ``debug``
    (NCCL_DEBUG, default WARN: NCCL's warnings reach train.log, its INFO chatter does not),
    ``socket_ifname`` (NCCL_SOCKET_IFNAME: the interface(s) for NCCL's bootstrap and socket
    transport, e.g. ``ib0`` or ``^lo,docker``; named interfaces also GLOO_SOCKET_IFNAME), ``ib_hca`` (NCCL_IB_HCA, e.g. ``mlx5_0,mlx5_1``),
    and ``env`` (any further variables, e.g. NCCL_NET_GDR_LEVEL). Unset keys leave the
    environment the job was started with alone."""
    nccl = {"debug": "WARN", **(nccl or {})}
    named = {"debug": "NCCL_DEBUG", "socket_ifname": "NCCL_SOCKET_IFNAME", "ib_hca": "NCCL_IB_HCA"}
    env = {var: str(nccl[key]) for key, var in named.items() if nccl.get(key) is not None}
    if nccl.get("socket_ifname") is not None:
        env.update(gloo_ifname(str(nccl["socket_ifname"])))
    env.update({str(k): str(v) for k, v in (nccl.get("env") or {}).items()})
    return env


def gloo_ifname(nccl_ifname: str) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME for the same interfaces as ``socket_ifname``: the checkpoint's gloo
    group otherwise binds to the interface the host name resolves to, on a multi-NIC node not
    always one the other nodes reach. Gloo takes interface names only (torch's
    ProcessGroupGloo: a comma-separated list), so NCCL's prefix forms (``^`` to exclude, ``=``
    for exact names) have no gloo equivalent except ``=`` dropped; ``^`` leaves gloo alone."""
    if nccl_ifname.startswith("^"):
        return {}
    return {"GLOO_SOCKET_IFNAME": nccl_ifname.removeprefix("=")}
