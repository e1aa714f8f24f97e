# Stage 3: the Power Flexibility Index per sweep group.


rule compute_pfi:
    """Ratio, area and elasticity PFI, robust PFI, Monte Carlo CI and diagnostics."""
    input:
        f"{RESULTS}/runs.parquet",
    output:
        **with_sidecars(
            parquet=f"{RESULTS}/pfi.parquet",
            csv=f"{RESULTS}/pfi.csv",
        ),
    params:
        pfi=section("pfi"),
        code=script_code("compute_pfi"),
    log:
        f"{LOGS}/compute_pfi.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/compute_pfi.py"


rule compare_pfi_published:
    """Each group's PFI beside the published Tables 6-7, with the Spearman rank correlation
    and cluster medians (its own job: core_figures then draws it without importing scipy)."""
    input:
        f"{RESULTS}/pfi.parquet",
        published=published_tables("compare_pfi_published"),
    output:
        **with_sidecars(table6=f"{RESULTS}/tables/table6_pfi.csv"),
    params:
        paper_tables=published_dir,
        code=script_code("compare_pfi_published"),
    log:
        f"{LOGS}/compare_pfi_published.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/compare_pfi_published.py"
