# wattflex: power flexibility of AI training jobs, from power-cap sweeps to PFI.
# Default: the paper's experiment matrix on an emulated H200/H100 (config/config.yaml).
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/runs.smk"
include: "rules/pfi.smk"
include: "rules/figures.smk"
include: "rules/analysis.smk"


rule all:
    input:
        all_outputs(CAMPAIGN),
    default_target: True
