"""A damaged run file through the real workflow: the summarize_run job fails with
the one line naming the file, never a pyarrow traceback. (The readers' own checks:
tests/unit/test_entry_points.py.)"""

import os
import subprocess
import sys

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow
ENV = {**os.environ, "PYTHONPATH": str(REPO / "workflow_scripts")}


def test_summarize_rule_on_a_corrupt_telemetry_says_which_file(tmp_path):
    """Through Snakemake: the summarize_run job fails with the one line, no pyarrow traceback."""
    target = "results/tiny/runs/dense-pt-mistral24b-x8/cap600"
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(tmp_path),
        "--configfile",
        str(REPO / "tests" / "data" / "tiny.yaml"),
        "--cores",
        "1",
    ]
    subprocess.run(
        [*cmd, f"{target}/run.json"],
        cwd=tmp_path,
        env=ENV,
        check=True,
        capture_output=True,
        timeout=600,
    )
    tel = tmp_path / target / "telemetry.parquet"
    tel.chmod(0o644)
    tel.write_bytes(tel.read_bytes()[:200])
    proc = subprocess.run(
        [*cmd, f"{target}/summary.json"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0
    expected = f"{target}/telemetry.parquet: not a readable parquet file ("
    log = (tmp_path / "logs/tiny/summaries/dense-pt-mistral24b-x8/cap600.log").read_text()
    assert expected in log and "Traceback" not in log, log
    assert (
        f"summarize_run: error: {expected}" in proc.stderr and "ArrowInvalid" not in proc.stderr
    ), proc.stderr[-3000:]
