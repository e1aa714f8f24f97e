"""Where runs come from: the emulated backend (``emulator``: DVFS power model + roofline of
the training step; ``emulator.device``), the real one (``training`` harness under torchrun,
``devices.nvml``, cap control with guaranteed restore in ``devices.caps``, ``real_run``), the
one-run sweeps (``sweep``), the run-directory writer (``runner``) and failure records.
"""
