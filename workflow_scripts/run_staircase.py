"""Rule script: a group's whole cap sweep inside one run (wattflex.runs.sweep.emulated, or
wattflex.runs.sweep.real on the cuda backend), with the original power limit restored on
every exit (the controller's guard handles SIGTERM too)."""

from pathlib import Path

from wattflex.runs import RunSpec
from wattflex.runs.sweep import write_sweep_run
from wattflex.smk import rule_logger

smk = snakemake  # noqa: F821
log = rule_logger(smk)
spec = RunSpec.of(smk.params.spec, backend=None)  # parsed once
log.info(
    "%s sweep of %s over caps %s W on the %s backend",
    spec.sweep,
    spec.group_id,
    ", ".join(f"{c:g}" for c in spec.caps),
    spec.backend,
)
if spec.backend == "cuda":
    # Only here: an emulated sweep never loads the real-GPU controller.
    from wattflex.runs.sweep import write_real_sweep_run

    write_real_sweep_run(spec, Path(smk.output.run).parent)
else:
    write_sweep_run(spec, Path(smk.output.run).parent)
log.info("done")
