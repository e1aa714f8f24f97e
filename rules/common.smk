# Helpers shared by every rule file: config validation, the sweep table, params slices.
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "workflow_scripts"))

from wattflex.config import ConfigError, expand_runs, groups, prepare, run_spec
from wattflex.provenance import code_fingerprint

try:
    prepare(config, base=Path(workflow.basedir))
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None

CAMPAIGN = config["campaign"]
RESULTS = f"results/{CAMPAIGN}"
RUNS = expand_runs(config)
GROUPS = {g["id"]: g for g in groups(config)}
PAPER_TABLES = str(Path(workflow.basedir) / config.get("paper_tables_dir", "../shared/paper/tables"))


wildcard_constraints:
    campaign=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    group=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    run=r"cap[0-9.]+(_r[0-9]+)?",


def run_dirs(campaign):
    return [f"results/{campaign}/runs/{r['group']}/{r['run_id']}" for r in RUNS]


def summary_files(campaign):
    return [f"{d}/summary.json" for d in run_dirs(campaign)]


def spec_for(wildcards):
    return run_spec(config, wildcards.group, wildcards.run)


def section(name, default=None):
    """The config slice a rule uses (goes into params, so changing it reruns that rule)."""
    return config.get(name, default if default is not None else {})


def representative_run(campaign):
    """The run drawn in the paper's Fig. 2 analog: the first group's uncapped run."""
    first = next(iter(GROUPS.values()))
    return f"results/{campaign}/runs/{first['id']}/cap{max(first['caps']):g}"


def all_outputs(campaign):
    out = [f"results/{campaign}/runs.parquet", f"results/{campaign}/pfi.parquet"]
    out += core_figure_files(campaign)
    out += analysis_outputs(campaign)
    return out
