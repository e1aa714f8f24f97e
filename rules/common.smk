# Helpers shared by all rule files (config validation, the sweep table, params slices).
import json
import os
import sys
from pathlib import Path

from snakemake.logging import logger

# This checkout's library, never another one's: a `pip install -e` of another clone puts its
# workflow_scripts/ on sys.path via a .pth file, and Snakemake's script preamble only *appends*
# the script's folder. PYTHONPATH comes before site-packages, and every job (local script
# subprocesses, SLURM jobs, which re-read this file) inherits os.environ. (--sdm conda drops
# PYTHONPATH; its envs install the checkout they were made from, envs/*.yaml.)
_LIB = str(Path(workflow.basedir) / "workflow_scripts")
sys.path.insert(0, _LIB)
_SEARCH_PATH = "PYTHONPATH"  # set here for the jobs, never required of the user (no envvars:)
os.environ[_SEARCH_PATH] = os.pathsep.join(
    [_LIB] + [p for p in os.environ.get(_SEARCH_PATH, "").split(os.pathsep) if p and p != _LIB])

from wattflex.config import (SCHEDULING_KEYS, ConfigError, check_config_files, defaulted_sections, expand_runs, groups,
                             prepare, run_spec)
from wattflex.fingerprint import script_fingerprint
from wattflex.gpus import GPUS
from wattflex.provenance import params_hash
from wattflex.runs.plan import enforced as plan_enforced, plan_campaign, run_limit_s
from wattflex.runs.protection import REDO_ENV, install_snakemake_guard, redo_runs
from wattflex.report_sections import snakemake_category
from wattflex.smk import release_scheduler_timers, skip_exit_gc

# snakemake itself exits without a last collection over its DAG (~0.5 s of a ~3 s no-op dry run)
skip_exit_gc()

try:
    # Snakemake's own YAML loading keeps the last of duplicate keys: read the files as wattflex does.
    check_config_files(workflow.configfiles)
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
# The configured campaign's folders, written into every path (not a {campaign} wildcard): a
# rule makes only this config's files, and Snakemake matches each requested file to its rule
# by the paths' constant prefixes, which a wildcard right after results/ made useless
# (matching was a third of a no-op DAG build; it fell ~40 %, the build ~25 %; issue 15).
RESULTS = f"results/{CAMPAIGN}"
LOGS = f"logs/{CAMPAIGN}"
SOURCE = config["source"]  # ingest: runs.parquet from data (rules/ingest.smk)
RUNS = expand_runs(config) if SOURCE == "generate" else []
GROUPS = {g["id"]: g for g in groups(config)} if SOURCE == "generate" else {}
# Config defaults are the schema's (config/schema), filled by prepare(): keys are read directly.
BACKEND = config["backend"]
SWEEP = config["sweep"]  # staircase | adaptive: one run per group (rules/sweeps.smk)
# Relative to the workflow directory (rule scripts resolve it there), so that moving the
# checkout changes no params and reruns nothing.
PAPER_TABLES = config["paper_tables_dir"]


def run_dirs():
    return [f"{RESULTS}/runs/{r['group']}/{r['run_id']}" for r in RUNS]


def summary_files():
    if SWEEP != "separate":
        return sweep_summary_files()
    return [f"{d}/summary.json" for d in run_dirs()]


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


def sweep_spec(cfg, group, mode):
    """wattflex.runs.sweep.algorithm.sweep_spec, imported only by one-run sweep campaigns:
    the sweep code imports scipy.stats, ~1 s of every `snakemake` start otherwise."""
    from wattflex.runs.sweep.algorithm import sweep_spec as spec

    return spec(cfg, group, mode)


