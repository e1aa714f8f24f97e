# The names `wattflex.runs.devices` hands on, loaded on first use (lazy_loader reads this stub).
from .base import CapError, TelemetrySampler
from .caps import CapGuard, CapSignal, restore_from_state_dir
from .clocks import ClockHold, restore_clocks_from_state_dir
from .nvml import open_gpus

__all__ = [
    "CapError",
    "CapGuard",
    "CapSignal",
    "ClockHold",
    "TelemetrySampler",
    "open_gpus",
    "restore_clocks_from_state_dir",
    "restore_from_state_dir",
]
