"""Every figure wattflex draws (matplotlib, Agg), one module per stage plus the shared
``style`` (backend labels, cluster colours, each policy's look). Only this package imports
matplotlib, so a plot change reruns figure rules and the report, never a simulation.
"""

import lazy_loader

# The names this package hands on are those __init__.pyi imports; each is imported from its
# module on first use (PEP 562 ``__getattr__``, lazy_loader), so importing the package (as
# ``wattflex --help`` does) imports none of them.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
