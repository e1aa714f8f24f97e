"""The one GPU catalogue: power-limit range, clocks, peak rates, memory and the emulator's
power-model parameters of every GPU wattflex knows, plus the default model.

Adding a GPU model is one entry in ``GPUS`` (the config schema's ``gpu`` enum is checked
against it by a test). The SM power-model constants shared by all entries (the calibration
anchor and what it implies: ``sm_dyn_w``, the voltage curve, the activity weights) live with
the model in ``wattflex.runs.emulator.physics.Physics``; ``wattflex.analysis.calibration`` fits them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where used: the Snakefile reads this catalogue at every start
    import numpy as np

DEFAULT_GPU = "H200"  # the paper's headline GPU
# GPUs per node where a campaign does not say (cuda.nproc_per_node, slurm_gpus_per_node): an HGX
# H100/H200 baseboard's 8 SXM GPUs (NVIDIA HGX datasheet), the paper's 8-GPU nodes.
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class GPUSpec:
    """One catalogue entry: a GPU part's limits, clocks, rates, memory and power constants."""

    name: str
    min_limit_w: float
    max_limit_w: float
    default_limit_w: float
    sm_clock_min_mhz: float
    sm_clock_max_mhz: float
    mem_clock_mhz: float
    idle_w: float  # board power at idle, memory included
    mem_idle_w: float  # part of idle_w that is HBM
    mem_dyn_w: float  # extra HBM power at full bandwidth
    peak_bf16_tflops: float  # dense bf16 tensor rate at peak_clock_mhz (the datasheet's figure)
    hbm_tb_s: float
    hbm_gib: float
    # Per-GPU bus bandwidth NCCL achieves over NVLink in a node (all-gather, reduce-scatter,
    # all-to-all: the FSDP collectives and expert parallelism's dispatch/combine). H100/H200: 370
    # GB/s, the NCCL maintainers' figure: "450GB/s is the line rate. With the protocol overhead
    # (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s, which you can observe as
    # BusBw when running non-allreduce operations" (NVIDIA/nccl-tests issue 212); all_gather_perf
    # on 8 H100 saturates at ~360 GB/s, "exactly what we'd expect on H100" (issue 326). DeepEP's
    # tuned all-to-all agrees: 153/158 GB/s dispatch/combine on H800 (deepseek-ai/DeepEP
    # docs/legacy.md, intranode EP 8), whose ~160 GB/s NVLink maximum is 80 % of its 200 GB/s line
    # rate per direction (H800 SXM: 400 GB/s NVLink), the share 370 is of 450.
    nvlink_gb_s: float = 370.0
    internode_gb_s: float = (
        90.0  # per-GPU bus bandwidth of rail-optimised NCCL collectives across nodes
    )
    clock_step_mhz: float = 15.0
    # SM clock the datasheet's bf16 peak is quoted at: 989.4 TFLOPS = 132 SMs x 4 tensor cores
    # x 1024 FLOP/clock x 1.83 GHz (the FP64-tensor 67 TFLOPS is quoted at 1.98 GHz).
    peak_clock_mhz: float = 1830.0
    slurm_name: str = ""  # default GRES/constraint name (profiles/slurm overrides it)
    # The die whose SM power curve the part has. The emulator's default power curve is fitted on
    # GH100 facts (wattflex.analysis.calibration); a part of another die has none until `wattflex
    # calibrate` fits its anchor on sweeps measured on it (an emulated run refuses it without).
    die: str = "GH100"

    def clock_bins(self) -> np.ndarray:
        """The SM clocks (MHz) the part can run at, ``clock_step_mhz`` apart."""
        import numpy as np

        return np.arange(self.sm_clock_min_mhz, self.sm_clock_max_mhz + 1e-9, self.clock_step_mhz)

    def tensor_flops_per_s(self, x: np.ndarray | float) -> np.ndarray | float:
        """Dense bf16 tensor peak at relative SM clock ``x = f / sm_clock_max_mhz`` (scales with f)."""
        return self.peak_bf16_tflops * 1e12 * x * self.sm_clock_max_mhz / self.peak_clock_mhz


# Limits, clocks, peak rates and memory: NVIDIA H100/H200 SXM datasheets (dense bf16 989 TFLOPS,
# 3.35 / 4.8 TB/s, 80 / 141 GB, 700 W); the 94 GB HBM2e H100: 2.41 TB/s, as Ujeniya et al. 2026
# (arXiv:2604.11391) describe their testbed part.
#
# Idle and HBM power come from the one per-cap memory-power reading found: Ujeniya et al. 2026
# v2 Figs. 6b/9b on the 94 GB HBM2e H100 (resources/external/ujeniya2026-v2/, a third-party
# reading, unverified; its workload label is disputed: wattflex.analysis.calibration). Its memory power
# rises linearly with the SM clock, 72 W at 625 MHz to 120 W at 1969 MHz (least squares:
# 49.9 + 69.7 * f/f_max W, residuals <= 1.9 W): HBM_IDLE_W_94GB at no traffic and
# HBM_DYN_W_94GB at the calibration workload's traffic at f_max, taken as full bandwidth (a lower
# bound on the full-bandwidth power: the workload's DRAM utilisation is at most 1). Its board
# draw minus memory power, fitted with the voltage curve (wattflex.analysis.calibration.fit_voltage_curve),
# leaves GH100_STATIC_W of non-memory static power. The other parts' HBM power is derived from
# the same reading: idle per GB of HBM and dynamic per TB/s of bandwidth (assumed: the same
# energy per byte moved and per GB held across HBM2e, HBM3 and HBM3e; no per-part figure found).
HBM_IDLE_W_94GB = 49.9  # W at no HBM traffic, 94 GB HBM2e (fitted to the reading above)
HBM_DYN_W_94GB = 69.7  # W more at the reading's traffic at f_max, 2.41 TB/s (fitted, above)
GH100_STATIC_W = 43.9  # W, GH100 non-memory static power (fitted with the voltage curve, above)
# GA100 non-memory static power: assumed (the A100 entry's earlier 48 W idle less its 18 W HBM)
GA100_STATIC_W = 30.0


