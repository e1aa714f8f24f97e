"""Where telemetry and cap control come from: ``emulated`` (a virtual H200/H100) and
``nvml`` (real GPUs through nvidia-ml-py). Same interface: read limits and constraints,
set and restore a cap, sample telemetry."""
