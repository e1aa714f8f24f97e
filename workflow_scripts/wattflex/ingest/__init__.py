"""Measured sweeps from elsewhere into the pipeline: the one sweep-table reader with its
row checks (``reader``), the Zeus, Perseus and DCGM-capture sources (``sources``), DCGM
parsers (``dcgm``) and what an ingested campaign supports (``summary``).
"""

from wattflex import lazy_exports

# Public names, imported on first use (so a light submodule never pulls in heavy siblings).
EXPORTS = {
    "reader": ["IngestError", "read_table", "validate_sweep"],
    "sources": ["ingest", "ingest_files", "FORMATS"],
    "dcgm": ["read_dcgm_exporter", "read_dcgmi_dmon"],
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, EXPORTS)
