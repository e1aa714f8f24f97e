# The names `wattflex.ingest` hands on, loaded on first use (lazy_loader reads this stub).
from .dcgm import DcgmFormatError
from .reader import IngestError, IngestResult, read_typed_table
from .sources import config_options, ingest, ingest_files
from .summary import group_table, report_markdown, status_counts

__all__ = [
    "DcgmFormatError",
    "IngestError",
    "IngestResult",
    "config_options",
    "group_table",
    "ingest",
    "ingest_files",
    "read_typed_table",
    "report_markdown",
    "status_counts",
]
