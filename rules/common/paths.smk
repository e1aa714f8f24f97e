# Where things are: the campaign's folders, its runs and groups, the published tables, and
# which files the workflow makes. Every path a rule sees is relative (to Snakemake's working
# directory) when it lies in the checkout or there, so a finished run copied or moved
# elsewhere plans nothing (tests/workflow/test_relocation.py).
from wattflex.config import expand_runs, groups, resolve_path
from wattflex.run_ids import RUN_ID_PATTERN, run_id

CAMPAIGN = config["campaign"]
# The configured campaign's folders, written into every path (not a {campaign} wildcard): a
# rule makes only this config's files, and Snakemake matches each requested file to its rule
# by the paths' constant prefixes, which a wildcard right after results/ made useless
# (matching was a third of a no-op DAG build; it fell ~40 %, the build ~25 %).
RESULTS = f"results/{CAMPAIGN}"
LOGS = f"logs/{CAMPAIGN}"
SOURCE = config["source"]  # ingest: runs.parquet from data (rules/ingest.smk)
RUNS = expand_runs(config) if SOURCE == "generate" else []
GROUPS = {g["id"]: g for g in groups(config)} if SOURCE == "generate" else {}
# Config defaults are the schema's (config/schema), filled by prepare(): keys are read directly.
BACKEND = config["backend"]
SWEEP = config["sweep"]  # staircase | adaptive: one run per group (rules/sweeps.smk)


def stable_path(path):
    """Data inside the checkout or the working directory as a relative path, so moving the
    checkout changes no input path and reruns nothing; data elsewhere stays absolute."""
    inside = (Path(workflow.basedir).resolve(), Path.cwd().resolve())
    return os.path.relpath(path) if any(Path(path).is_relative_to(d) for d in inside) else str(path)


def workflow_file(path):
    """A file named relative to the workflow directory (config/, resources/), as a rule sees it."""
    return stable_path(resolve_path(path, Path(workflow.basedir)))


def public_sweep_files(folder, pattern):
    """The shipped public sweep files of resources/external/<folder> matching ``pattern``
    (rules/fidelity.smk scores the emulator on them)."""
    return sorted(workflow_file(p) for p in (Path(workflow.basedir) / "resources" / "external" / folder).glob(pattern))


# The paper's published tables (resources/paper/tables; paper_tables_dir relative to the
# workflow directory). The tables each rule's script reads are its input.published (listed
# below), so editing a published CSV reruns what shows it; the script gets their folder.
PAPER_TABLES = workflow_file(config["paper_tables_dir"])
PUBLISHED_BY_RULE = {  # rule: the published tables its script reads (wattflex.analysis.published.load_published)
    "compare_pfi_published": ("table6_pfi_h200", "table7_validation_h200"),
    "cluster_stats": ("table10_11_cluster_tests",),
    "fit_predictor": ("table3_predictor_ablation",),
    "paper_tables": ("table9_grid_sensitivity", "table8_h100_vs_h200", "table4_compute"),
    "fidelity": ("table6_pfi_h200", "table7_validation_h200", "table8_h100_vs_h200", "table10_11_cluster_tests"),
    "report": ("table1_experiment_matrix",),  # wattflex.report_sections Item.published
}


def published_tables(rule_name):
    """The published tables ``rule_name`` reads, those that exist (a missing one is shown
    as missing, load_published); one appearing later reruns the rule."""
    paths = (f"{PAPER_TABLES}/{stem}.csv" for stem in PUBLISHED_BY_RULE[rule_name])
    return [p for p in paths if Path(p).is_file()]


def published_dir(wildcards, input):
    """params.paper_tables: the folder of the rule's input.published (where Snakemake put
    them), or the configured folder when none of its tables exists."""
    return os.path.dirname(input.published[0]) if input.published else PAPER_TABLES


def run_dirs():
    return [f"{RESULTS}/runs/{r['group']}/{r['run_id']}" for r in RUNS]


def sweep_summary_files():
    """One-run sweep modes (rules/sweeps.smk): a summary per cap of each group's one run."""
    return [f"{RESULTS}/runs/{gid}/{SWEEP}/{run_id(cap)}/summary.json"
            for gid, g in GROUPS.items() for cap in g["caps"]]


def summary_files():
    if SWEEP != "separate":
        return sweep_summary_files()
    return [f"{d}/summary.json" for d in run_dirs()]


def representative_run():
    """The run drawn in the paper's Fig. 2 analog: the first group's uncapped run."""
    first = next(iter(GROUPS.values()))
    mode = "" if SWEEP == "separate" else f"{SWEEP}/"  # one-run sweeps: its stretch at that cap
    return f"{RESULTS}/runs/{first['id']}/{mode}{run_id(max(first['caps']))}"


def representative_files():
    """The Fig. 2 run's files; none for an ingested campaign (it has no generated groups)."""
    if not GROUPS:
        return []
    return [f"{representative_run()}/{f}" for f in ("telemetry.parquet", "steps.parquet", "summary.json")]


# Rules whose outputs are the workflow's final products (rule all asks for all of them).
FINAL_RULES = ["collect_runs", "compute_pfi", "compare_pfi_published", "core_figures", "cluster_stats", "fit_predictor",
               "paper_tables", "analysis_figures", "simulate_allocation", "allocation_figures", "resource_plan", "report"]
FINAL_RULES += ["control_figures"] if config["control"]["scenarios"] else []  # rules/control.smk
FINAL_RULES += ["offer", "flexibility_statement"]   # rules/control.smk: the offer and the statement from the curves
# Fidelity against the paper: generated, emulated campaigns only (rules/fidelity.smk).
FIDELITY = SOURCE == "generate" and BACKEND == "emulated"
FINAL_RULES += ["fidelity", "fidelity_figure"] if FIDELITY else []


def outputs_of(*rule_names):
    """The output files of the named rules."""
    return [str(f) for name in rule_names for f in getattr(rules, name).output]


def final_outputs():
    return outputs_of(*(FINAL_RULES if SOURCE == "generate" else INGEST_FINAL_RULES))


def all_outputs():
    """The final products and every run's summary.json: Snakemake remakes a missing
    intermediate only when something downstream must run anyway, so a deleted summary is
    rebuilt (with what reads it) only because rule all asks for it."""
    return final_outputs() + summary_files()


def report_inputs():
    """What the report shows: every final output of the campaign but the report itself."""
    own = set(outputs_of("report"))
    return [f for f in final_outputs() if f not in own]
