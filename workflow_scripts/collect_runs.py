"""Rule script: one row per run -> runs.parquet / runs.csv."""
import pandas as pd

from wattflex.provenance import provenance, read_json, write_csv, write_parquet
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
rows = []
for path in smk.input:
    row = read_json(path)["summary"]
    row.pop("training_windows_s", None)
    rows.append(row)
runs = pd.DataFrame(rows).sort_values(["group", "cap_w", "repeat"]).reset_index(drop=True)
backends = sorted(runs["backend"].dropna().unique())
prov = provenance(inputs=[], backend=",".join(backends), device_model=",".join(sorted(runs["gpu_model"].dropna().unique())),
                  n_runs=len(runs), n_groups=int(runs["group"].nunique()))
write_parquet(runs, smk.output.parquet, prov)
write_csv(runs, smk.output.csv, prov)
log.info("%d runs of %d groups (%s)", len(runs), runs["group"].nunique(), ", ".join(backends))
