"""The emulated backend in one place: a virtual H200/H100 running one training job.

- ``physics``: every global constant (``Physics``, each with its source), the calibration it
  takes and the voltage curve;
- ``step``: the DVFS power model and the roofline of one training step (``JobSpec``,
  ``step_kernels``, ``operating_points``, ``job_at_caps``);
- ``timeline``: the run before steady training and the shortest run that reaches it;
- ``clock_knob``: the SM clock lock as a knob, through the same model;
- ``device``: the emulated device and run.

The package hands on one name, the entry point the run calls (``wattflex.runs.runner``):
``run_emulated_tables``. Everything else is imported from its module.
"""

from wattflex.runs.emulator.device import run_emulated_tables

__all__ = ["run_emulated_tables"]
