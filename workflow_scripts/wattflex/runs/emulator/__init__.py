"""The emulated backend in one place: a virtual H200/H100 running one training job.

- ``physics``: every global constant (``Physics``, each with its source), the calibration it
  takes and the voltage curve;
- ``step``: the DVFS power model and the roofline of one training step (``JobSpec``,
  ``step_kernels``, ``operating_points``, ``job_at_caps``);
- ``timeline``: the run before steady training and the shortest run that reaches it;
- ``clock_knob``: the SM clock lock as a knob, through the same model;
- ``device``: the emulated device and run (``run_emulated_tables``, the one entry point the
  run calls: ``wattflex.runs.runner``).

The names other packages use are handed on here, the run's entry point first:
``run_emulated_tables`` (``wattflex.runs.runner`` calls it).
"""

from wattflex.runs.emulator.device import run_emulated_tables
from wattflex.runs.emulator.physics import (
    CALIBRATED,
    DEFAULT_DIE,
    DENSE_GEMM_EFF,
    PHYSICS,
    Physics,
    calibrated_physics,
    physics_for_gpu,
    voltage,
)
from wattflex.runs.emulator.step import (
    JobAtCap,
    JobSpec,
    Kernel,
    Operating,
    attention_impl,
    enforce_cap,
    gpu_leakages,
    job_at_cap,
    job_at_caps,
    memory_footprint_gib,
    operating_points,
    pipeline_bubble,
    pipeline_stage,
    power_model_clock_for_cap,
    step_kernels,
    synchronous_step,
)

__all__ = [
    "CALIBRATED",
    "DEFAULT_DIE",
    "DENSE_GEMM_EFF",
    "PHYSICS",
    "JobAtCap",
    "JobSpec",
    "Kernel",
    "Operating",
    "Physics",
    "attention_impl",
    "calibrated_physics",
    "enforce_cap",
    "gpu_leakages",
    "job_at_cap",
    "job_at_caps",
    "memory_footprint_gib",
    "operating_points",
    "physics_for_gpu",
    "pipeline_bubble",
    "pipeline_stage",
    "power_model_clock_for_cap",
    "run_emulated_tables",
    "step_kernels",
    "synchronous_step",
    "voltage",
]
