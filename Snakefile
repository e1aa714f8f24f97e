# wattflex: power flexibility of AI training jobs, from power-cap sweeps to PFI.
# Default: the paper's experiment matrix on an emulated H200/H100 (config/config.yaml).
from snakemake.utils import min_version

min_version("9.27")  # pyproject.toml pins the release wattflex.snakemake_internals is checked against


configfile: "config/config.yaml"


include: "rules/common.smk"


wildcard_constraints:  # before any rule that uses them
    group=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    run=RUN_ID_PATTERN,  # wattflex.run_ids


include: "rules/runs.smk"
include: "rules/sweeps.smk"
include: "rules/pfi.smk"
include: "rules/figures.smk"
include: "rules/analysis.smk"
include: "rules/plan.smk"


if FIDELITY:  # generated, emulated campaigns (common.smk)

    include: "rules/fidelity.smk"


include: "rules/allocation.smk"
include: "rules/control.smk"
include: "rules/report.smk"


if SOURCE == "ingest":

    include: "rules/ingest.smk"


rule all:
    input:
        all_outputs(),
    default_target: True


# Snakemake's private scheduler timers, released once the run is over.
from wattflex.snakemake_internals import quiet_console, release_scheduler_timers

# The console shows a progress line per job (the full log in .snakemake/log/ keeps each job's
# block); a dry run (`snakemake -n`, with `--reason`) and --verbose print Snakemake's own.
quiet_console()


onsuccess:
    release_scheduler_timers()


onerror:
    release_scheduler_timers()
