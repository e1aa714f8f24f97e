"""`wattflex doctor --configfile F` judges what `snakemake --configfile F` runs: F merged onto
config/config.yaml (F alone lacks what config.yaml gives, such as the cap grid)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import REPO, snakemake

pytestmark = pytest.mark.slow

PARTIAL = """campaign: mine
groups:
  - {id: g1, model: Mistral-Small-24B-Base-2501, task: pt, gpus: 8}
repeats: []
"""


def test_doctor_and_snakemake_agree_on_a_partial_config(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(PARTIAL)  # cap_grid, run, summary ... come from config/config.yaml
    # The Snakefile's `configfile: "config/config.yaml"` is found in the working directory, as
    # when snakemake runs in the checkout.
    (tmp_path / "config").symlink_to(REPO / "config")
    assert snakemake("-n", "--cores", "1", "--configfile", str(cfg), cwd=tmp_path).returncode == 0
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "wattflex.cli",
            "doctor",
            "--json",
            "--configfile",
            str(cfg),
            "--state-dir",
            str(tmp_path / "st"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "workflow_scripts"), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert "config error" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["config"]["path"] == str(cfg), proc.stdout[-2000:]
