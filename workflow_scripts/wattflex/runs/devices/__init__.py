"""Devices a run talks to: the common interface and telemetry sampler (``base``), NVML GPUs
(``nvml``), the emulated GPU (``emulated``), cap setting with a restore that survives kills
(``caps``) and host power from RAPL (``hostpower``). Only ``nvml`` imports pynvml, lazily.
"""

import lazy_loader

# The names this package hands on are those __init__.pyi imports; each is imported from its
# module on first use (PEP 562 ``__getattr__``, lazy_loader), so importing the package (as
# ``wattflex --help`` does) imports none of them.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
