"""Splitting a cluster-wide power cut across jobs: per-job throughput-vs-power curves
(``curves``), the one policy registry (``policies``), the policies' algorithms
(``allocator``), the exact oracle (``oracle``) and the 100-job workload simulation (``simulate``).
"""

from wattflex import lazy_exports

# Public names, imported on first use (so a light submodule never pulls in heavy siblings).
EXPORTS = {
    "curves": ["Curves", "curves_from_points", "curves_from_runs"],
    "policies": ["REGISTRY", "POLICIES"],
    "allocator": ["allocate", "allocate_table", "water_fill", "InfeasibleBudget"],
    "simulate": ["SimulationConfig", "group_table"],
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, EXPORTS)
