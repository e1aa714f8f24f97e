# Stage 1-2: one training run per (group, cap, repeat), then the steady-state summaries
# of each sweep group's runs.


rule run_at_cap:
    """One run of a sweep group at one power cap (emulated or real)."""
    # Real runs' files are write-protected (run_output in common.smk).
    output:
        telemetry=run_output(f"{RESULTS}/runs/{{group}}/{{run}}/telemetry.parquet"),
        steps=run_output(f"{RESULTS}/runs/{{group}}/{{run}}/steps.parquet"),
        run=run_output(f"{RESULTS}/runs/{{group}}/{{run}}/run.json"),
    params:
        spec=spec_for,
        # The emulator is part of an emulated run's inputs; a real run depends on nothing
        # but its spec, so no library change can ever regenerate it (RUN_CODE is "").
        code=RUN_CODE,
    log:
        f"{LOGS}/runs/{{group}}/{{run}}.log",
    # On SLURM: a job with the group's GPUs and nodes; runs of a group one at a time.
    resources:
        **run_resources(),
    retries: RUN_RETRIES
    conda:
        "../envs/train.yaml"
    script:
        "../workflow_scripts/run_at_cap.py"


# One summary job per sweep group, writing each of its runs' summary.json: a summary's own
# work is ~10 ms, a job's interpreter and imports ~1 s, so one job per run spent most of a
# default campaign's time starting Python. Snakemake rules cannot have a varying number of
# outputs per wildcard, so each group gets its own rule; a new cap reruns its group's
# summaries (ms each), never another group's nor any run.
# {group: its rule}: summaries_<group id, made an identifier>, numbered if two ids collide
# (no other rule's name starts with summaries_).
SUMMARY_RULES = {}
for _i, _gid in enumerate(dict.fromkeys(r["group"] for r in RUNS) if SWEEP == "separate" else []):
    _name = "summaries_" + "".join(c if c.isalnum() else "_" for c in _gid)
    SUMMARY_RULES[_gid] = _name if _name not in SUMMARY_RULES.values() else f"{_name}_{_i}"
RUN_IDS = {gid: [r["run_id"] for r in RUNS if r["group"] == gid] for gid in SUMMARY_RULES}


for _gid, _name in SUMMARY_RULES.items():

    rule:
        """Phases, top-10% (or mean) steady-state aggregates and their SEMs of each run of
        one sweep group, one summary.json per run."""
        name:
            _name
        input:
            telemetry=[f"{RESULTS}/runs/{_gid}/{r}/telemetry.parquet" for r in RUN_IDS[_gid]],
            steps=[f"{RESULTS}/runs/{_gid}/{r}/steps.parquet" for r in RUN_IDS[_gid]],
            run=[f"{RESULTS}/runs/{_gid}/{r}/run.json" for r in RUN_IDS[_gid]],
        output:
            [f"{RESULTS}/runs/{_gid}/{r}/summary.json" for r in RUN_IDS[_gid]],
        params:
            protocol=section("summary"),
            code=script_code("summarize_run"),
        log:
            [f"{LOGS}/summaries/{_gid}/{r}.log" for r in RUN_IDS[_gid]],
        conda:
            "../envs/analysis.yaml"
        localrule: True
        script:
            "../workflow_scripts/summarize_run.py"


rule collect_runs:
    """One row per run: runs.parquet (and a CSV copy for people); runs that failed after
    their last retry are left out and listed in missing_runs.csv."""
    input:
        summary_files(),
    output:
        **with_sidecars(
            parquet=f"{RESULTS}/runs.parquet",
            csv=f"{RESULTS}/runs.csv",
            missing=f"{RESULTS}/missing_runs.csv",
        ),
    params:
        code=script_code("collect_runs"),
    log:
        f"{LOGS}/collect_runs.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/collect_runs.py"
