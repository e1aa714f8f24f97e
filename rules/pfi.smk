# Stage 3: the Power Flexibility Index per sweep group.


rule compute_pfi:
    """Ratio, area and elasticity PFI, robust PFI, Monte Carlo CI and diagnostics."""
    input:
        f"results/{{campaign}}/runs.parquet",
    output:
        **with_sidecars(
            parquet=f"results/{{campaign}}/pfi.parquet",
            csv=f"results/{{campaign}}/pfi.csv",
        ),
    params:
        pfi=section("pfi"),
        code=script_code("compute_pfi"),
    log:
        "logs/{campaign}/compute_pfi.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/compute_pfi.py"


rule compare_pfi_published:
    """Each group's PFI beside the published Tables 6-7, with the Spearman rank correlation
    and cluster medians (its own job: core_figures then draws it without importing scipy)."""
    input:
        f"results/{{campaign}}/pfi.parquet",
    output:
        **with_sidecars(table6=f"results/{{campaign}}/tables/table6_pfi.csv"),
    params:
        paper_tables=PAPER_TABLES,
        code=script_code("compare_pfi_published"),
    log:
        "logs/{campaign}/compare_pfi_published.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/compare_pfi_published.py"
