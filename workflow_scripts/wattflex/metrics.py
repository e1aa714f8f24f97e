"""The telemetry metrics: one entry per per-GPU sample column, the single source of what a
metric is called, its unit and plausible range, where NVML (or GPM) and DCGM read it, and
whether the PFI predictor may use it.

Derived from :data:`METRICS` (call the functions, not copies, so a new entry reaches all):
the telemetry schema (``wattflex.telemetry``), the NVML sampler's row and GPM reader
(``runs.devices.base``, ``runs.devices.nvml``), the DCGM parsers and their ranges
(``ingest.dcgm``, ``runs.devices.dcgm_sampler``), the emulator's columns (``runs.emulator.device``),
the closed-loop truth table (``control.clustersim``) and the predictor's candidates
(``analysis.predictor``). Adding a metric is one entry here plus the code that reads it.

DCGM field ids, exporter names and dmon short names are DCGM's ``dcgm_fields.h``; NVML/GPM
names are ``pynvml``'s (nvidia-ml-py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One telemetry metric: its column and unit, its plausible range, how NVML, GPM and DCGM read
    it (and the factor from DCGM's unit), and whether the run summary and the predictor use it.
    """

    name: str  # telemetry column
    unit: str  # the schema's unit (a DCGM reading is scaled to it by dcgm_factor)
    lo: float  # plausible range in that unit (ingest.dcgm rejects values outside)
    hi: float
    description: str  # what a reader (and the predictor's feature list) is told
    nvml: str | None = None  # the NVML call (or GPM metric) the sampler reads it with
    gpm: str | None = None  # pynvml GPM metric constant (a 0-100 value, stored as a 0-1 fraction)
    dcgm_field: int | None = None
    dcgm_exporter: str | None = None  # dcgm-exporter metric name (DCGM_FI_<field>)
    dcgm_dmon: str | None = None  # `dcgmi dmon` column short name
    dcgm_factor: float = 1.0  # DCGM's unit -> the schema's
    dcgm_aliases: tuple[str, ...] = ()  # newer DCGM and dcgm-exporter 1.x names of the field
    dcgm_profiling: bool = False  # read from DCGM when GPM cannot (runs.devices.dcgm_sampler)
    activity: bool = True  # a job's mean over GPUs in the run summary (power is summed)
    predictor: bool = False  # a candidate of the predictor's `all_dcgm` set
    range_hint: str = ""  # the hint when a value is out of range (default: the unit)


_RATIO = "(a 0-1 ratio, not a percentage)"

