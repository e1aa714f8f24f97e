"""Rule script: one row per run -> runs.parquet / runs.csv; failed runs -> missing_runs.csv."""
import pandas as pd

from wattflex.runs.failures import split_failed
from wattflex.provenance import provenance, read_json, write_csv, write_parquet
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
rows = []
for path in smk.input:
    row = read_json(path)["summary"]
    row.pop("training_windows_s", None)
    rows.append(row)
rows, missing = split_failed(rows)
if not rows:
    raise ValueError(f"no run succeeded; failed: {', '.join(missing['group'] + '/' + missing['run_id'])}")
runs = pd.DataFrame(rows).sort_values(["group", "cap_w", "repeat"]).reset_index(drop=True)
backends = sorted(runs["backend"].dropna().unique())
prov = provenance(params={"code": smk.params.code}, inputs=list(smk.input), backend=",".join(backends), device_model=",".join(sorted(runs["gpu_model"].dropna().unique())),
                  n_runs=len(runs), n_groups=int(runs["group"].nunique()), n_missing=len(missing))
write_parquet(runs, smk.output.parquet, prov, missing_runs=missing.to_dict("records"))
write_csv(runs, smk.output.csv, prov)
write_csv(missing, smk.output.missing, prov)
for r in missing.itertuples():
    log.warning("missing run %s/%s (failed after %d attempts): %s", r.group, r.run_id, r.attempts, r.error)
log.info("%d runs of %d groups (%s)", len(runs), runs["group"].nunique(), ", ".join(backends))
