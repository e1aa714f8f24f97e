# The memory and time plan of every group (wattflex.runs.plan; docs/resource-plan.md). A
# real campaign whose groups cannot fit is refused when the config is read (wattflex.config
# check_plan); the planned start-up is in each run's SLURM time limit (common.smk run_minutes).
from wattflex.runs.plan import GROUP_KEYS as PLAN_GROUP_KEYS


rule resource_plan:
    """tables/resource_plan.csv: bytes per GPU, host RAM per node, start-up, checkpoint, fits."""
    input:
        # the model catalogue the plan sizes (its provenance names it; params hold the facts used)
        catalog=workflow_file(config["models_catalog"]),
    output:
        **with_sidecars(table=f"{RESULTS}/tables/resource_plan.csv"),
    params:
        backend=config["backend"],
        groups=canonical([{k: g[k] for k in PLAN_GROUP_KEYS if k in g} for g in GROUPS.values()]),
        catalog=canonical({g["model"]: config["_catalog"][g["model"]] for g in GROUPS.values()}),
        cuda=section("cuda"),
        checkpoint_at_s=config["run"]["checkpoint_at_s"],
        code=script_code("resource_plan"),
    log:
        f"{LOGS}/resource_plan.log",
    localrule: True
    conda:
        "../envs/analysis.yaml"
    script:
        "../workflow_scripts/resource_plan.py"