METRICS: list[Metric] = [
    Metric(
        "power_w",
        "W",
        0.0,
        2000.0,
        "board power per GPU (W)",
        nvml="NVML_FI_DEV_POWER_INSTANT (else nvmlDeviceGetPowerUsage), mW",
        dcgm_field=155,
        dcgm_exporter="DCGM_FI_DEV_POWER_USAGE",
        dcgm_dmon="POWER",
        dcgm_aliases=("DCGM_FI_DEV_BOARD_POWER_WATTS", "dcgm_power_usage"),
        activity=False,
        range_hint="W per GPU (in mW or kW?)",
    ),
    Metric(
        "energy_j",
        "J",
        0.0,
        1e13,
        "energy since the run started (J)",
        nvml="nvmlDeviceGetTotalEnergyConsumption, mJ",
        dcgm_field=156,
        dcgm_exporter="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        dcgm_dmon="TOTEC",
        dcgm_factor=1e-3,
        dcgm_aliases=("dcgm_total_energy_consumption",),
        activity=False,
    ),  # mJ
    Metric(
        "sm_clock_mhz",
        "MHz",
        0.0,
        5000.0,
        "SM clock (MHz)",
        nvml="nvmlDeviceGetClockInfo(NVML_CLOCK_SM)",
        dcgm_field=100,
        dcgm_exporter="DCGM_FI_DEV_SM_CLOCK",
        dcgm_dmon="SMCLK",
        dcgm_aliases=("dcgm_sm_clock",),
        predictor=True,
    ),
    Metric(
        "mem_clock_mhz",
        "MHz",
        0.0,
        20000.0,
        "memory clock (MHz)",
        nvml="nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)",
        dcgm_field=101,
        dcgm_exporter="DCGM_FI_DEV_MEM_CLOCK",
        dcgm_dmon="MMCLK",
        dcgm_aliases=("dcgm_memory_clock",),
        predictor=True,
    ),
    Metric(
        "gpu_util",
        "%",
        0.0,
        100.0,
        "GPU utilisation (%)",
        nvml="nvmlDeviceGetUtilizationRates().gpu",
        dcgm_field=203,
        dcgm_exporter="DCGM_FI_DEV_GPU_UTIL",
        dcgm_dmon="GPUTL",
        dcgm_aliases=("dcgm_gpu_utilization",),
        dcgm_profiling=True,
        predictor=True,
    ),
    Metric(
        "mem_copy_util",
        "%",
        0.0,
        100.0,
        "memory copy utilisation (%)",
        nvml="nvmlDeviceGetUtilizationRates().memory",
        dcgm_field=204,
        dcgm_exporter="DCGM_FI_DEV_MEM_COPY_UTIL",
        dcgm_dmon="MCUTL",
        dcgm_aliases=("dcgm_mem_copy_utilization",),
        dcgm_profiling=True,
        predictor=True,
    ),
    Metric(
        "dram_active",
        "fraction",
        0.0,
        1.0,
        "DRAM active fraction (0-1)",
        nvml="GPM NVML_GPM_METRIC_DRAM_BW_UTIL",
        gpm="NVML_GPM_METRIC_DRAM_BW_UTIL",
        dcgm_field=1005,
        dcgm_exporter="DCGM_FI_PROF_DRAM_ACTIVE",
        dcgm_dmon="DRAMA",
        dcgm_profiling=True,
        predictor=True,
        range_hint=_RATIO,
    ),
    Metric(
        "sm_active",
        "fraction",
        0.0,
        1.0,
        "SM active fraction (0-1)",
        nvml="GPM NVML_GPM_METRIC_SM_UTIL",
        gpm="NVML_GPM_METRIC_SM_UTIL",
        dcgm_field=1002,
        dcgm_exporter="DCGM_FI_PROF_SM_ACTIVE",
        dcgm_dmon="SMACT",
        dcgm_profiling=True,
        predictor=True,
        range_hint=_RATIO,
    ),
    Metric(
        "tensor_active",
        "fraction",
        0.0,
        1.0,
        "tensor pipe active fraction (0-1)",
        nvml="GPM NVML_GPM_METRIC_ANY_TENSOR_UTIL",
        gpm="NVML_GPM_METRIC_ANY_TENSOR_UTIL",
        dcgm_field=1004,
        dcgm_exporter="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        dcgm_dmon="TENSO",
        dcgm_profiling=True,
        predictor=True,
        range_hint=_RATIO,
    ),
    Metric(
        "fb_used_gib",
        "GiB",
        0.0,
        1024.0,
        "framebuffer used (GiB)",
        nvml="nvmlDeviceGetMemoryInfo().used, B",
        dcgm_field=252,
        dcgm_exporter="DCGM_FI_DEV_FB_USED",
        dcgm_dmon="FBUSD",
        dcgm_factor=1.0 / 1024,
        dcgm_aliases=("dcgm_fb_used",),
        predictor=True,
    ),  # MiB
    Metric(
        "temp_c",
        "deg C",
        -20.0,
        130.0,
        "GPU temperature (C)",
        nvml="nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
        dcgm_field=150,
        dcgm_exporter="DCGM_FI_DEV_GPU_TEMP",
        dcgm_dmon="TMPTR",
        dcgm_aliases=("dcgm_gpu_temp",),
        predictor=True,
    ),
    Metric(
        "power_limit_w",
        "W",
        0.0,
        2000.0,
        "power management limit (W)",
        nvml="nvmlDeviceGetPowerManagementLimit, mW",
        dcgm_field=160,
        dcgm_exporter="DCGM_FI_DEV_POWER_MGMT_LIMIT",
        dcgm_dmon="PMLMT",
        dcgm_aliases=("DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS",),
        range_hint="W per GPU",
    ),
    Metric(
        "enforced_limit_w",
        "W",
        0.0,
        2000.0,
        "enforced power limit (W)",
        nvml="nvmlDeviceGetEnforcedPowerLimit, mW",
        dcgm_field=164,
        dcgm_exporter="DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        dcgm_dmon="EPLMT",
        dcgm_aliases=("DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS",),
        range_hint="W per GPU",
    ),
]

#: Columns of every telemetry row before the metrics: sample time, node, GPU index on the node.
ID_COLUMNS = ["t_s", "node", "gpu"]


def telemetry_columns() -> list[str]:
    """The telemetry table's columns in order: the id columns, then every metric's."""
    return ID_COLUMNS + [m.name for m in METRICS]


def activity_metrics() -> list[str]:
    """The metrics averaged over a job's GPUs in the run summary (power is summed instead)."""
    return [m.name for m in METRICS if m.activity]


def predictor_metrics() -> list[str]:
    """The metrics the predictor may use as features (its ``all_dcgm`` set)."""
    return [m.name for m in METRICS if m.predictor]


def gpm_metrics() -> dict[str, str]:
    """column -> pynvml GPM metric constant name."""
    return {m.name: m.gpm for m in METRICS if m.gpm}


def dcgm_fields() -> dict[int, tuple[str, str, str, float]]:
    """DCGM field id -> (exporter name, dmon short name, column, factor), by field id."""
    return {
        m.dcgm_field: (m.dcgm_exporter, m.dcgm_dmon, m.name, m.dcgm_factor)
        for m in sorted(METRICS, key=lambda m: m.dcgm_field or 0)
        if m.dcgm_field is not None
    }


def dcgm_aliases() -> dict[str, str]:
    """Older and newer DCGM field names mapped to the metric they read (a capture from either
    version is read into the same column).
    """
    return {a: m.name for m in METRICS for a in m.dcgm_aliases}


def dcgm_profiling_columns() -> tuple[str, ...]:
    """The columns read from DCGM where GPM cannot: its profiling (PROF) fields first."""
    chosen = [m for m in METRICS if m.dcgm_profiling]
    return tuple(
        m.name
        for m in sorted(chosen, key=lambda m: not m.dcgm_exporter.startswith("DCGM_FI_PROF_"))
    )


def ranges() -> dict[str, tuple[float, float, str]]:
    """column -> (lo, hi, hint) in the schema's unit."""
    return {m.name: (m.lo, m.hi, m.range_hint or m.unit) for m in METRICS}


def descriptions() -> dict[str, str]:
    """Each metric's column name mapped to its one-line description."""
    return {m.name: m.description for m in METRICS}
