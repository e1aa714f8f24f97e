"""Real runs survive every way Snakemake can plan them, as root and as a non-root user, and a
campaign whose runs all failed fails.

Write protection is a file mode, and Snakemake decides with os.access(W_OK), always true for
root; it also reruns a job whose script is newer than its outputs, or that --forcerun, -F or
-R force. These tests run the real Snakemake CLI on a real-backend (``cuda`` on the CPU, tiny
model) run whose files were made writable again (so no file mode helps) and check that the
workflow itself refuses to overwrite or delete it (wattflex.runs.protection, wattflex.snakemake_internals,
rules/common/protection.smk).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml

from wattflex.runs.failures import failure_summary
from wattflex.telemetry import RunFileError, read_run_files

from .campaigns import copy_workflow, planned, snakemake
from .conftest import REPO

pytestmark = pytest.mark.slow

GROUP = "dense-pt-mistral24b-x8"
RUN_DIR = f"results/tiny/runs/{GROUP}/cap700"
TARGET = f"{RUN_DIR}/run.json"
RUN_FILES = ("telemetry.parquet", "steps.parquet", "run.json")
NOBODY = 65534
as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="tests what root can do (root ignores write protection)"
)


def real_config(path: Path, **cuda) -> Path:
    """One real run: the tiny campaign's first group at 700 W, on the CPU with a tiny model,
    no sampler (no NVML), a few steps."""
    cfg = yaml.safe_load((REPO / "tests" / "data" / "tiny.yaml").read_text())
    cfg["backend"] = "cuda"
    cfg["groups"] = [{**cfg["groups"][0], "caps": [700]}]
    cfg["repeats"] = []
    cfg["run"].update(duration_s=60, eval_at_s=30, checkpoint_at_s=45, sample_period_s=1, retries=0)
    cfg["cuda"] = {
        "device": "cpu",
        "tiny": True,
        "sampler": False,
        "cap_control": "observe",
        "max_steps": 3,
        **cuda,
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def edited(config: Path, dst: Path, change) -> Path:
    cfg = yaml.safe_load(config.read_text())
    change(cfg)
    dst.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return dst


@dataclass
class RealRun:
    workflow: Path  # a copy of the workflow (a test touches its scripts)
    work: Path
    config: Path
    snapshot: dict[str, tuple[bytes, int]]  # {file: (content, mtime_ns)}


def _snapshot(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    return {f: ((run_dir / f).read_bytes(), (run_dir / f).stat().st_mtime_ns) for f in RUN_FILES}


@pytest.fixture(scope="module")
def real_run():
    """One measured run made by the real workflow, in a world-readable folder under /tmp
    (a pytest tmp_path is 0700: another user could not enter it), owned by an unprivileged
    user when the tests run as root; its files are writable again, as after a copy that
    drops file modes, so only the workflow's own guard can keep them."""
    root = Path(tempfile.mkdtemp(prefix="wattflex-real-", dir="/tmp"))
    try:
        os.chmod(root, 0o755)
        workflow = copy_workflow(root / "workflow")
        work = root / "work"
        work.mkdir()
        config = real_config(root / "campaign.yaml")
        snakemake(workflow, work, config, "--cores", "1", TARGET)
        run_dir = work / RUN_DIR
        for f in RUN_FILES:
            os.chmod(run_dir / f, 0o644)
        if os.geteuid() == 0:
            give_to_nobody(root)
        yield RealRun(workflow, work, config, _snapshot(run_dir))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def give_to_nobody(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        os.chown(dirpath, NOBODY, NOBODY)
        for f in files:
            os.chown(os.path.join(dirpath, f), NOBODY, NOBODY)


def unchanged(real: RealRun) -> bool:
    return _snapshot(real.work / RUN_DIR) == real.snapshot


def _user_can_run_the_workflow(real: RealRun) -> str:
    """Why ``NOBODY`` cannot run this checkout's Python and Snakemake ('' if it can): a clone
    under a 0700 folder is out of its reach."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return "needs root and setpriv to act as an unprivileged user"
    probe = subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            sys.executable,
            "-c",
            "import snakemake, wattflex.runs.protection",
        ],
        cwd=real.workflow,
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "HOME": str(real.work),
            "PYTHONPATH": str(real.workflow / "workflow_scripts"),
        },
    )
    return (
        ""
        if probe.returncode == 0
        else (
            f"uid {NOBODY} cannot run {sys.executable} (a folder above it is not world-readable): {probe.stderr[-200:]}"
        )
    )


@pytest.fixture(params=["root_or_current_user", "unprivileged_user"])
def user(request, real_run):
    """None: this process's user (root in CI); NOBODY: an unprivileged user (as root only)."""
    if request.param == "root_or_current_user":
        return None
    why = _user_can_run_the_workflow(real_run)
    if why:
        pytest.skip(why)
    give_to_nobody(real_run.work)  # what Snakemake wrote as root (.snakemake/) is the user's again
    return NOBODY


def run_snakemake(real: RealRun, *args: str, user: int | None = None, env: dict | None = None):
    extra = {k: v for k, v in (env or {}).items()}
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        return snakemake(real.workflow, real.work, real.config, *args, check=False, user=user)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def test_unchanged_spec_of_a_real_run_plans_nothing(real_run, user):
    proc = run_snakemake(real_run, "-n", "--cores", "1", TARGET, user=user)
    assert "Nothing to be done" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


# Every way Snakemake can be told, or can decide, to run run_at_cap again; each
# is refused (wattflex.runs.protection). --forcerun takes a path given to it as a rule name.
FORCING = {
    "forcerun": ["--forcerun", "run_at_cap"],
    "R": ["-R", "run_at_cap"],
    "F": ["-F"],
    "forcerun_with_a_path": ["--forcerun", "run_at_cap", TARGET],
    "force_target": ["--force", TARGET],
    "until": ["-F", "--until", "run_at_cap"],
}


# Each trigger once (a run: what would overwrite); the refusal is made while Snakemake plans
# (wattflex.snakemake_internals), before a dry run and a run part, so a dry run and the
# unprivileged user are each checked on one trigger, not on all six (24 Snakemake calls before).
FORCING_CASES = [
    *[(trigger, False, "root_or_current_user") for trigger in FORCING],
    ("F", True, "root_or_current_user"),
    ("forcerun", False, "unprivileged_user"),
]


@pytest.mark.parametrize(
    "trigger, dry, user",
    FORCING_CASES,
    ids=[f"{t}-{'dry_run' if d else 'run'}-{u}" for t, d, u in FORCING_CASES],
    indirect=["user"],
)
def test_forcing_a_real_run_is_refused(real_run, user, trigger, dry):
    proc = run_snakemake(
        real_run,
        *(["-n"] if dry else []),
        "--cores",
        "1",
        *FORCING[trigger],
        *([] if TARGET in FORCING[trigger] else [TARGET]),
        user=user,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert "refusing to overwrite 1 measured (real-backend) run(s)" in text and TARGET in text, (
        text[-3000:]
    )
    assert f"WATTFLEX_REDO_RUNS={GROUP}/cap700 snakemake --cores all --force {TARGET}" in text, (
        text[-3000:]
    )
    assert "Traceback" not in text, text[-3000:]
    assert unchanged(real_run)


def test_a_newer_rule_script_reruns_no_real_run(real_run, user):
    """What `git pull` / `git checkout` does to the rule scripts: Snakemake reruns a script
    rule whose script is newer than its outputs; a real run depends on its spec alone."""
    for script in ("run_at_cap.py", "run_staircase.py"):
        os.utime(real_run.workflow / "workflow_scripts" / script)
    proc = run_snakemake(real_run, "--cores", "1", TARGET, user=user)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Nothing to be done" in text, text[-3000:]
    assert unchanged(real_run)


def test_the_damaged_run_hint_redoes_exactly_that_run(real_run, user):
    """The command a damaged run file's message gives plans one run_at_cap job and nothing
    else (dry run), for a real run too."""
    run_dir = Path(RUN_DIR)
    with pytest.raises(
        RunFileError
    ) as err:  # as the summary rule reads it, relative to the work dir
        cwd = os.getcwd()
        os.chdir(real_run.work)
        try:
            read_run_files(
                run_dir / "telemetry.parquet",
                run_dir / "missing-steps.parquet",
                run_dir / "run.json",
            )
        finally:
            os.chdir(cwd)
    command = str(err.value).rsplit("redo that run alone: ", 1)[1]
    env, *args = shlex.split(command)
    assert args[:1] == ["snakemake"], command
    key, value = env.split("=", 1)
    proc = run_snakemake(real_run, "-n", *args[1:], user=user, env={key: value})
    assert planned(proc) == {"run_at_cap": 1}, (proc.stdout + proc.stderr)[-3000:]
    assert unchanged(real_run)


@as_root
@pytest.mark.parametrize("dry", [True, False], ids=["dry_run", "run"])
def test_changed_spec_of_a_real_run_is_refused_as_root(real_run, tmp_path, dry):
    changed = edited(
        real_run.config, tmp_path / "changed.yaml", lambda c: c["groups"][0].update(batch=4)
    )
    proc = snakemake(
        real_run.workflow,
        real_run.work,
        changed,
        *(["-n"] if dry else []),
        "--cores",
        "1",
        TARGET,
        check=False,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert "spec of 1 measured (real-backend) run(s) of campaign 'tiny' changed" in text, text[
        -3000:
    ]
    assert TARGET in text and f"WATTFLEX_REDO_RUNS={GROUP}/cap700" in text
    assert "Traceback" not in text
    assert unchanged(real_run)


@as_root
def test_redo_opt_in_plans_the_changed_real_run(real_run, tmp_path, monkeypatch):
    changed = edited(
        real_run.config, tmp_path / "changed.yaml", lambda c: c["groups"][0].update(batch=4)
    )
    monkeypatch.setenv("WATTFLEX_REDO_RUNS", f"{GROUP}/cap700")
    proc = snakemake(real_run.workflow, real_run.work, changed, "-n", "--cores", "1", TARGET)
    assert planned(proc) == {"run_at_cap": 1}, (proc.stdout + proc.stderr)[-3000:]
    assert unchanged(real_run)


@as_root
@pytest.mark.parametrize("mode", ["--delete-all-output", "--delete-temp-output"])
def test_deleting_output_of_a_campaign_with_real_runs_is_refused_as_root(real_run, mode):
    proc = snakemake(
        real_run.workflow, real_run.work, real_run.config, "--cores", "1", mode, TARGET, check=False
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert f"{mode} refused" in text and TARGET in text, text[-3000:]
    assert unchanged(real_run)


def test_a_campaign_whose_runs_all_failed_exits_non_zero_with_a_summary(tmp_path):
    """Every run fails (an attention implementation the model does not have): each leaves a
    failure record, and collect_runs stops the workflow with one paragraph saying why."""
    work = tmp_path / "work"
    work.mkdir()
    config = real_config(tmp_path / "campaign.yaml", attn_implementation="no_such_attention")
    proc = snakemake(REPO, work, config, "--cores", "1", "results/tiny/runs.parquet", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    log = (work / "logs" / "tiny" / "collect_runs.log").read_text()
    assert "no run of the campaign succeeded: all 1 runs failed" in log, log
    assert "no_such_attention" in log and f"first failure record: {TARGET}" in log, log
    assert "Traceback" not in log
    assert not (work / "results" / "tiny" / "runs.parquet").exists()


def test_failure_summary_of_some_failed_runs_names_the_most_common_cause():
    missing = pd.DataFrame(
        {
            "group": ["g", "g", "h"],
            "run_id": ["cap200", "cap300", "cap200"],
            "error": [
                "OOM: out of memory\nlog tail 1",
                "OOM: out of memory\nlog tail 2",
                "RuntimeError: node lost",
            ],
        }
    )
    text = failure_summary(missing, 10, ["results/c/runs/g/cap200/run.json"])
    assert text.startswith("3 of 10 runs failed")
    assert "most common cause (2 of 3 runs): OOM: out of memory;" in text
    assert "first failure record: results/c/runs/g/cap200/run.json" in text
    assert "\n" not in text
