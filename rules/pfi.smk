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