def section(name):
    """The config slice a rule uses (goes into params, so changing it reruns that rule)."""
    return canonical(config[name])


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
    takes an explicit WATTFLEX_REDO_RUNS (+ unprotect, --force: README "Real runs are
    protected"). Root ignores file modes: the spec check at the end of this file does not."""
    return path if BACKEND == "emulated" else protected(path)


# The library code an emulated run depends on: the runner's import closure (the GPU and job
# model, its device, the runner that writes the run's files). telemetry (column names) and
# failures are contracts, not physics: changing them regenerates no run. A real run depends
# on its spec alone, so no code change anywhere can rerun it.
RUN_CODE = script_fingerprint("runs.runner", ignore=("telemetry", "runs.failures")) if BACKEND == "emulated" else ""


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


def representative_run():
    """The run drawn in the paper's Fig. 2 analog: the first group's uncapped run."""
    first = next(iter(GROUPS.values()))
    mode = "" if SWEEP == "separate" else f"{SWEEP}/"  # one-run sweeps: its stretch at that cap
    return f"{RESULTS}/runs/{first['id']}/{mode}cap{max(first['caps']):g}"


def representative_files():
    """The Fig. 2 run's files; none for an ingested campaign (it has no generated groups)."""
    if not GROUPS:
        return []
    return [f"{representative_run()}/{f}" for f in ("telemetry.parquet", "steps.parquet", "summary.json")]


# Rules whose outputs are the workflow's final products (rule all asks for all of them).
FINAL_RULES = ["collect_runs", "compute_pfi", "compare_pfi_published", "core_figures", "cluster_stats", "fit_predictor",
               "paper_tables", "analysis_figures", "simulate_allocation", "allocation_figures", "resource_plan", "report"]
FINAL_RULES += ["control_figures"] if config["control"]["scenarios"] else []  # rules/control.smk
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
    rebuilt (with what reads it) only because rule all asks for it (issue 27)."""
    return final_outputs() + summary_files()


def report_inputs():
    """What the report shows: every final output of the campaign but the report itself."""
    own = set(outputs_of("report"))
    return [f for f in final_outputs() if f not in own]


# ---- How runs are scheduled (README "Running on a SLURM cluster") ----------------------
# Cluster facts arrive as config keys slurm_* (profiles/slurm/config.yaml sets them); they
# shape SLURM requests only, never a run's params, so changing them reruns nothing.
SLURM = {"slurm_gpus_per_node": 8, "slurm_gpu_model": "none",
         "slurm_gpu_names": {name: gpu.slurm_name for name, gpu in GPUS.items()}, "slurm_runtime_margin_min": 20}
SLURM.update({k: config[k] for k in SLURM if k in config})
RUN = config["run"]
RUN_RETRIES = int(RUN["retries"])

# Runs of one sweep group execute one after another (the paper's protocol): each holds its
# group's slot, a Snakemake resource of capacity 1, unless run.parallel_within_group.
GROUP_SLOTS = {}
if not RUN["parallel_within_group"]:
    for i, gid in enumerate(GROUPS):
        slot = "sweep_" + "".join(c if c.isalnum() else "_" for c in gid)
        GROUP_SLOTS[gid] = slot if slot not in GROUP_SLOTS.values() else f"{slot}_{i}"
        workflow.register_resource(GROUP_SLOTS[gid], 1)


# Real runs of full-size models: each group's plan (wattflex.runs.plan; config.prepare has
# refused groups that cannot fit), whose start-up (build or load, first step) and checkpoint
# the SLURM time limit must hold. Resources only: no run's params depend on it.
REAL_PLANS = ({p.group: p for p in plan_campaign(config, list(GROUPS.values()))}
              if SOURCE == "generate" and plan_enforced(config) else {})


def run_minutes(group, attempt, duration_s=None, gap_s=None):
    """SLURM time limit of one run of ``group`` (its loop ``duration_s`` and ``gap_s`` default
    to run.*): planned start-up (real runs), the loop (a checkpoint outlasting the rest of it
    extends it), the gap, plus a margin that grows per retry."""
    duration = float(RUN["duration_s"]) if duration_s is None else float(duration_s)
    gap = float(RUN["gap_s"]) if gap_s is None else float(gap_s)
    seconds = duration + gap
    if group in REAL_PLANS:
        seconds = run_limit_s(REAL_PLANS[group], duration, gap, RUN["checkpoint_at_s"])
    return int(-(-seconds // 60)) + int(SLURM["slurm_runtime_margin_min"]) * attempt


def run_resources():
    """``resources:`` of run_at_cap: the group's GPUs (and their model), nodes, time limit,
    its group slot, and the attempt counters the rule script uses to record a final failure."""
    per_node = int(SLURM["slurm_gpus_per_node"])
    gpu_name = lambda wc: SLURM["slurm_gpu_names"].get(GROUPS[wc.group]["gpu"], GROUPS[wc.group]["gpu"].lower())
    nodes = lambda wc: -(-GROUPS[wc.group]["gpus"] // per_node)
    res = {
        "gpu": lambda wc: GROUPS[wc.group]["gpus"],
        # One torchrun launcher per node: SLURM's default of one task per node.
        "nodes": nodes,
        # Multi-node: the jobstep plugin's MPI route (no `srun -n1` wrapper, which cannot
        # span nodes), so real_run's one srun step per node is the job's only step
        # (wattflex.runs.real_run); tasks = nodes, and tasks_per_gpu 0 keeps the plugin from
        # turning `tasks` into --ntasks-per-gpu. None: the resource is unset (single node).
        "mpi": lambda wc: "srun" if nodes(wc) > 1 else None,
        "tasks": lambda wc: nodes(wc) if nodes(wc) > 1 else None,
        "tasks_per_gpu": lambda wc: 0 if nodes(wc) > 1 else None,
        "runtime": lambda wc, attempt: run_minutes(wc.group, attempt),
        "run_attempt": lambda wc, attempt: attempt,
        "run_attempts": RUN_RETRIES + 1,
    }
    if SLURM["slurm_gpu_model"] != "none":
        res[SLURM["slurm_gpu_model"]] = gpu_name
    for gid, slot in GROUP_SLOTS.items():
        res[slot] = lambda wc, gid=gid: 1 if wc.group == gid else None
    return res


# One-run sweep modes (rules/sweeps.smk).
def sweep_summary_files():
    return [f"{RESULTS}/runs/{gid}/{SWEEP}/cap{cap:g}/summary.json"
            for gid, g in GROUPS.items() for cap in g["caps"]]


def sweep_minutes(wildcards, attempt):
    """SLURM time limit: the one run never outlasts the separate runs it replaces (their
    measured time; one planned start-up for real runs)."""
    seconds = len(GROUPS[wildcards.group]["caps"]) * float(RUN["duration_s"])
    return run_minutes(wildcards.group, attempt, duration_s=seconds, gap_s=0)


def stable_path(path):
    """Data inside the checkout or the working directory as a relative path, so moving the
    checkout changes no input path and reruns nothing; data elsewhere stays absolute."""
    inside = (Path(workflow.basedir).resolve(), Path.cwd().resolve())
    return os.path.relpath(path) if any(Path(path).is_relative_to(d) for d in inside) else str(path)


# ---- Real runs are protected, as root too (README "Real runs are protected") -------------
# protected() is a file mode, and Snakemake decides with os.access(W_OK), which is always
# true for root: as root a changed spec would rerun (overwrite) a measured run and
# --delete-all-output would delete it. So before any job runs, or anything is deleted, the
# recorded spec of every existing real run (run.json: provenance.params_hash of its spec)
# is compared with the spec the config now gives it.
# A changed spec is one reason among many Snakemake may plan a run job (a script's mtime,
# --forcerun, -F, -R, --until): wattflex.runs.protection refuses every planned job of these
# rules whose run directory holds a real run not named in WATTFLEX_REDO_RUNS, before
# Snakemake deletes any output, and drops the script-mtime trigger for real runs.
install_snakemake_guard(["run_at_cap", "run_staircase"])


def recorded_real_runs():
    """{"<group>/<run>": (run.json path, recorded params_hash)} of the campaign's existing
    runs whose recorded backend is not emulated (whatever the config now says)."""
    out = {}
    for path in sorted(Path(f"{RESULTS}/runs").glob("*/*/run.json")):
        try:
            prov = json.loads(path.read_text()).get("provenance", {})
        except (OSError, ValueError):
            continue  # not a wattflex record: Snakemake's own checks apply
        if prov.get("backend", "emulated") != "emulated":
            out[f"{path.parent.parent.name}/{path.parent.name}"] = (str(path), prov.get("params_hash"))
    return out


def current_spec(group, run):
    """The spec the config gives the run at ``group/run`` now; None if it plans no such run."""
    if SWEEP == "separate":
        if any(r["group"] == group and r["run_id"] == run for r in RUNS):
            return run_spec(config, group, run)
    elif run == SWEEP and group in GROUPS:
        return sweep_spec(config, group, run)
    return None


if SOURCE == "generate" and workflow.is_main_process:
    _redo = redo_runs()
    _changed = [(key, path) for key, (path, recorded) in recorded_real_runs().items()
                if key not in _redo and (spec := current_spec(*key.split("/"))) is not None
                and params_hash(canonical(spec)) != recorded]
    if _changed:
        raise WorkflowError(
            f"the spec of {len(_changed)} measured (real-backend) run(s) of campaign '{CAMPAIGN}' changed; "
            f"running would overwrite them: {', '.join(p for _, p in _changed)}. Undo the config change, or give "
            f"it a new campaign: to keep them; to redo them on purpose, run with "
            f"{REDO_ENV}={','.join(k for k, _ in _changed)} (README \"Real runs are protected\").")


def _refuse_deleting_real_runs(delete_output):
    """workflow.delete_output (--delete-all-output / --delete-temp-output) that never
    deletes a real run: Snakemake skips write-protected files, but not as root."""
    def guarded(only_temp=False, dryrun=False):
        real = [p for p, _ in recorded_real_runs().values()] if SOURCE == "generate" else []
        if real and not dryrun:
            raise WorkflowError(
                f"--delete-{'temp' if only_temp else 'all'}-output refused: campaign '{CAMPAIGN}' has "
                f"{len(real)} measured (real-backend) run(s), which are never deleted by the workflow: "
                f"{', '.join(real[:5])}{' ...' if len(real) > 5 else ''}. Delete derived files by hand, or "
                f"move the runs away first (README \"Real runs are protected\").")
        return delete_output(only_temp=only_temp, dryrun=dryrun)
    return guarded


# Snakemake parses the Snakefile, then calls workflow.delete_output: the workflow object
# itself does not know the mode at parse time, so the call is guarded instead.
workflow.delete_output = _refuse_deleting_real_runs(workflow.delete_output)
