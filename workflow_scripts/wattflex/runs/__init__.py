"""Where runs come from: the emulated backend (``emulator``: DVFS power model + roofline of
the training step; ``emulator.device``), the real one (``training`` harness under torchrun,
``devices.nvml``, cap control with guaranteed restore in ``devices.caps``, ``real_run``), the
one-run sweeps (``sweep``), the run-directory writer (``runner``) and failure records.
"""

import lazy_loader

# The names this package hands on are those __init__.pyi imports; each is imported from its
# module on first use (PEP 562 ``__getattr__``, lazy_loader), so importing the package (as
# ``wattflex --help`` does) imports none of them.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
