"""Devices a run talks to: the common interface and telemetry sampler (``base``), NVML GPUs
(``nvml``), the emulated GPU (``emulated``), cap setting with a restore that survives kills
(``caps``) and host power from RAPL (``hostpower``). Only ``nvml`` imports pynvml, lazily.
"""

from wattflex import lazy_exports

# Public names, imported on first use (so a light submodule never pulls in heavy siblings).
EXPORTS = {
    "base": ["PowerCapDevice", "TelemetrySampler", "CapError"],
    "caps": ["CapGuard", "restore_from_state_dir"],
    "emulated": ["EmulatedDevice", "run_emulated"],
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, EXPORTS)
