"""Bad and partial campaign configs through a real ``snakemake -n``: the one-line
config error names the key, and the merge onto config/config.yaml is said once. (The checks
without Snakemake: tests/unit/test_config_input.py.)"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import REPO

pytestmark = pytest.mark.slow

TINY = REPO / "tests" / "data" / "tiny.yaml"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """A dry run in ``workdir``, which holds a copy of config/ as a checkout does (the
    Snakefile's ``configfile: "config/config.yaml"`` is relative to the working directory)."""
    shutil.copytree(REPO / "config", workdir / "config", dirs_exist_ok=True)
    exe = Path(sys.executable).parent / "snakemake"
    return subprocess.run(
        [str(exe), "-s", str(REPO / "Snakefile"), "-d", str(workdir), "-n", "--cores", "1", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def test_dry_run_of_a_cuda_campaign_without_weights_fails_naming_the_key(tmp_path):
    cfg = load(TINY)
    cfg.update(campaign="tiny-cuda", backend="cuda", cuda={"modle_path": "/models/mistral"})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    proc = _snakemake(tmp_path, "--configfile", str(tmp_path / "c.yaml"))
    assert proc.returncode != 0
    assert (
        "config error at cuda: unknown key 'modle_path' (did you mean 'model_path'?)"
        in proc.stdout + proc.stderr
    )
    cfg["cuda"] = {"cap_control": "nvml"}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    proc = _snakemake(tmp_path, "--configfile", str(tmp_path / "c.yaml"))
    assert proc.returncode != 0
    assert "config error at cuda.model_path: missing: no model weights" in proc.stdout + proc.stderr


def test_dry_run_says_which_sections_came_from_the_default_config(tmp_path):
    cfg = load(TINY)
    cfg.update(backend="cuda", cuda={"tiny": True})  # a complete measured campaign
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    proc = _snakemake(tmp_path, "--configfile", str(tmp_path / "c.yaml"))
    lines = [
        ln
        for ln in (proc.stdout + proc.stderr).splitlines()
        if ln.startswith("wattflex: sections not in")
    ]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert (
        "come from config/config.yaml: control " in lines[0]
    )  # the rest it leaves out: the schema's defaults
    assert "--replace-workflow-config" in lines[0]
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_dry_run_of_emulated_runs_too_short_to_train_stops_at_once_naming_the_group(tmp_path):
    """Refused before any run starts (it used to fail after all of them, none summarised)."""
    cfg = load(TINY)
    cfg["run"].update(duration_s=200, eval_at_s=None, checkpoint_at_s=None)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    proc = _snakemake(tmp_path, "--configfile", str(tmp_path / "c.yaml"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (
        "config error at run.duration_s: 200 s is too short for groups[0] "
        "('dense-pt-mistral24b-x8') on the emulated backend" in out
    ), out[-2000:]
    # the minimum it names is the emulator's (runs.emulator.timeline.shortest_run_s); long
    # enough for every group, the campaign plans
    need = re.search(r"use at least (\d+) s", out)
    assert need and 200 < int(need.group(1)) <= 300, out[-2000:]
    cfg["run"]["duration_s"] = 300
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert _snakemake(tmp_path, "--configfile", str(tmp_path / "c.yaml")).returncode == 0
