"""Rule script: PFI per sweep group from runs.parquet (wattflex.pfi.pfi_table)."""

import pandas as pd

from wattflex.pfi import clock_pfi_table, pfi_table
from wattflex.provenance import (
    provenance,
    read_parquet,
    read_parquet_meta,
    write_csv,
    write_parquet,
)
from wattflex.runs import MISSING_COLUMNS, annotate_missing, expected_uncapped
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
cfg = smk.params.pfi
runs = read_parquet(smk.input[0])
# Runs that failed for good (wattflex.runs.failures): named per group; a missing uncapped run flagged.
missing = pd.DataFrame(
    read_parquet_meta(smk.input[0]).get("missing_runs", []), columns=MISSING_COLUMNS
)
runs["expected_uncapped_cap_w"] = expected_uncapped(runs, missing)
kw = dict(
    throughput_col="tokens_per_s",
    power_sem_col="power_w_sem",
    throughput_sem_col="tokens_per_s_sem",
    mc_samples=int(cfg["mc_samples"]),
    ci=float(cfg["ci"]),
    seed=int(cfg["seed"]),
)
clock_rows = runs["knob"].eq("clock") if "knob" in runs else pd.Series(False, index=runs.index)
table = pfi_table(runs[~clock_rows], uncapped_cap_w="expected_uncapped_cap_w", **kw)
# knob: clock groups (wattflex.pfi.clock_pfi_table); a cap-only campaign's table has no knob column
if clock_rows.any():
    table = pd.concat(
        [table.assign(knob="cap"), clock_pfi_table(runs[clock_rows], **kw)], ignore_index=True
    )
table = annotate_missing(table, missing)
meta = read_parquet_meta(smk.input[0])["provenance"]
prov = provenance(
    params=cfg,
    inputs=list(smk.input),
    backend=meta.get("backend"),
    device_model=meta.get("device_model"),
)
write_parquet(table, smk.output.parquet, prov)
write_csv(table, smk.output.csv, prov)
for status, n in table["status"].value_counts().items():
    log.info("status %s: %d groups", status, n)
