"""What each section of the reproduction report shows, in the paper's order (wattflex.report
renders them). Light on purpose: every `snakemake` start imports it through rules/common/params.smk,
which files each output under its section in Snakemake's own report (``snakemake_category``).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class Item:
    """One artifact shown in a section: a path relative to ``results/<campaign>/`` (a glob
    pattern where the name is not fixed) and how to show it."""

    path: str
    title: str
    published: str | None = None  # stem of a published table to show beside it
    render: str | None = None  # figure | table | matrix | text | file (default: by suffix)
    note: str = ""


@dataclass(frozen=True)
class Section:
    """One section of the report: its key and title, the items (figures, tables) it shows, the
    summary table's keys shown as headline numbers, what it needs (for its "skipped" note), what
    the paper says, and whether it is left out entirely when nothing of it exists.
    """

    key: str
    title: str
    items: tuple[Item, ...]
    summary: tuple[
        str, ...
    ] = ()  # `table` keys of tables/analysis_summary.csv shown as headline numbers
    needs: str = ""  # what the section needs, for the "skipped: why" note
    published_text: str = ""  # what the paper states in its text
    optional: bool = False  # omitted (not "skipped") when none of its artifacts exist


SECTIONS: tuple[Section, ...] = (
    Section(
        "sweeps",
        "§2 Measurement: power-cap sweeps (Fig. 2)",
        (
            Item(
                "figures/fig2_power_tokens_over_time.png",
                "Fig. 2 analog: job power and tokens/s over one run, phases shaded",
            ),
            Item(
                "figures/curves_normalized.png",
                "Power-throughput curves, normalised to each group's uncapped run",
            ),
            Item("figures/curves_raw.png", "Power-throughput curves (absolute)"),
        ),
        needs="per-run telemetry time series from run_at_cap",
    ),
    Section(
        "ingest",
        "Ingested sweeps",
        (
            Item("ingest_report.md", "Ingest report", render="text"),
            Item("tables/pfi_status_counts.csv", "PFI status counts"),
            Item("tables/pfi_groups.csv", "PFI per ingested group"),
            Item("figures/pfi_robust_vs_ratio.png", "Robust vs ratio PFI"),
            Item("ingest/rejected.csv", "Rejected input rows"),
        ),
        optional=True,
    ),
    Section(
        "matrix",
        "§3 Experiment matrix and compute (Tables 1, 4, 5)",
        (
            Item(
                "runs.csv",
                "Runs of this campaign by set, GPU model and cluster",
                published="table1_experiment_matrix",
                render="matrix",
            ),
            Item("tables/table4_compute.csv", "Table 4: H200 sweep compute by GPUs per job"),
            Item(
                "tables/table5_compute_campaign.csv",
                "Table 5: compute of the whole campaign (repeats, H100)",
            ),
            Item("missing_runs.csv", "Runs that failed after their last retry"),
            Item(
                "tables/resource_plan.csv",
                "Resource plan per group: GPU memory, host RAM per node, start-up, "
                "checkpoint, fits (docs/resource-plan.md)",
                render="file",
            ),
        ),
        summary=("compute",),
        needs="runs.parquet from run_at_cap/collect_runs",
    ),
    Section(
        "pfi",
        "§4 PFI per group, clusters and mechanism (Tables 6-7, 10-11)",
        (
            Item(
                "tables/table6_pfi.csv",
                "Tables 6-7: PFI per group (ratio, 95% Monte Carlo CI) beside the published values",
            ),
            Item(
                "figures/table6_emulated_vs_published.png",
                "PFI per group: this campaign vs published",
            ),
            Item("figures/pfi_by_cluster.png", "PFI by cluster"),
            Item(
                "stats/cluster_tests.csv",
                "Tables 10-11: Kruskal-Wallis across clusters, Dunn's test with Holm correction",
            ),
            Item(
                "figures/clocks_vs_cap.png", "Mechanism: steady-state SM and memory clocks vs cap"
            ),
            Item(
                "stats/telemetry_correlations.csv",
                "Telemetry vs PFI (uncapped run): Spearman rho with BH-FDR q",
            ),
            Item(
                "figures/telemetry_vs_pfi.png", "PFI vs each telemetry metric of the uncapped run"
            ),
            Item(
                "stats/group_telemetry.csv",
                "Per-group uncapped-run telemetry and PFI behind the correlations",
                render="file",
            ),
            Item(
                "pfi.csv",
                "Full PFI table (ratio, area, elasticity, robust PFI, diagnostics)",
                render="file",
            ),
        ),
        needs="pfi.parquet (compute_pfi)",
        published_text="PFI 1.10-2.67, none below 1; medians dense 1.27, MoE PT 1.43, MoE FT 2.10; only dense vs "
        "MoE-FT significant after Holm; DRAM activity and the DRAM copy product correlate positively "
        "with PFI, tensor-pipe activity negatively.",
    ),
    Section(
        "fidelity",
        "Fidelity of the EMULATED reproduction against the paper (beyond the paper)",
        (
            Item(
                "tables/fidelity_summary.csv",
                "Headline metrics of the emulation against its targets",
                render="fidelity",
            ),
            Item(
                "figures/fidelity_vs_published.png",
                "Emulated PFI per group vs published, with the 1:1 line",
            ),
            Item(
                "tables/fidelity.csv",
                "Per group: emulated PFI (noise-free model, this campaign, noise-seed 5-95 %) "
                "beside the published value; residual = emulated - published; calibration = in-sample (the anchor "
                "was fitted on it) or out-of-sample; top_assumption: the assumed constant (or HBM power) whose "
                "+-25 % moves the group's noise-free PFI most, by top_assumption_delta_pfi; delta_pfi[...]: the "
                "largest |change| of each named assumption",
            ),
            Item(
                "tables/fidelity_test_sets.csv",
                "Every test set side by side: Table 6 out of sample, each "
                "leave-one-table-out refit, each public measured sweep, with what the emulator was and was not fitted "
                "to",
                render="table",
                note="pfi_mae: mean |emulated - measured or published| PFI of the scored groups; spearman: rank "
                "correlation with Table 6; clock_share_error_pp / power_exponent_error: emulated minus measured "
                "clock-independent share of kernel time and power exponent near the top clock "
                "(wattflex.analysis.public_sweeps). A row with no score says why.",
            ),
            Item(
                "tables/fidelity_calibration.csv",
                "Leave-one-table-out: the power-level anchor refitted on each allowed "
                "set of published facts (never Table 6), the noise-free model scored on the rest",
                render="table",
                note="Each row is a whole refit (wattflex.analysis.calibration.leave_one_table_out); the default row is what "
                "the rest of this section uses. mae_*: mean |emulated - published| in sample, out of sample on "
                "Table 6, out of sample on the other published groups.",
            ),
            Item(
                "tables/fidelity_sensitivity.csv",
                "Sensitivity of the noise-free model: each physics constant "
                "and the GPUs' HBM power -25 % and +25 %, one at a time (largest effect first); assumed = no public "
                "fact settles it; groups_decided = groups whose PFI it moves more than any other assumption does",
                render="sensitivity",
            ),
        ),
        optional=True,
    ),
    Section(
        "predictor",
        "§5 Predicting PFI from one uncapped run (Tables 3, 8, 12, 13; Fig. 7)",
        (
            Item(
                "predictor/ablation.csv",
                "Table 3: predictor ablation (in-sample, leave-one-out, leave-one-cluster-out)",
            ),
            Item("figures/predicted_vs_measured.png", "Fig. 7 analog: predicted vs measured PFI"),
            Item("predictor/holdout.csv", "Held-out scores: validation and H100 groups"),
            Item(
                "predictor/leverage.csv",
                "Table 12: dropping the highest-leverage groups one by one",
            ),
            Item("predictor/within_cluster.csv", "Table 13: correlation within clusters"),
            Item("tables/table8_h100_vs_h200.csv", "Table 8: matched H100 groups vs H200"),
            Item("figures/table8_h100_vs_h200.png", "H100 vs H200 PFI"),
        ),
        summary=("h100_vs_h200",),
        needs="uncapped-run DCGM telemetry per group (fit_predictor)",
        published_text="DRAM copy product alone is best: LOO R² 0.524, LOCO R² 0.246 (Table 3); the signal is "
        "between clusters, not within (Table 13); H100 rank order preserved (Spearman 0.943), "
        "H200 predictor R² 0.56 on H100 (Table 8). Tables 12-13 are given in the paper's text only.",
    ),
    Section(
        "grid",
        "Appendix: sweep-grid sensitivity (Table 9)",
        (
            Item(
                "tables/table9_grid_sensitivity.csv",
                "Table 9: 6-cap groups recomputed on the 4-cap grid",
            ),
            Item("figures/table9_grid_sensitivity.png", "PFI on the 6-cap vs the 4-cap grid"),
        ),
        summary=("grid_sensitivity",),
        needs="groups swept on more caps than the 4-cap grid (paper_tables)",
    ),
    Section(
        "repeatability",
        "Repeatability (§2)",
        (
            Item(
                "tables/repeatability.csv",
                "Repeated configurations: coefficient of variation of power and tokens/s",
            ),
        ),
        summary=("repeatability",),
        needs="repeated runs (config `repeats:`)",
    ),
    Section(
        "allocation",
        "§6 Allocation under a cluster power cut (Fig. 8)",
        (
            Item(
                "allocation/fig8_allocation.png",
                "Fig. 8 analog: tokens/s per job and gap closed vs cluster power cut",
            ),
            Item(
                "allocation/headline.csv",
                "Headline: 30% cut, production mix (policies vs equal weight and oracle)",
            ),
            Item("allocation/summary.csv", "Every policy at every cut, per mix"),
            Item("allocation/sla.csv", "SLA tiers"),
            Item(
                "allocation/allocation_out_of_sample.png", "Out-of-sample check (beyond the paper)"
            ),
            Item("allocation/out_of_sample.csv", "Out-of-sample check"),
            Item("allocation/*.png", "Allocation"),
            Item("allocation/*.csv", "Allocation"),
        ),
        needs="the allocation stage (simulate_allocation)",
        published_text="At a 30% cut on the production mix, PFI-aware allocation recovers 1.5k tokens/s per job "
        "over equal weight, 63% of the equal-weight-to-oracle gap; PFI-aware never loses to "
        "equal weight.",
    ),
    Section(
        "control",
        "Beyond the paper: closed-loop control under a curtailment signal",
        (
            Item(
                "control/summary.csv",
                "Every control policy in every scenario, beside the offline oracle",
            ),
            Item("control/*/power_vs_budget.png", "Cluster power vs the budget signal"),
            Item("control/*/tokens_lost.png", "Tokens lost to the curtailment"),
            Item("control/*/summary.csv", "Scenario summary"),
            Item(
                "control/mv.csv",
                "Measurement and verification of every event: baselines (curves, pre-event load), "
                "delivered vs target, response time, time above target after the deadline, restore "
                "time, throughput lost vs the oracle (wattflex.ops.services.mv)",
            ),
            Item(
                "control/*/mv.png",
                "M&V: each controller's load against the event's target and baselines",
            ),
            Item("control/*/mv_intervals.csv", "M&V per interval", render="file"),
            Item("control/*/jobs.csv", "Per-job outcome", render="file"),
            Item("control/*.png", "Control"),
        ),
        optional=True,
    ),
    Section(
        "offer",
        "Beyond the paper: the flexibility offer (demand response)",
        (
            Item(
                "offer/offer.png",
                "kW the campaign's jobs can shed at each throughput loss, per job and in total: "
                "the curve behind the offer (wattflex.ops.services.offer)",
            ),
            Item(
                "offer/offer.csv",
                "The offer: kW sheddable for the hours held at <= 10 / 25 / 50 % throughput loss, "
                "per job and TOTAL",
            ),
        ),
        optional=True,
    ),
    Section(
        "statement",
        "Beyond the paper: the site's flexibility statement (demand response)",
        (
            Item(
                "statement/statement.png",
                "How much the site can shed and at what cost in training (5-95 % over job "
                "mixes and curve re-measurements), tokens lost per year per curtailment "
                "calendar, and the meter baselines' error on simulated event days",
            ),
            Item(
                "statement/shed.csv",
                "Per depth: kW shed, whether power caps alone reach it, throughput and tokens lost",
                note="Computed from the campaign's curves (wattflex.ops.services.statement); no published counterpart.",
            ),
            Item(
                "statement/calendar.csv",
                "Per curtailment rate (share of the year's hours): events and tokens lost a year",
                note="Curtailment rates: Norris et al., Rethinking Load Growth (Duke, 2025).",
            ),
            Item(
                "statement/response.csv",
                "Response time, ramp rate and restore time of the controlled events (M&V)",
                note="From the control study's simulated events (control/mv.csv); "
                "wattflex offer --statement --mv takes a real run's mv.json.",
            ),
            Item(
                "statement/baselines.csv",
                "Meter baselines (X of Y days, same-day adjusted, pre-event) and the curve "
                "baseline against the true load on simulated event days",
                note="The meter history is simulated from the control study's job stream.",
            ),
            Item(
                "statement/knobs.csv",
                "Events deeper than the caps' floor: tokens lost by caps only, pause only, "
                "requeue only, caps + clock (where a knob: clock group ran the job) and the "
                "cheapest mix (wattflex.allocation.knobs)",
                note="One site drawn as the statement draws its sites; restart and checkpoint times from the resource plan.",
            ),
            Item(
                "statement/knob_jobs.csv",
                "The deepest feasible mix: which job took which knob and why",
            ),
            Item("statement/statement.md", "The page an operator hands over"),
            Item("statement/openadr3_program.json", "The statement as an OpenADR 3 program object"),
            Item("statement/openadr3_report.json", "The statement as an OpenADR 3 report object"),
        ),
        optional=True,
    ),
)


def snakemake_category(path: str) -> str:
    """Category of an output in Snakemake's own report (``report(..., category=)``): the
    title of the paper section that shows it here."""
    rel = campaign_relative(path)
    for sec in SECTIONS:
        if any(fnmatch.fnmatch(rel, item.path) for item in sec.items):
            return sec.title
    return "Other outputs"


def campaign_relative(path: str) -> str:
    """``results/<campaign>/x/y.png`` (or ``results/{campaign}/...``) -> ``x/y.png``."""
    parts = PurePosixPath(str(path)).parts
    at = [i for i, part in enumerate(parts[:-2]) if part == "results"]
    return "/".join(parts[at[-1] + 2 :]) if at else str(path)
