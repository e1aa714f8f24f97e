"""One-run sweeps: a group's whole cap grid measured inside one training run. ``steady``
decides when power and tokens/s are steady, ``algorithm`` walks the caps (staircase,
adaptive), ``emulated`` and ``real`` drive the emulated and the NVML backends.
"""
