"""One-run sweeps: a group's whole cap grid measured inside one training run. ``steady``
decides when power and tokens/s are steady, ``algorithm`` walks the caps (staircase,
adaptive), ``emulated`` and ``real`` drive the emulated and the NVML backends.
"""

import lazy_loader

# The names this package hands on are those __init__.pyi imports; each is imported from its
# module on first use (PEP 562 ``__getattr__``, lazy_loader), so importing the package (as
# ``wattflex --help`` does) imports none of them.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
