"""The tolerances of the PFI status checks (wattflex.pfi), in a module light enough for
``wattflex pfi --help`` to show their values."""

# Without SEMs, a change beyond this fraction of the reference value is significant.
REL_TOL = 0.02
# A cap binds when realised per-GPU power is within this fraction below it.
POWER_TOL = 0.10
