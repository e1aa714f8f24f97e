"""From runs to findings: cluster tests (``stats``), the PFI predictor from uncapped
telemetry (``predictor``) and the paper's remaining tables beside the published ones (``paper_tables``, ``published``), the
emulated campaign's fidelity to the paper (``fidelity``) and the clock scaling of measured
SM-frequency profiles (``clock_scaling``). The PFI itself is the core module ``wattflex.pfi``,
below both ``analysis`` and ``runs.sweep``, which import it.
"""
