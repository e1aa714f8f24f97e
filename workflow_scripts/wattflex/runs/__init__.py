"""Where runs come from: the emulated backend (``emulator``: DVFS power model + roofline of
the training step; ``devices.emulated``), the real one (``training`` harness under torchrun,
``devices.nvml``, cap control with guaranteed restore in ``devices.caps``, ``real_run``), the
one-run sweeps (``sweep``), the run-directory writer (``runner``) and failure records.
"""

from wattflex import lazy_exports

# Public names, imported on first use (so a light submodule never pulls in heavy siblings).
EXPORTS = {
    "runner": ["run_at_cap", "write_run_files"],
    "emulator": ["JobSpec", "job_at_cap"],
    "failures": ["record_failed_run", "is_failed"],
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, EXPORTS)
