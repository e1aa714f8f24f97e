"""Measured sweeps from elsewhere into the pipeline: the one sweep-table reader with its
row checks (``reader``), the Zeus, Perseus and DCGM-capture sources (``sources``), DCGM
parsers (``dcgm``) and what an ingested campaign supports (``summary``).
"""

import lazy_loader

# The names this package hands on are those __init__.pyi imports; each is imported from its
# module on first use (PEP 562 ``__getattr__``, lazy_loader), so importing the package (as
# ``wattflex --help`` does) imports none of them.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
