# What every rule file uses, one file per job (rules/common/): the process and config setup,
# paths, params, SLURM resources, and the real-run guard (the last, once the rest is defined).
include: "common/setup.smk"
include: "common/paths.smk"
include: "common/params.smk"
include: "common/resources.smk"
include: "common/protection.smk"
