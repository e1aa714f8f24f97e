"""One-run sweeps: a group's whole cap grid measured inside one training run. ``steady``
decides when power and tokens/s are steady, ``algorithm`` walks the caps (staircase,
adaptive), ``emulated`` and ``real`` drive the emulated and the NVML backends.
"""

from wattflex import lazy_exports

# Public names, imported on first use (so a light submodule never pulls in heavy siblings).
EXPORTS = {
    "steady": ["SteadyCriteria", "assess"],
    "algorithm": ["staircase", "adaptive", "sweep_spec", "MODES"],
    "emulated": ["run_sweep", "write_sweep_run"],
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, EXPORTS)
