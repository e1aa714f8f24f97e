"""Rule script: one run at one cap (see wattflex.runs.runner). The last attempt of a run that
keeps failing leaves a failure record instead (wattflex.runs.failures), so the sweep goes on."""

import signal
import sys
import time
from pathlib import Path

from wattflex.runs import RunSpec, run_at_cap
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
# scancel and SLURM's time limit send SIGTERM: unwind (temp files, caps) instead of dying.
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
attempt, attempts = int(smk.resources.run_attempt), int(smk.resources.run_attempts)
try:
    spec = RunSpec.of(smk.params.spec, backend=None)  # parsed once; a bad spec is a failed attempt
    clock = spec.clock_mhz
    setpoint = f"{spec.cap_w} W" + (
        f", SM clock locked at {clock:g} MHz" if clock is not None else ""
    )
    log.info(
        "run %s/%s at %s on the %s backend (attempt %d of %d)",
        spec.group_id,
        spec.run_id,
        setpoint,
        spec.backend,
        attempt,
        attempts,
    )
    gap_s = float(spec.run["gap_s"])
    if spec.backend != "emulated" and gap_s > 0:
        log.info("GPUs idle for run.gap_s = %g s before the run (paper protocol)", gap_s)
        time.sleep(gap_s)
    run_at_cap(spec, Path(smk.output.run).parent)
except Exception as exc:
    if attempt < attempts:
        raise
    log.exception(
        "last attempt failed; recording the run as failed (delete its directory to retry)"
    )
    from wattflex.runs import record_failed_run  # only ever needed here

    record_failed_run(smk.params.spec, Path(smk.output.run).parent, exc, attempt)
log.info("done")
