# Helpers shared by all rule files (config validation, the sweep table, params slices).
import json
import os
import sys
from pathlib import Path

from snakemake.logging import logger

sys.path.insert(0, str(Path(workflow.basedir) / "workflow_scripts"))

from wattflex.config import SCHEDULING_KEYS, ConfigError, defaulted_sections, expand_runs, groups, prepare, run_spec
from wattflex.fingerprint import script_fingerprint
from wattflex.gpus import GPUS
from wattflex.report import snakemake_category
from wattflex.runs.sweep.algorithm import sweep_spec

try:
    # cwd: Snakemake's working directory, where runs start (relative cuda.* paths).
    prepare(config, base=Path(workflow.basedir), cwd=os.getcwd())
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None

# --configfile is merged onto config/config.yaml (the Snakefile's configfile:): say which
# sections came from the default, so a section deleted from the user's file is not a surprise
# (wattflex.config's docstring; --replace-workflow-config uses the user's file alone).
if (workflow.is_main_process and workflow.overwrite_configfiles
        and not workflow.config_settings.replace_workflow_config):
    _from_default = defaulted_sections(config, workflow.overwrite_configfiles,
                                       workflow.config_settings.overwrite_config)
    if _from_default:
        logger.info(f"wattflex: sections not in {', '.join(map(str, workflow.overwrite_configfiles))} "
                    f"come from config/config.yaml: {', '.join(_from_default)} "
                    f"(--replace-workflow-config to use your file alone)")

CAMPAIGN = config["campaign"]
RESULTS = f"results/{CAMPAIGN}"
SOURCE = config.get("source", "generate")  # ingest: runs.parquet from data (rules/ingest.smk)
RUNS = expand_runs(config) if SOURCE == "generate" else []
GROUPS = {g["id"]: g for g in groups(config)} if SOURCE == "generate" else {}
SWEEP = config.get("sweep", "separate")  # staircase | adaptive: one run per group (rules/sweeps.smk)
# Relative to the workflow directory (rule scripts resolve it there), so that moving the
# checkout changes no params and reruns nothing.
PAPER_TABLES = config.get("paper_tables_dir", "resources/paper/tables")


def run_dirs(campaign):
    return [f"results/{campaign}/runs/{r['group']}/{r['run_id']}" for r in RUNS]


def summary_files(campaign):
    if SWEEP != "separate":
        return sweep_summary_files(campaign)
    return [f"{d}/summary.json" for d in run_dirs(campaign)]


def canonical(obj):
    """``obj`` with every mapping's keys sorted. Snakemake compares params by their repr, so
    without this, reordering or reformatting keys in a YAML file would rerun every rule
    (and stop at every write-protected real run)."""
    if isinstance(obj, dict):
        return {k: canonical(obj[k]) for k in sorted(obj, key=str)}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    return obj


def spec_for(wildcards):
    return canonical(run_spec(config, wildcards.group, wildcards.run))


def section(name, default=None):
    """The config slice a rule uses (goes into params, so changing it reruns that rule)."""
    return canonical(config.get(name, default if default is not None else {}))


def with_sidecars(**outputs):
    """Named outputs plus the provenance sidecar ``<file>.meta.json`` of each CSV among them
    (wattflex.provenance.write_csv writes both), so Snakemake tracks and cleans them too."""
    sidecars = {f"{name}_meta": f"{path}.meta.json" for name, path in outputs.items()
                if isinstance(path, str) and path.endswith(".csv")}
    return {**outputs, **sidecars}


def figure_output(path):
    """A figure output, also filed under its paper section in Snakemake's own report
    (`snakemake --report report.zip`); the primary report is rule report's HTML."""
    return report(path, category=snakemake_category(path))


def run_output(path):
    """An output of run_at_cap: write-protected for real runs (backend other than emulated),
    so no code or config change can make Snakemake regenerate or delete it; redoing one
    takes an explicit unprotect + --force (README "Real runs are protected")."""
    return path if config.get("backend", "emulated") == "emulated" else protected(path)


# The library code an emulated run depends on: the runner's import closure (the GPU and job
# model, its device, the runner that writes the run's files). telemetry (column names) and
# failures are contracts, not physics: changing them regenerates no run. A real run depends
# on its spec alone, so no code change anywhere can rerun it.
RUN_CODE = script_fingerprint("runs.runner", ignore=("telemetry", "runs.failures")) if config.get("backend", "emulated") == "emulated" else ""


def script_code(script):
    """Fingerprint of the library code a rule script imports (wattflex.fingerprint), for
    its params: Snakemake tracks the script itself, not the modules it imports."""
    return script_fingerprint(Path(workflow.basedir) / "workflow_scripts" / f"{script}.py")


def result_config():
    """The config that shapes results, shown in the report: all but scheduling settings
    (slurm_*, run.retries, run.parallel_within_group) and internal keys, so that changing
    how jobs are scheduled reruns nothing, not even the report."""
    out = {k: v for k, v in config.items() if not k.startswith(("_", "slurm_"))}
    if isinstance(out.get("run"), dict):
        out["run"] = {k: v for k, v in out["run"].items() if k not in SCHEDULING_KEYS}
    return canonical(out)


