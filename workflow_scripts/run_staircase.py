"""Rule script: a group's whole cap sweep inside one run (wattflex.runs.sweep.staircase), with the
original power limit restored on every exit (the controller's guard handles SIGTERM too)."""
from pathlib import Path

from wattflex.smk import rule_logger
from wattflex.runs.sweep.staircase import write_sweep_run

smk = snakemake  # noqa: F821
log = rule_logger(smk)
spec = smk.params.spec
log.info("%s sweep of %s over caps %s W on the %s backend", spec["sweep"], spec["group"]["id"],
         ", ".join(f"{c:g}" for c in spec["caps"]), spec["backend"])
write_sweep_run(spec, Path(smk.output.run).parent)
log.info("done")
