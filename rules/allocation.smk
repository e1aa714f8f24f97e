# Stage 7: allocation under a cluster power cut (paper §6, Fig. 8) and beyond: exact
# oracle, curve-aware and SLA-tier policies, out-of-sample check (wattflex.allocation).
# Needs common.smk (section, script_code, with_sidecars, figure_output, outputs_of)
# and the predictor's predictions.parquet (analysis.smk).

from wattflex.allocation.settings import MERGE_ONLY_KEYS, PART_TABLES, SimulationConfig, cut_label

ALLOCATION = f"{RESULTS}/allocation"
ALLOCATION_SETTINGS = section("allocation")
# One job per cut (both cores busy, and a changed cut list reruns only the new cuts and the
# merge); the labels read back as the config's floats (cut_label).
ALLOCATION_CUTS = list(dict.fromkeys(cut_label(c) for c in SimulationConfig.from_dict(ALLOCATION_SETTINGS).cuts))
ALLOCATION_PART = f"{ALLOCATION}/cuts/{{cut}}"


rule simulate_allocation_cut:
    """One cut: 500 workloads x 100 jobs per mix, every policy, SLA tiers and out-of-sample splits."""
    input:
        runs=f"{RESULTS}/runs.parquet",
        pfi=f"{RESULTS}/pfi.parquet",
        predictions=f"{RESULTS}/predictor/predictions.parquet",
    output:
        **{name: f"{ALLOCATION_PART}/{name}.parquet" for name in PART_TABLES},
    params:
        # the settings a cut's numbers depend on: the cut list, headline and published
        # figures are the merge's, so changing them reruns no cut
        allocation={k: v for k, v in ALLOCATION_SETTINGS.items() if k not in MERGE_ONLY_KEYS},
        cut=lambda wc: float(wc.cut),
        code=script_code("simulate_allocation_cut"),
    wildcard_constraints:
        cut=r"[0-9][0-9.e+-]*",
    log:
        f"{LOGS}/simulate_allocation_cut_{{cut}}.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/simulate_allocation_cut.py"


rule simulate_allocation:
    """The cuts merged: summary, headline, SLA tiers and out-of-sample check (same as one run)."""
    input:
        runs=f"{RESULTS}/runs.parquet",
        pfi=f"{RESULTS}/pfi.parquet",
        predictions=f"{RESULTS}/predictor/predictions.parquet",
        **{f"part_{name}": expand(f"{ALLOCATION_PART}/{name}.parquet", cut=ALLOCATION_CUTS, allow_missing=True)
           for name in PART_TABLES},
    output:
        **with_sidecars(
            summary=f"{ALLOCATION}/summary.csv",
            headline=f"{ALLOCATION}/headline.csv",
            out_of_sample=f"{ALLOCATION}/out_of_sample.csv",
            sla=f"{ALLOCATION}/sla.csv",
        ),
    params:
        allocation=ALLOCATION_SETTINGS,
        code=script_code("simulate_allocation"),
    log:
        f"{LOGS}/simulate_allocation.log",
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
        f"{LOGS}/allocation_figures.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/allocation_figures.py"
