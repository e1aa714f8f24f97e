# Stage 8 (beyond the paper): closed-loop control under a grid curtailment signal. An
# emulated cluster runs jobs drawn from the campaign's groups; every control policy
# (wattflex.ops.controller) follows each scenario's budget signal beside an offline oracle and an
# uncapped reference (wattflex.ops.clustersim). Needs common.smk and the predictor's model.json.
# Without a `control:` section in the config there are no scenarios and nothing here runs.

CONTROL = section("control")
CONTROL_DIR = f"{RESULTS}/control"
CONTROL_SCENARIOS = list(CONTROL["scenarios"])
CONTROL_GROUPS = canonical([{**g, "model_facts": config["_catalog"][g["model"]]} for g in GROUPS.values()
                            if g["set"] == CONTROL["groups_set"]])


rule control_truth:
    """Each group's job power, tokens/s and activity at every cap of the control grid."""
    output:
        truth=f"{CONTROL_DIR}/truth.parquet",
    params:
        groups=CONTROL_GROUPS,
        seed=config["seed"],
        cap_step_w=CONTROL["cap_step_w"],
        # the campaign's emulator calibration (emulator.calibration), as its runs have it
        calibration=config.get("_emulator_calibration"),
        code=script_code("control_truth"),
    log:
        f"{LOGS}/control_truth.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/control_truth.py"


rule simulate_control:
    """One scenario: cluster power vs budget, violations and tokens for every policy."""
    input:
        truth=rules.control_truth.output.truth,
        model=f"{RESULTS}/predictor/model.json",
        signal=lambda wc: workflow_file(CONTROL["scenarios"][wc.scenario]["signal"]),
    output:
        **with_sidecars(
            summary=f"{CONTROL_DIR}/{{scenario}}/summary.csv",
            jobs=f"{CONTROL_DIR}/{{scenario}}/jobs.csv",
            mv=f"{CONTROL_DIR}/{{scenario}}/mv.csv",
            mv_intervals=f"{CONTROL_DIR}/{{scenario}}/mv_intervals.csv",
        ),
        timeseries=f"{CONTROL_DIR}/{{scenario}}/timeseries.parquet",
    params:
        # only this scenario's settings: changing another scenario reruns nothing here
        control=lambda wc: {**{k: v for k, v in CONTROL.items() if k != "scenarios"},
                            "scenario": CONTROL["scenarios"][wc.scenario]},
        code=script_code("simulate_control"),
    wildcard_constraints:
        scenario=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    log:
        f"{LOGS}/simulate_control_{{scenario}}.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/simulate_control.py"


rule control_figures:
    """Per scenario: power vs budget, tokens lost per policy, the first event's M&V; all
    summaries and M&V records in one table each."""
    input:
        summaries=expand(f"{CONTROL_DIR}/{{scenario}}/summary.csv", scenario=CONTROL_SCENARIOS, allow_missing=True),
        timeseries=expand(f"{CONTROL_DIR}/{{scenario}}/timeseries.parquet", scenario=CONTROL_SCENARIOS,
                          allow_missing=True),
        mv=expand(f"{CONTROL_DIR}/{{scenario}}/mv.csv", scenario=CONTROL_SCENARIOS, allow_missing=True),
    output:
        **with_sidecars(summary=f"{CONTROL_DIR}/summary.csv", mv_table=f"{CONTROL_DIR}/mv.csv"),
        power=[figure_output(p) for p in expand(f"{CONTROL_DIR}/{{scenario}}/power_vs_budget.png",
                                                scenario=CONTROL_SCENARIOS, allow_missing=True)],
        tokens=[figure_output(p) for p in expand(f"{CONTROL_DIR}/{{scenario}}/tokens_lost.png",
                                                 scenario=CONTROL_SCENARIOS, allow_missing=True)],
        mv=[figure_output(p) for p in expand(f"{CONTROL_DIR}/{{scenario}}/mv.png",
                                             scenario=CONTROL_SCENARIOS, allow_missing=True)],
    params:
        scenarios=CONTROL_SCENARIOS,
        figures=section("figures"),
        code=script_code("control_figures"),
    log:
        f"{LOGS}/control_figures.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/control_figures.py"


rule offer:
    """The flexibility offer of the campaign's jobs (one per sweep group, wattflex.ops.services.offer):
    kW sheddable at <= 10/25/50 % throughput loss per job, held for 4 h (`wattflex offer`
    chooses others), and the curve behind it. A final product (common.smk FINAL_RULES), shown
    in the report's offer section."""
    input:
        runs=f"{RESULTS}/runs.parquet",
    output:
        **with_sidecars(table=f"{RESULTS}/offer/offer.csv"),
        figure=figure_output(f"{RESULTS}/offer/offer.png"),
    params:
        offer={},
        figures=section("figures"),
        code=script_code("offer"),
    log:
        f"{LOGS}/offer.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/offer.py"


rule flexibility_statement:
    """The site's flexibility statement (wattflex.ops.services.statement): kW shed against depth with
    5-95 % ranges, tokens lost per event and per year, response and ramp from the controlled
    events' M&V, meter baselines against the true load, as tables, OpenADR 3 objects and one
    page an operator hands over. A final product (FINAL_RULES in rules/common/paths.smk)."""
    input:
        runs=f"{RESULTS}/runs.parquet",
        plan=f"{RESULTS}/tables/resource_plan.csv",
        **({"mv": f"{CONTROL_DIR}/mv.csv"} if CONTROL_SCENARIOS else {}),
    output:
        **with_sidecars(
            shed=f"{RESULTS}/statement/shed.csv",
            events=f"{RESULTS}/statement/events.csv",
            calendar=f"{RESULTS}/statement/calendar.csv",
            response=f"{RESULTS}/statement/response.csv",
            notice=f"{RESULTS}/statement/notice.csv",
            baselines=f"{RESULTS}/statement/baselines.csv",
            baseline_days=f"{RESULTS}/statement/baseline_days.csv",
            knobs=f"{RESULTS}/statement/knobs.csv",
            knob_jobs=f"{RESULTS}/statement/knob_jobs.csv",
        ),
        program=f"{RESULTS}/statement/openadr3_program.json",
        program_meta=f"{RESULTS}/statement/openadr3_program.json.meta.json",
        report=f"{RESULTS}/statement/openadr3_report.json",
        report_meta=f"{RESULTS}/statement/openadr3_report.json.meta.json",
        page=f"{RESULTS}/statement/statement.md",
        page_meta=f"{RESULTS}/statement/statement.md.meta.json",
        figure=figure_output(f"{RESULTS}/statement/statement.png"),
    params:
        statement=section("statement"),
        # only the allocation study's site (StatementSettings.from_config): its other settings rerun nothing here
        allocation=canonical({"jobs_per_workload": config["allocation"]["jobs_per_workload"],
                              "headline": {"mix": config["allocation"]["headline"]["mix"]},
                              "production": {"pretraining_fraction": config["allocation"]["production"]["pretraining_fraction"]},
                              "seed": config["allocation"]["seed"], "groups_set": config["allocation"]["groups_set"]}),
        cluster=canonical(CONTROL["cluster"]),
        campaign=config["campaign"],
        figures=section("figures"),
        code=script_code("flexibility_statement"),
    log:
        f"{LOGS}/flexibility_statement.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/flexibility_statement.py"
