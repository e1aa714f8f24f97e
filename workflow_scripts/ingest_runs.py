"""Rule script: measured sweeps / DCGM captures -> runs.parquet (wattflex.ingest.sources)."""

import sys

from wattflex.ingest import DcgmFormatError, IngestError, config_options, ingest_files
from wattflex.provenance import provenance, write_csv, write_json, write_parquet
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
cfg = smk.params.ingest
try:  # bad data: one line naming the file (and line) in the log and on the terminal, no traceback
    result = ingest_files(cfg["format"], list(smk.input), **config_options(cfg, smk.params.summary))
except (IngestError, DcgmFormatError) as exc:
    log.error("%s", exc)
    print(f"ingest_runs: error: {exc}", file=sys.__stderr__)
    sys.exit(1)
runs = result.runs
prov = provenance(
    params=cfg,
    inputs=list(smk.input),
    backend="ingest",
    device_model=",".join(sorted(runs["gpu_model"].dropna().astype(str).unique())),
    ingest_format=cfg["format"],
    n_runs=len(runs),
    n_groups=int(runs["group"].nunique()),
)
write_parquet(runs, smk.output.parquet, prov)
write_csv(runs, smk.output.csv, prov)
write_csv(result.rejected, smk.output.rejected, prov)
write_json(
    {
        "ingest": {
            "format": cfg["format"],
            **result.summary(),
            "rejected": result.rejected.to_dict("records"),
        }
    },
    smk.output.summary,
    prov,
)
log.info(
    "%d runs of %d groups from %d file(s); %d row(s) rejected",
    len(runs),
    runs["group"].nunique(),
    len(result.inputs),
    len(result.rejected),
)
for where, reason in result.rejected.itertuples(index=False):
    log.warning("rejected %s: %s", where, reason)
