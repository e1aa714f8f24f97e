"""Rule script: steady-state summaries of one sweep group's runs (wattflex.telemetry.summarize_run),
one summary.json and one log per run. One job per group: the interpreter and the imports are
paid once per group, not once per ~10 ms summary."""

import sys
from types import SimpleNamespace

from wattflex.provenance import provenance, write_json
from wattflex.runs import failed_summary, is_failed, unsummarised_summary
from wattflex.smk import rule_logger
from wattflex.telemetry import (
    NoSteadyState,
    RunFileError,
    SummaryProtocol,
    read_run_files,
    summarize_run,
)
from wattflex.vocabulary import RUN_GROUP_FIELDS

smk = snakemake  # noqa: F821
protocol = SummaryProtocol.from_config(smk.params.protocol)


def summarize(inputs: list[str], output: str, log_path: str) -> None:
    """One run's summary.json (inputs: its telemetry, steps and run record), logging to its log."""
    log = rule_logger(SimpleNamespace(log=[log_path]))
    try:  # a damaged file of the run: one line naming it, not a pyarrow traceback
        run, telemetry, steps = read_run_files(*inputs)
    except RunFileError as exc:
        log.error("%s", exc)
        print(f"summarize_run: error: {exc}", file=sys.__stderr__)
        sys.exit(1)
    if is_failed(
        run
    ):  # failed on its last attempt: a summary that says so (wattflex.runs.failures)
        log.warning(
            "%s/%s failed after %s attempts: %s",
            run["group"],
            run["run_id"],
            run.get("attempts"),
            run.get("error"),
        )
        write_json(
            {"summary": failed_summary(run)},
            output,
            provenance(params=smk.params.protocol, inputs=inputs),
        )
        return
    try:
        summary = summarize_run(telemetry, steps, protocol)
    except (
        NoSteadyState
    ) as exc:  # sound files, nothing to summarise: recorded, the group's other runs go on
        row = unsummarised_summary(run, str(exc))
        log.warning("%s/%s: %s", row["group"], row["run_id"], row["error"])
        write_json(
            {"summary": row},
            output,
            provenance(params=smk.params.protocol, inputs=inputs, backend=row["backend"]),
        )
        return
    group = run["spec"]["group"] if "spec" in run else run.get("group_facts", {})
    row = {
        "group": run["group"],
        "run_id": run["run_id"],
        "cap_w": float(run["cap_w"]),
        "repeat": int(run["repeat"]),
        "backend": run["provenance"].get("backend", run.get("backend")),
        "gpu_model": run.get("device_model"),
        # nvml | dcgm | steps on cuda runs (run.json), the backend's name where it made the trace itself
        "telemetry_source": (run.get("telemetry") or {}).get("source") or run.get("backend"),
        **{k: group.get(k) for k in RUN_GROUP_FIELDS},
        **summary,
        # a clock run's setpoint (knob: clock); a cap run's row has no knob or clock_mhz
        **(
            {"knob": "clock", "clock_mhz": float(run["clock_mhz"])}
            if run.get("knob") == "clock"
            else {}
        ),
    }
    log.info(
        "%s/%s: %.0f W, %.0f tokens/s",
        row["group"],
        row["run_id"],
        row["power_w"],
        row["tokens_per_s"],
    )
    write_json(
        {"summary": row},
        output,
        provenance(
            params=smk.params.protocol,
            inputs=inputs,
            backend=row["backend"],
            device_model=row["gpu_model"],
        ),
    )


for *inputs, output, log_path in zip(
    smk.input.telemetry, smk.input.steps, smk.input.run, smk.output, smk.log
):
    summarize(inputs, output, log_path)
