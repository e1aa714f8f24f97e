"""Rule script: the campaign's self-contained HTML reproduction report (wattflex.report)."""

from pathlib import Path

from wattflex.provenance import provenance
from wattflex.report import write_report
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
# the folder of input.published, the published tables this rule reads (rules/common/paths.smk)
paper = Path(smk.params.paper_tables)
files = list(smk.input.products)  # input.published: the tables shown beside them
prov = provenance(params=smk.params.shown_config, inputs=files)
statuses = write_report(
    files, smk.output.html, smk.params.campaign, smk.params.shown_config, paper, prov
)
for key, status in statuses.items():
    log.info("section %s: %s", key, status)