def representative_run(campaign):
    """The run drawn in the paper's Fig. 2 analog: the first group's uncapped run."""
    first = next(iter(GROUPS.values()))
    mode = "" if SWEEP == "separate" else f"{SWEEP}/"  # one-run sweeps: its stretch at that cap
    return f"results/{campaign}/runs/{first['id']}/{mode}cap{max(first['caps']):g}"


def representative_files(campaign):
    """The Fig. 2 run's files; none for an ingested campaign (it has no generated groups)."""
    if not GROUPS:
        return []
    return [f"{representative_run(campaign)}/{f}" for f in ("telemetry.parquet", "steps.parquet", "summary.json")]


# Rules whose outputs are the workflow's final products (rule all asks for all of them).
FINAL_RULES = ["collect_runs", "compute_pfi", "core_figures", "cluster_stats", "fit_predictor",
               "paper_tables", "analysis_figures", "simulate_allocation", "allocation_figures", "report"]
FINAL_RULES += ["control_figures"] if config.get("control", {}).get("scenarios") else []  # rules/control.smk


def outputs_of(campaign, *rule_names):
    """The output files of the named rules for one campaign."""
    return [str(f).format(campaign=campaign) for name in rule_names for f in getattr(rules, name).output]


def all_outputs(campaign):
    return outputs_of(campaign, *(FINAL_RULES if SOURCE == "generate" else INGEST_FINAL_RULES))


def report_inputs(campaign):
    """What the report shows: every final output of the campaign but the report itself."""
    own = set(outputs_of(campaign, "report"))
    return [f for f in all_outputs(campaign) if f not in own]


# ---- How runs are scheduled (README "Running on a SLURM cluster") ----------------------
# Cluster facts arrive as config keys slurm_* (profiles/slurm/config.yaml sets them); they
# shape SLURM requests only, never a run's params, so changing them reruns nothing.
SLURM = {"slurm_gpus_per_node": 8, "slurm_gpu_model": "none",
         "slurm_gpu_names": {name: gpu.slurm_name for name, gpu in GPUS.items()}, "slurm_runtime_margin_min": 20}
SLURM.update({k: config[k] for k in SLURM if k in config})
RUN_RETRIES = int(config.get("run", {}).get("retries", 1))

# Runs of one sweep group execute one after another (the paper's protocol): each holds its
# group's slot, a Snakemake resource of capacity 1, unless run.parallel_within_group.
GROUP_SLOTS = {}
if not config.get("run", {}).get("parallel_within_group", False):
    for i, gid in enumerate(GROUPS):
        slot = "sweep_" + "".join(c if c.isalnum() else "_" for c in gid)
        GROUP_SLOTS[gid] = slot if slot not in GROUP_SLOTS.values() else f"{slot}_{i}"
        workflow.register_resource(GROUP_SLOTS[gid], 1)


def run_minutes(attempt):
    """SLURM time limit of one run: its length and gap, plus a margin that grows per retry."""
    run = config.get("run", {})
    seconds = float(run.get("duration_s", 1800)) + float(run.get("gap_s", 0))
    return int(-(-seconds // 60)) + int(SLURM["slurm_runtime_margin_min"]) * attempt


def run_resources():
    """``resources:`` of run_at_cap: the group's GPUs (and their model), nodes, time limit,
    its group slot, and the attempt counters the rule script uses to record a final failure."""
    per_node = int(SLURM["slurm_gpus_per_node"])
    gpu_name = lambda wc: SLURM["slurm_gpu_names"].get(GROUPS[wc.group]["gpu"], GROUPS[wc.group]["gpu"].lower())
    res = {
        "gpu": lambda wc: GROUPS[wc.group]["gpus"],
        # One torchrun launcher per node: SLURM's default of one task per node.
        "nodes": lambda wc: -(-GROUPS[wc.group]["gpus"] // per_node),
        "runtime": lambda wc, attempt: run_minutes(attempt),
        "run_attempt": lambda wc, attempt: attempt,
        "run_attempts": RUN_RETRIES + 1,
    }
    if SLURM["slurm_gpu_model"] != "none":
        res[SLURM["slurm_gpu_model"]] = gpu_name
    for gid, slot in GROUP_SLOTS.items():
        res[slot] = lambda wc, gid=gid: 1 if wc.group == gid else None
    return res


# One-run sweep modes (rules/sweeps.smk).
def sweep_summary_files(campaign):
    return [f"results/{campaign}/runs/{gid}/{SWEEP}/cap{cap:g}/summary.json"
            for gid, g in GROUPS.items() for cap in g["caps"]]


def sweep_minutes(wildcards, attempt):
    """SLURM time limit: the one run never outlasts the separate runs it replaces."""
    seconds = len(GROUPS[wildcards.group]["caps"]) * float(config.get("run", {}).get("duration_s", 1800))
    return int(-(-seconds // 60)) + int(SLURM["slurm_runtime_margin_min"]) * attempt


def stable_path(path):
    """Data inside the checkout or the working directory as a relative path, so moving the
    checkout changes no input path and reruns nothing; data elsewhere stays absolute."""
    inside = (Path(workflow.basedir).resolve(), Path.cwd().resolve())
    return os.path.relpath(path) if any(Path(path).is_relative_to(d) for d in inside) else str(path)
