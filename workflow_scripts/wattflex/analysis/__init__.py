"""From runs to findings: cluster tests (``stats``), the PFI predictor from uncapped
telemetry (``predictor``) and the paper's remaining tables beside the published ones (``paper_tables``, ``published``), the
emulated campaign's fidelity to the paper (``fidelity``) and the clock scaling of measured
SM-frequency profiles (``clock_scaling``). The PFI itself is the core module ``wattflex.pfi``,
below both ``analysis`` and ``runs.sweep``, which import it.
"""

import lazy_loader

# The names this package hands on are those __init__.pyi imports; each is imported from its
# module on first use (PEP 562 ``__getattr__``, lazy_loader), so importing the package (as
# ``wattflex --help`` does) imports none of them.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
