# Stage 9: the reproduction report, one self-contained HTML page per campaign (figures
# embedded), the paper's sections in order, each table and figure beside the published
# values. It reads every other final output (common.smk report_inputs), so any rerun
# upstream reruns it; its params are the result-shaping config it prints.


rule report:
    """results/<campaign>/report.html: the whole reproduction in one document."""
    input:
        # at DAG time: rules/ingest.smk (an ingest campaign's final rules) is included after this file
        products=lambda wc: report_inputs(),
        published=published_tables("report"),
    output:
        html=f"{RESULTS}/report.html",
    params:
        campaign=CAMPAIGN,
        shown_config=result_config(),
        paper_tables=published_dir,
        code=script_code("make_report"),
    log:
        f"{LOGS}/report.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/make_report.py"
