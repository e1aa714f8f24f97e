# Fidelity of an EMULATED campaign against the paper: per-group PFI of the noise-free model,
# of this campaign and over noise seeds beside Tables 6-8, cluster medians and tests beside
# Tables 10-11, and each physics constant's +-25 % effect (wattflex.analysis.fidelity).
# Included by the Snakefile for generated, emulated campaigns only (common.smk FIDELITY):
# a measured campaign's PFI has no emulator behind it.

FIDELITY_TABLES = f"{RESULTS}/tables"


rule fidelity:
    """fidelity.csv (per group, in or out of the calibration's sample), fidelity_summary.csv
    (metrics vs targets, seed distribution), fidelity_sensitivity.csv (one constant at a time),
    fidelity_calibration.csv (the anchor refitted on each allowed published set, scored on the rest),
    fidelity_test_sets.csv (Table 6, each refit and each public sweep side by side, with what the
    emulator was and was not fitted to)."""
    input:
        runs=f"{RESULTS}/runs.parquet",
        pfi=f"{RESULTS}/pfi.parquet",
        published=published_tables("fidelity"),
        # The public measured sweeps scored beside Table 6 (wattflex.analysis.public_sweeps).
        perseus_a100=workflow_file("resources/external/perseus-sosp24/power_limit_sweeps_A100.csv"),
        perseus_a100_config=workflow_file("config/perseus-sosp24-a100-emulated.yaml"),
        h100_reading=workflow_file(
            "resources/external/ujeniya2026-v2/h100_94gb_vitl16_tf32_power_clock.csv"
        ),
        perseus_catalog=workflow_file("config/catalogs/perseus-sosp24.yaml"),
        perseus_profiles=public_sweep_files("perseus-sosp24", "sm_frequency_profile_*.csv"),
        other_sweeps=public_sweep_files("perseus-sosp24", "power_limit_sweeps_*.csv")
        + public_sweep_files("zeus-nsdi23", "summary_power_*.csv"),
    output:
        **with_sidecars(
            groups=f"{FIDELITY_TABLES}/fidelity.csv",
            summary=f"{FIDELITY_TABLES}/fidelity_summary.csv",
            sensitivity=f"{FIDELITY_TABLES}/fidelity_sensitivity.csv",
            calibration=f"{FIDELITY_TABLES}/fidelity_calibration.csv",
            test_sets=f"{FIDELITY_TABLES}/fidelity_test_sets.csv",
        ),
    params:
        # What the emulator is given per group (its config group and model facts).
        jobs=canonical({gid: {"group": g, "model_facts": config["_catalog"][g["model"]]} for gid, g in GROUPS.items()}),
        campaign=CAMPAIGN,  # the emulated runs' seeds derive from it
        seed=int(config["seed"]),
        sweep=SWEEP,
        # The campaign's calibration file's contents (emulator.calibration), or None: the default anchor.
        calibration=config.get("_emulator_calibration"),
        # >= 20 noise seeds and +-25 % per constant; not a config section.
        fidelity={"noise_seeds": 20, "perturbation": 0.25},
        # The campaign's own cluster tests' settings (rules/analysis.smk cluster_stats).
        stats={k: v for k, v in section("stats").items() if k in ("alpha", "cluster_order")},
        paper_tables=published_dir,
        code=script_code("fidelity"),
    log:
        f"{LOGS}/fidelity.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/fidelity.py"


rule fidelity_figure:
    """Emulated PFI per group (noise-free, campaign, seed band) vs published, with y = x; below,
    every test set's out-of-sample PFI error side by side."""
    input:
        groups=rules.fidelity.output.groups,
        summary=rules.fidelity.output.summary,
        test_sets=rules.fidelity.output.test_sets,
    output:
        figure=figure_output(f"{RESULTS}/figures/fidelity_vs_published.png"),
    params:
        figures=section("figures"),
        code=script_code("fidelity_figure"),
    log:
        f"{LOGS}/fidelity_figure.log",
    conda:
        "../envs/analysis.yaml"
    localrule: True
    script:
        "../workflow_scripts/fidelity_figure.py"
