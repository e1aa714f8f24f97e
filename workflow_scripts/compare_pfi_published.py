"""Rule script: the PFI table beside the published Tables 6-7, summary in its sidecar."""

from pathlib import Path

import pandas as pd

from wattflex.analysis import load_published, table6_comparison
from wattflex.labels import backend_label
from wattflex.provenance import provenance, read_parquet, write_csv
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
# the folder of input.published, the published tables this rule reads (rules/common/paths.smk)
paper = Path(smk.params.paper_tables)
pfi = read_parquet(smk.input[0])
tables = [
    t
    for t in (
        load_published(paper, "table6_pfi_h200"),
        load_published(paper, "table7_validation_h200"),
    )
    if t is not None
]
table, summary = table6_comparison(pfi, pd.concat(tables, ignore_index=True) if tables else None)
prov = provenance(params={"paper_tables": smk.params.paper_tables}, inputs=list(smk.input))
# the backends of the runs behind the PFI (comma-joined in its provenance when they differ)
write_csv(
    table,
    smk.output.table6,
    prov,
    summary=summary,
    backend=backend_label((prov.get("backend") or "").split(",")),
)
log.info("table 6 comparison: %s", summary)
