# Stage 1-2: one training run per (group, cap, repeat), then its steady-state summary.


rule run_at_cap:
    """One run of a sweep group at one power cap (emulated or real)."""
    # Real runs' files are write-protected (run_output in common.smk).
    output:
        telemetry=run_output(f"results/{{campaign}}/runs/{{group}}/{{run}}/telemetry.parquet"),
        steps=run_output(f"results/{{campaign}}/runs/{{group}}/{{run}}/steps.parquet"),
        run=run_output(f"results/{{campaign}}/runs/{{group}}/{{run}}/run.json"),
    params:
        spec=spec_for,
        # The emulator is part of an emulated run's inputs; a real run depends on nothing
        # but its spec, so no library change can ever regenerate it (RUN_CODE is "").
        code=RUN_CODE,
    log:
        "logs/{campaign}/runs/{group}/{run}.log",
    # On SLURM: a job with the group's GPUs and nodes; runs of a group one at a time.
    resources:
        **run_resources(),
    retries: RUN_RETRIES
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/run_at_cap.py"


rule summarize_run:
    """Phases, top-10% (or mean) steady-state aggregates and their SEMs for one run."""
    input:
        telemetry=rules.run_at_cap.output.telemetry,
        steps=rules.run_at_cap.output.steps,
        run=rules.run_at_cap.output.run,
    output:
        f"results/{{campaign}}/runs/{{group}}/{{run}}/summary.json",
    params:
        protocol=section("summary"),
        code=script_code("summarize_run"),
    log:
        "logs/{campaign}/summaries/{group}/{run}.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/summarize_run.py"


rule collect_runs:
    """One row per run: runs.parquet (and a CSV copy for people); runs that failed after
    their last retry are left out and listed in missing_runs.csv."""
    input:
        lambda wc: summary_files(wc.campaign),
    output:
        **with_sidecars(
            parquet=f"results/{{campaign}}/runs.parquet",
            csv=f"results/{{campaign}}/runs.csv",
            missing=f"results/{{campaign}}/missing_runs.csv",
        ),
    params:
        code=script_code("collect_runs"),
    log:
        "logs/{campaign}/collect_runs.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/collect_runs.py"
