# Stage 7: allocation under a cluster power cut (paper §6, Fig. 8) and beyond: exact
# oracle, curve-aware and SLA-tier policies, out-of-sample check (wattflex.allocation).
# Needs common.smk (section, script_code, with_sidecars, figure_output, outputs_of)
# and the predictor's predictions.parquet (analysis.smk).

ALLOCATION = "results/{campaign}/allocation"


rule simulate_allocation:
    """500 workloads x 100 jobs per mix, every policy at every cut; headline, SLA, out-of-sample."""
    input:
        runs="results/{campaign}/runs.parquet",
        pfi="results/{campaign}/pfi.parquet",
        predictions="results/{campaign}/predictor/predictions.parquet",
    output:
        **with_sidecars(
            summary=f"{ALLOCATION}/summary.csv",
            headline=f"{ALLOCATION}/headline.csv",
            out_of_sample=f"{ALLOCATION}/out_of_sample.csv",
            sla=f"{ALLOCATION}/sla.csv",
        ),
    params:
        allocation=section("allocation"),
        code=script_code("simulate_allocation"),
    log:
        "logs/{campaign}/simulate_allocation.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/simulate_allocation.py"


rule allocation_figures:
    """Fig. 8 analog (tokens/s per job and gap closed vs cut) and the out-of-sample figure."""
    input:
        summary=rules.simulate_allocation.output.summary,
        headline=rules.simulate_allocation.output.headline,
        out_of_sample=rules.simulate_allocation.output.out_of_sample,
    output:
        fig8=figure_output(f"{ALLOCATION}/fig8_allocation.png"),
        out_of_sample=figure_output(f"{ALLOCATION}/allocation_out_of_sample.png"),
    params:
        figures=section("figures"),
        code=script_code("allocation_figures"),
    log:
        "logs/{campaign}/allocation_figures.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/allocation_figures.py"
