"""Rule script: one run at one cap (see wattflex.runner)."""
from pathlib import Path

from wattflex.runner import run_at_cap
from wattflex.smk import rule_logger

log = rule_logger(snakemake)  # noqa: F821
spec = snakemake.params.spec  # noqa: F821
log.info("run %s/%s at %s W on the %s backend", spec["group"]["id"], spec["run_id"], spec["cap_w"], spec["backend"])
run_at_cap(spec, Path(snakemake.output.run).parent)  # noqa: F821
log.info("done")
