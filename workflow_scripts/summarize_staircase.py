"""Rule script: one cap of a one-run sweep -> its summary.json (the runs.parquet contract of
summarize_run) and the run's stretches at that cap (telemetry/steps, like a separate run's)."""

import sys

from wattflex.provenance import provenance, write_json, write_parquet
from wattflex.run_ids import parse_run_id
from wattflex.runs.sweep import cap_rows, cap_slice, summary_row
from wattflex.smk import rule_logger
from wattflex.telemetry import RunFileError, SummaryProtocol, read_run_files

smk = snakemake  # noqa: F821
log = rule_logger(smk)
try:  # a damaged file of the sweep run: one line naming it, not a pyarrow traceback
    run, telemetry, steps = read_run_files(
        smk.input.telemetry, smk.input.steps, smk.input.run, run_keys=("group", "sweep_mode")
    )
except RunFileError as exc:
    log.error("%s", exc)
    print(f"summarize_staircase: error: {exc}", file=sys.__stderr__)
    sys.exit(1)
cap_w, _ = parse_run_id(smk.wildcards.run)
summary = cap_rows(
    telemetry, steps, run, SummaryProtocol.from_config(smk.params.protocol), caps=[cap_w]
)[cap_w]
row = summary_row(run, cap_w, summary)
log.info(
    "%s/%s at %g W: %.0f W, %.0f tokens/s (%s)",
    row["group"],
    run["sweep_mode"],
    cap_w,
    row["power_w"],
    row["tokens_per_s"],
    row["steady_reason"],
)
prov = provenance(
    params=smk.params.protocol,
    inputs=list(smk.input),
    backend=row["backend"],
    device_model=row["gpu_model"],
)
write_json({"summary": row}, smk.output.summary, prov)
tel_slice, steps_slice = cap_slice(telemetry, steps, run, cap_w)
write_parquet(
    tel_slice,
    smk.output.telemetry,
    prov,
    run_id=row["run_id"],
    group=row["group"],
    sweep_mode=run["sweep_mode"],
)
write_parquet(
    steps_slice,
    smk.output.steps,
    prov,
    run_id=row["run_id"],
    group=row["group"],
    sweep_mode=run["sweep_mode"],
)
