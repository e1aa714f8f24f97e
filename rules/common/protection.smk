# Real runs are protected, as root too (docs/reliability.md "Real runs are protected").
# protected() is a file mode, and Snakemake decides with os.access(W_OK), which is always
# true for root: as root a changed spec would rerun (overwrite) a measured run and
# --delete-all-output would delete it. So before any job runs, or anything is deleted, the
# recorded spec of every existing real run (run.json: provenance.params_hash of its spec)
# is compared with the spec the config now gives it.
# A changed spec is one reason among many Snakemake may plan a run job (a script's mtime,
# --forcerun, -F, -R, --until): wattflex.snakemake_internals refuses every planned job of
# these rules whose run directory holds a real run not named in WATTFLEX_REDO_RUNS, before
# Snakemake deletes any output, and drops the script-mtime trigger for real runs.
from wattflex.provenance import params_hash
from wattflex.runs.protection import REDO_ENV, redo_runs
from wattflex.snakemake_internals import guard_delete_output, install_real_run_guard

install_real_run_guard(["run_at_cap", "run_staircase"])


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


def real_run_deletion_refusal(only_temp):
    """Why --delete-*-output may not run: the campaign holds measured runs (Snakemake skips
    write-protected files, but not as root); None when it holds none."""
    real = [p for p, _ in recorded_real_runs().values()] if SOURCE == "generate" else []
    if not real:
        return None
    return (f"--delete-{'temp' if only_temp else 'all'}-output refused: campaign '{CAMPAIGN}' has "
            f"{len(real)} measured (real-backend) run(s), which are never deleted by the workflow: "
            f"{', '.join(real[:5])}{' ...' if len(real) > 5 else ''}. Delete derived files by hand, or "
            f"move the runs away first (README \"Real runs are protected\").")


guard_delete_output(workflow, real_run_deletion_refusal)
