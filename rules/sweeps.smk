# Stages 1-2 in one run per group (`sweep: staircase | adaptive`, wattflex.runs.sweep): the
# whole cap grid of a group is measured inside one training run, start-up paid once; each
# cap then gets a summary.json in the contract of summarize_run, so collect_runs and all
# that follows are unchanged (common.smk's summary_files() lists these in those modes).


wildcard_constraints:
    mode="staircase|adaptive",



rule run_staircase:
    """A group's whole power-cap sweep in one training run (staircase or adaptive grid)."""
    output:
        telemetry=run_output(f"{RESULTS}/runs/{{group}}/{{mode}}/telemetry.parquet"),
        steps=run_output(f"{RESULTS}/runs/{{group}}/{{mode}}/steps.parquet"),
        run=run_output(f"{RESULTS}/runs/{{group}}/{{mode}}/run.json"),
    params:
        spec=lambda wc: canonical(sweep_spec(config, wc.group, wc.mode)),
        # As for run_at_cap: an emulated run depends on the physics and the controller, a
        # real one on its spec alone.
        code=script_code("run_staircase")
        if BACKEND == "emulated"
        else "",
    log:
        f"{LOGS}/runs/{{group}}/{{mode}}.log",
    resources:
        **{**run_resources(), "runtime": sweep_minutes},
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/run_staircase.py"


rule summarize_staircase:
    """One cap of a one-run sweep: its steady-state summary and its stretch of the run."""
    input:
        telemetry=rules.run_staircase.output.telemetry,
        steps=rules.run_staircase.output.steps,
        run=rules.run_staircase.output.run,
    output:
        summary=f"{RESULTS}/runs/{{group}}/{{mode}}/{{run}}/summary.json",
        telemetry=f"{RESULTS}/runs/{{group}}/{{mode}}/{{run}}/telemetry.parquet",
        steps=f"{RESULTS}/runs/{{group}}/{{mode}}/{{run}}/steps.parquet",
    params:
        protocol=section("summary"),
        code=script_code("summarize_staircase"),
    log:
        f"{LOGS}/summaries/{{group}}/{{mode}}/{{run}}.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/summarize_staircase.py"
