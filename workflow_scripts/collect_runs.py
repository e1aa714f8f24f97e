"""Rule script: one row per run -> runs.parquet / runs.csv; failed runs -> missing_runs.csv."""

import sys
from pathlib import Path

import pandas as pd

from wattflex.provenance import provenance, read_json, write_csv, write_parquet
from wattflex.runs import failure_summary, split_failed
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
rows, records = [], []
for path in smk.input:
    row = read_json(path)["summary"]
    row.pop("training_windows_s", None)
    rows.append(row)
    if row.get("status") == "failed":
        # The failure record: run.json beside the summary (a one-run sweep's one level up).
        here = Path(path).parent
        records.append(
            next(
                (str(d / "run.json") for d in (here, here.parent) if (d / "run.json").is_file()),
                str(here),
            )
        )
n_total = len(rows)
rows, missing = split_failed(rows)
if not rows:
    # Every run failed: the campaign has no data. Say why in one paragraph and fail the
    # job (snakemake exits non-zero), rather than go on to analyse nothing.
    log.error("%s", failure_summary(missing, n_total, records))
    sys.exit(1)
runs = pd.DataFrame(rows)
runs = runs.sort_values(
    ["group", "cap_w", *(["clock_mhz"] if "clock_mhz" in runs else []), "repeat"]
).reset_index(drop=True)
backends = sorted(runs["backend"].dropna().unique())
prov = provenance(
    params={"code": smk.params.code},
    inputs=list(smk.input),
    backend=",".join(backends),
    device_model=",".join(sorted(runs["gpu_model"].dropna().unique())),
    n_runs=len(runs),
    n_groups=int(runs["group"].nunique()),
    n_missing=len(missing),
)
write_parquet(runs, smk.output.parquet, prov, missing_runs=missing.to_dict("records"))
write_csv(runs, smk.output.csv, prov)
write_csv(missing, smk.output.missing, prov)
for r in missing.itertuples():
    log.warning(
        "missing run %s/%s (failed after %d attempts): %s", r.group, r.run_id, r.attempts, r.error
    )
if not missing.empty:
    log.warning("%s", failure_summary(missing, n_total, records))
log.info("%d runs of %d groups (%s)", len(runs), runs["group"].nunique(), ", ".join(backends))
