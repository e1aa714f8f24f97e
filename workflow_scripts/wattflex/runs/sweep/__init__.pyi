# The names `wattflex.runs.sweep` hands on, loaded on first use (lazy_loader reads this stub).
from .algorithm import staircase
from .emulated import run_sweep, write_sweep_run
from .real import write_real_sweep_run
from .steady import SteadyCriteria, SweepSettings, cap_rows, cap_slice, summary_row

__all__ = [
    "SteadyCriteria",
    "SweepSettings",
    "cap_rows",
    "cap_slice",
    "run_sweep",
    "staircase",
    "summary_row",
    "write_real_sweep_run",
    "write_sweep_run",
]
