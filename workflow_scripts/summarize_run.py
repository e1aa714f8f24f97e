"""Rule script: steady-state summary of one run (wattflex.telemetry.summarize_run)."""
import sys


from wattflex.runs.failures import failed_summary, is_failed
from wattflex.provenance import provenance, write_json
from wattflex.smk import rule_logger
from wattflex.telemetry import RunFileError, SummaryProtocol, read_run_files, summarize_run

smk = snakemake  # noqa: F821
log = rule_logger(smk)
try:  # a damaged file of the run: one line naming it, not a pyarrow traceback
    run, telemetry, steps = read_run_files(smk.input.telemetry, smk.input.steps, smk.input.run, rule="run_at_cap")
except RunFileError as exc:
    log.error("%s", exc)
    print(f"summarize_run: error: {exc}", file=sys.__stderr__)
    sys.exit(1)
if is_failed(run):  # failed on its last attempt: a summary that says so (wattflex.runs.failures)
    log.warning("%s/%s failed after %s attempts: %s", run["group"], run["run_id"], run.get("attempts"), run.get("error"))
    write_json({"summary": failed_summary(run)}, smk.output[0], provenance(params=smk.params.protocol, inputs=list(smk.input)))
    sys.exit(0)
protocol = SummaryProtocol.from_config(smk.params.protocol)
summary = summarize_run(telemetry, steps, protocol)
group = run["spec"]["group"] if "spec" in run else run.get("group_facts", {})
row = {
    "group": run["group"], "run_id": run["run_id"], "cap_w": float(run["cap_w"]), "repeat": int(run["repeat"]),
    "backend": run["provenance"].get("backend", run.get("backend")), "gpu_model": run.get("device_model"),
    **{k: group.get(k) for k in ("gpus", "model", "architecture", "task", "cluster", "set", "matches",
                                 "seq_len", "batch", "ep", "compile", "grad_checkpointing", "lora_rank")},
    **summary,
}
log.info("%s/%s: %.0f W, %.0f tokens/s", row["group"], row["run_id"], row["power_w"], row["tokens_per_s"])
write_json({"summary": row}, smk.output[0],
           provenance(params=smk.params.protocol, inputs=list(smk.input), backend=row["backend"],
                      device_model=row["gpu_model"]))
