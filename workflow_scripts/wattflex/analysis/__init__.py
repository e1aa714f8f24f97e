"""From runs to findings: the Power Flexibility Index with CIs and diagnostics (``pfi``),
cluster tests (``stats``), the PFI predictor from uncapped telemetry (``predictor``) and the
paper's remaining tables beside the published ones (``paper_tables``, ``published``), the
emulated campaign's fidelity to the paper (``fidelity``) and the clock scaling of measured
SM-frequency profiles (``clock_scaling``).
"""

from wattflex import lazy_exports

# Public names, imported on first use (so a light submodule never pulls in heavy siblings).
EXPORTS = {
    "pfi": ["pfi_table", "pfi_ratio", "pfi_area", "pfi_elasticity"],
    "stats": ["kruskal_dunn", "cluster_tests_table"],
    "predictor": ["fit_model", "predict", "ablation"],
    "published": ["load_published"],
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, EXPORTS)
