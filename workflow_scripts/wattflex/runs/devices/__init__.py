"""Devices a run talks to: the common interface and telemetry sampler (``base``), NVML GPUs
(``nvml``), the emulated GPU (``emulated``), cap setting with a restore that survives kills
(``caps``) and host power from RAPL (``hostpower``). Only ``nvml`` imports pynvml, lazily.
"""
