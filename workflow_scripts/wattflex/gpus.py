"""The one GPU catalogue: power-limit range, clocks, peak rates, memory and the emulator's
power-model parameters of every GPU wattflex knows, plus the default model.

Adding a GPU model is one entry in ``GPUS`` (the config schema's ``gpu`` enum is checked
against it by a test). The SM power-model constants shared by all entries (the calibration
anchor and what it implies: ``sm_dyn_w``, the voltage curve, the activity weights) live with
the model in ``wattflex.runs.emulator.Physics``; ``wattflex.calibration`` fits them.
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
    nvlink_gb_s: float = 370.0  # achievable per-GPU collective bandwidth in a node
    internode_gb_s: float = (
        90.0  # per-GPU bus bandwidth of rail-optimised NCCL collectives across nodes
    )
    clock_step_mhz: float = 15.0
    # SM clock the datasheet's bf16 peak is quoted at: 989.4 TFLOPS = 132 SMs x 4 tensor cores
    # x 1024 FLOP/clock x 1.83 GHz (the FP64-tensor 67 TFLOPS is quoted at 1.98 GHz).
    peak_clock_mhz: float = 1830.0
    slurm_name: str = ""  # default GRES/constraint name (profiles/slurm overrides it)
    # The die whose SM power curve the part has. The emulator's default power curve is fitted on
    # GH100 facts (wattflex.calibration); a part of another die has none until `wattflex
    # calibrate` fits its anchor on sweeps measured on it (an emulated run refuses it without).
    die: str = "GH100"

    def clock_bins(self) -> np.ndarray:
        import numpy as np

        return np.arange(self.sm_clock_min_mhz, self.sm_clock_max_mhz + 1e-9, self.clock_step_mhz)

    def tensor_flops_per_s(self, x: np.ndarray | float) -> np.ndarray | float:
        """Dense bf16 tensor peak at relative SM clock ``x = f / sm_clock_max_mhz`` (scales with f)."""
        return self.peak_bf16_tflops * 1e12 * x * self.sm_clock_max_mhz / self.peak_clock_mhz


# Limits, clocks, peak rates and memory: NVIDIA H100/H200 SXM datasheets (dense bf16 989 TFLOPS,
# 3.35 / 4.8 TB/s, 80 / 141 GB, 700 W). Idle and HBM power (idle_w, mem_idle_w, mem_dyn_w): assumed.
# They were labelled "measured" with no source; none was found. Ujeniya et al. 2026
# (arXiv:2604.11391) record memory power per cap on a 94 GB H100 and a 144 GB H200, but their
# figures could not be read here, so no value of theirs is used (a reading quoted in a review,
# 72-120 W on the 94 GB part, is unverified and not applied). The SM power curve is
# one for both (same GH100 die; wattflex.calibration): fitted to the Ujeniya et al. 2026
# cap -> clock table (labelled FP64 DGEMM; wattflex.calibration says what of that was verified), which was measured on an HBM2e 94 GB / 2.41 TB/s H100 part
# (their testbed: NHR@FAU Helma nodes, 4 GPUs each), not the 80 GB / 3.35 TB/s HBM3 SXM
# modelled here. Its SM clock/voltage behaviour is taken to carry over (same die, 200-700 W
# limits); the fit uses the catalogue H100's idle and HBM power for the DGEMM (an
# approximation: the 94 GB part's memory power differs and is not published per cap).
GPUS: dict[str, GPUSpec] = {
    "H200": GPUSpec(
        "H200",
        200,
        700,
        700,
        345,
        1980,
        3201,
        idle_w=75,
        mem_idle_w=42,
        mem_dyn_w=70,
        peak_bf16_tflops=989.4,
        hbm_tb_s=4.8,
        hbm_gib=141,
        slurm_name="h200",
    ),
    "H100": GPUSpec(
        "H100",
        200,
        700,
        700,
        345,
        1980,
        2619,
        idle_w=60,
        mem_idle_w=30,
        mem_dyn_w=48,
        peak_bf16_tflops=989.4,
        hbm_tb_s=3.35,
        hbm_gib=80,
        slurm_name="h100",
    ),
    # A100 SXM4 80 GB (GA100). NVIDIA A100 datasheet: 400 W max TDP, 312 TFLOPS dense bf16,
    # 80 GB HBM2e at 2039 GB/s; Ampere whitepaper: 1410 MHz boost, 108 SMs x 4 tensor cores x
    # 512 dense bf16 FLOP/clock (108 x 4 x 512 x 1.41 GHz = 311.9 TFLOPS: the peak is quoted at
    # the boost clock). nvidia-smi -q of A100-SXM4 parts: power limit 100-400 W, supported SM
    # clocks 210-1410 MHz (15 MHz steps), memory 1593 MHz. Collective bandwidths: the H100
    # entries' scaled by the links (assumed): NVLink 3 is 300 GB/s per direction vs NVLink 4's
    # 450 (370 x 300/450), one 200 Gb/s HDR rail per GPU (DGX A100) vs 400 Gb/s NDR (90 x 200/400).
    # Idle and HBM power: assumed (no measurement here): the H100's (60 W, 30 of it HBM; 48 W at
    # full bandwidth), the HBM parts scaled by bandwidth (2.04 / 3.35). No cap -> clock table is
    # published: its SM power level is the anchor `wattflex calibrate` fits on A100 sweeps (at
    # its 400 W default limit), with the GH100 voltage shape assumed (wattflex.calibration).
    "A100": GPUSpec(
        "A100",
        100,
        400,
        400,
        210,
        1410,
        1593,
        idle_w=48,
        mem_idle_w=18,
        mem_dyn_w=29,
        peak_bf16_tflops=312.0,
        hbm_tb_s=2.039,
        hbm_gib=80,
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
