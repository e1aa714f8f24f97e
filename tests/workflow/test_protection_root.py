"""Real runs survive as root too, and a campaign whose runs all failed fails (issue 17).

Write protection is a file mode, and Snakemake decides with os.access(W_OK), always true for
root: these tests run Snakemake as root on a real-backend (``cuda`` on the CPU, tiny model)
run and check that the workflow itself refuses to overwrite or delete it (rules/common.smk).
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from wattflex.runs.failures import failure_summary

from .conftest import REPO
from .test_rerun_scope import snakemake

pytestmark = pytest.mark.slow

GROUP = "dense-pt-mistral24b-x8"
TARGET = f"results/tiny/runs/{GROUP}/cap700/run.json"
RUN_FILES = ("telemetry.parquet", "steps.parquet", "run.json")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="tests what root can do (root ignores write protection)")


def real_config(path: Path, **cuda) -> Path:
    """One real run: the tiny campaign's first group at 700 W, on the CPU with a tiny model,
    no sampler (no NVML), a few steps."""
    cfg = yaml.safe_load((REPO / "tests" / "data" / "tiny.yaml").read_text())
    cfg["backend"] = "cuda"
    cfg["groups"] = [{**cfg["groups"][0], "caps": [700]}]
    cfg["repeats"] = []
    cfg["run"].update(duration_s=60, eval_at_s=30, checkpoint_at_s=45, sample_period_s=1, retries=0)
    cfg["cuda"] = {"device": "cpu", "tiny": True, "sampler": False, "cap_control": "observe", "max_steps": 3, **cuda}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def edited(config: Path, dst: Path, change) -> Path:
    cfg = yaml.safe_load(config.read_text())
    change(cfg)
    dst.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return dst


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """(work dir, config, {file: bytes}) of one measured run, made by the real workflow."""
    root = tmp_path_factory.mktemp("real")
    work = root / "work"
    work.mkdir()
    config = real_config(root / "campaign.yaml")
    snakemake(REPO, work, config, "--cores", "1", TARGET)
    run_dir = work / TARGET.rsplit("/", 1)[0]
    snapshot = {f: (run_dir / f).read_bytes() for f in RUN_FILES}
    return work, config, snapshot


def unchanged(work: Path, snapshot: dict[str, bytes]) -> bool:
    run_dir = work / TARGET.rsplit("/", 1)[0]
    return all((run_dir / f).read_bytes() == data for f, data in snapshot.items())


@as_root
def test_unchanged_spec_of_a_real_run_plans_nothing(real_run):
    work, config, _ = real_run
    proc = snakemake(REPO, work, config, "-n", "--cores", "1", TARGET)
    assert "Nothing to be done" in proc.stdout + proc.stderr


@as_root
@pytest.mark.parametrize("dry", [True, False], ids=["dry_run", "run"])
def test_changed_spec_of_a_real_run_is_refused_as_root(real_run, tmp_path, dry):
    work, config, snapshot = real_run
    changed = edited(config, tmp_path / "changed.yaml", lambda c: c["groups"][0].update(batch=4))
    proc = snakemake(REPO, work, changed, *(["-n"] if dry else []), "--cores", "1", TARGET, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert "spec of 1 measured (real-backend) run(s) of campaign 'tiny' changed" in text, text[-3000:]
    assert TARGET in text and f"WATTFLEX_REDO_RUNS={GROUP}/cap700" in text
    assert "Traceback" not in text
    assert unchanged(work, snapshot)


@as_root
def test_redo_opt_in_plans_the_changed_real_run(real_run, tmp_path, monkeypatch):
    work, config, snapshot = real_run
    changed = edited(config, tmp_path / "changed.yaml", lambda c: c["groups"][0].update(batch=4))
    monkeypatch.setenv("WATTFLEX_REDO_RUNS", f"{GROUP}/cap700")
    proc = snakemake(REPO, work, changed, "-n", "--cores", "1", TARGET)
    assert "run_at_cap" in proc.stdout + proc.stderr
    assert unchanged(work, snapshot)


@as_root
@pytest.mark.parametrize("mode", ["--delete-all-output", "--delete-temp-output"])
def test_deleting_output_of_a_campaign_with_real_runs_is_refused_as_root(real_run, mode):
    work, config, snapshot = real_run
    proc = snakemake(REPO, work, config, "--cores", "1", mode, TARGET, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert f"{mode} refused" in text and TARGET in text, text[-3000:]
    assert unchanged(work, snapshot)


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
    missing = pd.DataFrame({"group": ["g", "g", "h"], "run_id": ["cap200", "cap300", "cap200"],
                            "error": ["OOM: out of memory\nlog tail 1", "OOM: out of memory\nlog tail 2",
                                      "RuntimeError: node lost"]})
    text = failure_summary(missing, 10, ["results/c/runs/g/cap200/run.json"])
    assert text.startswith("3 of 10 runs failed")
    assert "most common cause (2 of 3 runs): OOM: out of memory;" in text
    assert "first failure record: results/c/runs/g/cap200/run.json" in text
    assert "\n" not in text