def _hbm_idle_w(hbm_gib: float) -> float:
    return round(HBM_IDLE_W_94GB * hbm_gib / 94.0, 1)


def _hbm_dyn_w(hbm_tb_s: float) -> float:
    return round(HBM_DYN_W_94GB * hbm_tb_s / 2.41, 1)


def _entry(static_w: float, hbm_gib: float, hbm_tb_s: float, **facts) -> GPUSpec:
    """A catalogue entry whose idle and HBM power follow from its HBM (comment above)."""
    mem_idle = _hbm_idle_w(hbm_gib)
    return GPUSpec(
        idle_w=round(static_w + mem_idle, 1),
        mem_idle_w=mem_idle,
        mem_dyn_w=_hbm_dyn_w(hbm_tb_s),
        hbm_gib=hbm_gib,
        hbm_tb_s=hbm_tb_s,
        **facts,
    )


# The SM power curve is one per die (GH100 for the three Hopper parts; wattflex.analysis.calibration).
GPUS: dict[str, GPUSpec] = {
    "H200": _entry(
        GH100_STATIC_W,
        hbm_gib=141,
        hbm_tb_s=4.8,
        name="H200",
        min_limit_w=200,
        max_limit_w=700,
        default_limit_w=700,
        sm_clock_min_mhz=345,
        sm_clock_max_mhz=1980,
        mem_clock_mhz=3201,
        peak_bf16_tflops=989.4,
        slurm_name="h200",
    ),
    "H100": _entry(
        GH100_STATIC_W,
        hbm_gib=80,
        hbm_tb_s=3.35,
        name="H100",
        min_limit_w=200,
        max_limit_w=700,
        default_limit_w=700,
        sm_clock_min_mhz=345,
        sm_clock_max_mhz=1980,
        mem_clock_mhz=2619,
        peak_bf16_tflops=989.4,
        slurm_name="h100",
    ),
    # The part the calibration reading was measured on (NHR@FAU Helma nodes, 4 GPUs each): HBM2e
    # 94 GB at 2.41 TB/s (arXiv:2604.11391), limits and clocks as the SXM H100's; memory clock
    # 1593 MHz (HBM2e at 3.2 Gb/s per pin, as the A100 80 GB's HBM2e; assumed for this part).
    "H100-94GB": _entry(
        GH100_STATIC_W,
        hbm_gib=94,
        hbm_tb_s=2.41,
        name="H100-94GB",
        min_limit_w=200,
        max_limit_w=700,
        default_limit_w=700,
        sm_clock_min_mhz=345,
        sm_clock_max_mhz=1980,
        mem_clock_mhz=1593,
        peak_bf16_tflops=989.4,
        slurm_name="h100-94gb",
    ),
    # A100 SXM4 80 GB (GA100). NVIDIA A100 datasheet: 400 W max TDP, 312 TFLOPS dense bf16,
    # 80 GB HBM2e at 2039 GB/s; Ampere whitepaper: 1410 MHz boost, 108 SMs x 4 tensor cores x
    # 512 dense bf16 FLOP/clock (108 x 4 x 512 x 1.41 GHz = 311.9 TFLOPS: the peak is quoted at
    # the boost clock). nvidia-smi -q of A100-SXM4 parts: power limit 100-400 W, supported SM
    # clocks 210-1410 MHz (15 MHz steps), memory 1593 MHz. Collective bandwidths: the H100
    # entries' scaled by the links (assumed): NVLink 3 is 300 GB/s per direction vs NVLink 4's
    # 450 (370 x 300/450), one 200 Gb/s HDR rail per GPU (DGX A100) vs 400 Gb/s NDR (90 x 200/400).
    # HBM2e power as the 94 GB H100's reading per GB and per TB/s (same HBM generation). No cap ->
    # clock table is published: its SM power level is the anchor `wattflex calibrate` fits on A100
    # sweeps (at its 400 W default limit), with the GH100 voltage shape assumed.
    "A100": _entry(
        GA100_STATIC_W,
        hbm_gib=80,
        hbm_tb_s=2.039,
        name="A100",
        min_limit_w=100,
        max_limit_w=400,
        default_limit_w=400,
        sm_clock_min_mhz=210,
        sm_clock_max_mhz=1410,
        mem_clock_mhz=1593,
        peak_bf16_tflops=312.0,
        nvlink_gb_s=246.0,
        internode_gb_s=45.0,
        peak_clock_mhz=1410.0,
        slurm_name="a100",
        die="GA100",
    ),
}

# Dense bf16 tensor peak per device name, for MFU in run records: the catalogue's (GPUS), plus
# a device the real harness may meet but the emulator does not model (NVIDIA B200 datasheet: 2250 TFLOPS).
PEAK_BF16_TFLOPS: dict[str, float] = {
    **{name: g.peak_bf16_tflops for name, g in GPUS.items()},
    "B200": 2250.0,
}


def gpu_spec(name: str) -> GPUSpec:
    """The catalogue entry of ``name``; a clear error for a GPU wattflex does not know."""
    try:
        return GPUS[name]
    except KeyError:
        raise KeyError(f"unknown GPU model {name!r}; known: {', '.join(GPUS)}") from None


def peak_bf16_flops(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s of a device from its NVML/torch name ("NVIDIA H100 80GB HBM3")."""
    for key, tflops in PEAK_BF16_TFLOPS.items():
        if key in device_name:
            return tflops * 1e12
    return None
