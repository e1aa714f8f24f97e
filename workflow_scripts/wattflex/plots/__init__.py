"""Every figure wattflex draws (matplotlib, Agg), one module per stage plus the shared
``style`` (backend labels, cluster colours, each policy's look). Only this package imports
matplotlib, so a plot change reruns figure rules and the report, never a simulation.
"""

from wattflex import lazy_exports

# Public names, imported on first use (so a light submodule never pulls in heavy siblings).
EXPORTS = {
    "style": ["backend_label", "label_backend", "apply_style"],
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, EXPORTS)
