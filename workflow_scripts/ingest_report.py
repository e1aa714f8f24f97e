"""Rule script: the ingest report (status counts, robust vs ratio PFI, which stages apply),
the per-group table, and the figures of an ingested campaign."""

from pathlib import Path

import pandas as pd

from wattflex.ingest import group_table, report_markdown, status_counts
from wattflex.plots import apply_style, curves_figure, robust_vs_ratio_figure, save_figure
from wattflex.provenance import provenance, read_json, read_parquet, write_csv
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
cfg = smk.params.figures
apply_style(cfg)
runs, pfi = read_parquet(smk.input.runs), read_parquet(smk.input.pfi)
summary = read_json(smk.input.summary)["ingest"]
prov = provenance(params=cfg, inputs=list(smk.input), backend="ingest")
campaign = smk.params.campaign

# Curves faceted by GPU model: ingested groups carry no paper cluster worth splitting on.
by_gpu = runs.assign(cluster=runs["gpu_model"].astype(str))
save_figure(curves_figure(by_gpu, normalized=True), smk.output.curves_normalized, prov)
save_figure(curves_figure(by_gpu, normalized=False), smk.output.curves_raw, prov)
save_figure(
    robust_vs_ratio_figure(pfi, f"{campaign}: robust vs ratio PFI, {len(pfi)} groups"),
    smk.output.scatter,
    prov,
)

write_csv(status_counts(pfi), smk.output.counts, prov)
write_csv(group_table(pfi), smk.output.groups, prov)
rel = Path(smk.output.scatter).relative_to(Path(smk.output.report).parent)
rejected = pd.DataFrame(summary["rejected"], columns=["where", "reason"])
text = report_markdown(campaign, summary, rejected, runs, pfi, str(rel))
footer = (
    f"\n---\nwattflex {prov['wattflex_version']}, commit {prov['git_commit']}"
    f"{' (dirty)' if prov['git_dirty'] else ''}, params {prov['params_hash']}\n"
)
Path(smk.output.report).write_text(text + footer)
log.info("ingest report: %d groups, status %s", len(pfi), dict(pfi["status"].value_counts()))
