# What rules put in params (so that changing it reruns them, and nothing else does) and how
# their outputs are declared.
from wattflex.config import SCHEDULING_KEYS, run_spec
from wattflex.fingerprint import script_fingerprint
from wattflex.report_sections import snakemake_category


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
    takes an explicit WATTFLEX_REDO_RUNS (+ unprotect, --force: docs/reliability.md "Real runs are
    protected"). Root ignores file modes: rules/common/protection.smk does not."""
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
