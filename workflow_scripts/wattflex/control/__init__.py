"""Closed-loop control: per-job caps that follow a grid curtailment signal. ``controller``
decides caps from readings (pure), ``loop`` reads and caps real devices, ``clustersim``
runs the controllers on an emulated cluster beside an oracle and an uncapped reference.
"""

from wattflex import lazy_exports

# Public names, imported on first use (so a light submodule never pulls in heavy siblings).
EXPORTS = {
    "controller": ["Controller", "ControlConfig", "Signal", "read_signal"],
    "loop": ["NodeJob", "run_loop"],
    "clustersim": ["truth_table", "simulate_scenario"],
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, EXPORTS)
