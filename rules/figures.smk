# Stage 6 (core): the paper's sweep figures, and Table 6 (rule compare_pfi_published) drawn.

CORE_FIGURES = [
    "fig2_power_tokens_over_time",
    "curves_normalized",
    "curves_raw",
    "pfi_by_cluster",
    "clocks_vs_cap",
    "table6_emulated_vs_published",
]


rule core_figures:
    """Fig. 2 analog, power-throughput curves, PFI by cluster, clocks vs cap, Table 6 drawn."""
    input:
        runs=f"{RESULTS}/runs.parquet",
        pfi=f"{RESULTS}/pfi.parquet",
        table6=rules.compare_pfi_published.output.table6,
        representative=representative_files(),
    output:
        figures=[figure_output(f"{RESULTS}/figures/{name}.png") for name in CORE_FIGURES],
    params:
        figures=section("figures"),
        protocol=section("summary"),  # Fig. 2 shades the phases the summaries used
        code=script_code("core_figures"),
    log:
        f"{LOGS}/core_figures.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/core_figures.py"
