# Stage 4-6 (analysis): cluster statistics, the PFI predictor, the paper's other tables.
# Needs rules/common/ (section, script_code, published_tables, published_dir); its final files
# are listed in rules/common/paths.smk's FINAL_RULES.


rule cluster_stats:
    """Kruskal-Wallis + Dunn-Holm across clusters (Tables 10-11); telemetry-PFI correlations."""
    input:
        runs=f"{RESULTS}/runs.parquet",
        pfi=f"{RESULTS}/pfi.parquet",
        published=published_tables("cluster_stats"),
    output:
        **with_sidecars(
            kruskal_dunn=f"{RESULTS}/stats/kruskal_dunn.json",
            cluster_tests=f"{RESULTS}/stats/cluster_tests.csv",
            correlations=f"{RESULTS}/stats/telemetry_correlations.csv",
            groups=f"{RESULTS}/stats/group_telemetry.csv",
        ),
    params:
        stats=section("stats"),
        paper_tables=published_dir,
        code=script_code("cluster_stats"),
    log:
        f"{LOGS}/cluster_stats.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/cluster_stats.py"


rule fit_predictor:
    """Table 3 ablation, the chosen model, predictions per group, Tables 12-13."""
    input:
        runs=f"{RESULTS}/runs.parquet",
        pfi=f"{RESULTS}/pfi.parquet",
        published=published_tables("fit_predictor"),
    output:
        **with_sidecars(
            model=f"{RESULTS}/predictor/model.json",
            ablation=f"{RESULTS}/predictor/ablation.csv",
            predictions=f"{RESULTS}/predictor/predictions.parquet",
            holdout=f"{RESULTS}/predictor/holdout.csv",
            leverage=f"{RESULTS}/predictor/leverage.csv",
            within_cluster=f"{RESULTS}/predictor/within_cluster.csv",
        ),
    params:
        predictor=section("predictor"),
        paper_tables=published_dir,
        code=script_code("fit_predictor"),
    log:
        f"{LOGS}/fit_predictor.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/fit_predictor.py"


rule paper_tables:
    """Table 9 (grid sensitivity), Table 8 (H100 vs H200), repeatability, Tables 4-5."""
    input:
        runs=f"{RESULTS}/runs.parquet",
        pfi=f"{RESULTS}/pfi.parquet",
        predictions=rules.fit_predictor.output.predictions,
        published=published_tables("paper_tables"),
    output:
        **with_sidecars(
            table9=f"{RESULTS}/tables/table9_grid_sensitivity.csv",
            table8=f"{RESULTS}/tables/table8_h100_vs_h200.csv",
            repeatability=f"{RESULTS}/tables/repeatability.csv",
            table4=f"{RESULTS}/tables/table4_compute.csv",
            table5=f"{RESULTS}/tables/table5_compute_campaign.csv",
            summary=f"{RESULTS}/tables/analysis_summary.csv",
        ),
    params:
        tables=section("tables"),
        run={"duration_s": section("run")["duration_s"]},
        paper_tables=published_dir,
        code=script_code("paper_tables"),
    log:
        f"{LOGS}/paper_tables.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/paper_tables.py"


rule analysis_figures:
    """Telemetry-vs-PFI grid, predicted vs measured, Table 8 and Table 9 scatters."""
    input:
        groups=rules.cluster_stats.output.groups,
        correlations=rules.cluster_stats.output.correlations,
        predictions=rules.fit_predictor.output.predictions,
        holdout=rules.fit_predictor.output.holdout,
        model=rules.fit_predictor.output.model,
        table8=rules.paper_tables.output.table8,
        table9=rules.paper_tables.output.table9,
        summary=rules.paper_tables.output.summary,
    output:
        figure_output(f"{RESULTS}/figures/telemetry_vs_pfi.png"),
        figure_output(f"{RESULTS}/figures/predicted_vs_measured.png"),
        figure_output(f"{RESULTS}/figures/table8_h100_vs_h200.png"),
        figure_output(f"{RESULTS}/figures/table9_grid_sensitivity.png"),
    params:
        figures=section("figures"),
        code=script_code("analysis_figures"),
    log:
        f"{LOGS}/analysis_figures.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/analysis_figures.py"
