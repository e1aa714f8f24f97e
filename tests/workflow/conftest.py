import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def snakemake(*args: str, cwd: Path, check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run the real snakemake CLI on this repo's Snakefile with ``cwd`` as working directory."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow_scripts")}
    cmd = [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(cwd), *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


@pytest.fixture(scope="session")
def tiny_config() -> Path:
    return REPO / "tests" / "data" / "tiny.yaml"


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tiny_config):
    """The tiny emulated campaign run end to end once per session (real Snakemake)."""
    work = tmp_path_factory.mktemp("tiny")
    snakemake("--cores", "2", "--configfile", str(tiny_config), cwd=work)
    return work / "results" / "tiny"
