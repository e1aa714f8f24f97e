# Stage 1-2 for `source: ingest` campaigns: runs.parquet from measured sweeps or DCGM
# captures made elsewhere (wattflex.ingest.sources) instead of run_at_cap/collect_runs, then an
# ingest report. Included by the Snakefile only for such campaigns; PFI (rules/pfi.smk)
# and everything after it read the same runs.parquet contract.
from wattflex.ingest.reader import IngestError
from wattflex.ingest.sources import config_files


try:
    INGEST_FILES = [stable_path(p) for p in config_files(config["ingest"], Path(workflow.basedir))]
except IngestError as exc:
    raise WorkflowError(f"config error at ingest.path: {exc}") from None

# Ingested data makes its own curves figures (faceted by GPU model) and report; the
# paper's stages whose inputs ingested data lacks are listed in the report, not run.
INGEST_FINAL_RULES = ["ingest_runs", "compute_pfi", "ingest_report", "report"]


ruleorder: ingest_runs > collect_runs
ruleorder: ingest_report > core_figures


rule ingest_runs:
    """Validated run rows from the campaign's ingest sources (bad rows named by line)."""
    input:
        INGEST_FILES,
    output:
        parquet=f"{RESULTS}/runs.parquet",
        csv=f"{RESULTS}/runs.csv",
        rejected=f"{RESULTS}/ingest/rejected.csv",
        summary=f"{RESULTS}/ingest/summary.json",
    params:
        ingest=canonical({k: v for k, v in config["ingest"].items() if k != "path"}),
        summary=section("summary"),
        code=script_code("ingest_runs"),
    log:
        f"{LOGS}/ingest_runs.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/ingest_runs.py"


rule ingest_report:
    """Status counts, robust vs ratio PFI, which stages apply; curves and scatter figures."""
    input:
        runs=rules.ingest_runs.output.parquet,
        summary=rules.ingest_runs.output.summary,
        pfi=f"{RESULTS}/pfi.parquet",
    output:
        report=f"{RESULTS}/ingest_report.md",
        counts=f"{RESULTS}/tables/pfi_status_counts.csv",
        groups=f"{RESULTS}/tables/pfi_groups.csv",
        curves_normalized=f"{RESULTS}/figures/curves_normalized.png",
        curves_raw=f"{RESULTS}/figures/curves_raw.png",
        scatter=f"{RESULTS}/figures/pfi_robust_vs_ratio.png",
    params:
        campaign=CAMPAIGN,
        figures=section("figures"),
        code=script_code("ingest_report"),
    log:
        f"{LOGS}/ingest_report.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/ingest_report.py"
