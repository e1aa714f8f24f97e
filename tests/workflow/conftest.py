import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def snakemake(
    *args: str, cwd: Path, check: bool = True, timeout: int = 900
) -> subprocess.CompletedProcess:
    """Run the real snakemake CLI on this repo's Snakefile with ``cwd`` as working directory."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow_scripts")}
    cmd = [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(cwd), *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


@pytest.fixture(scope="session")
def tiny_config() -> Path:
    return REPO / "tests" / "data" / "tiny.yaml"


@pytest.fixture(scope="session")
def tiny_campaign(tmp_path_factory):
    """The tiny emulated campaign run end to end (real Snakemake): the finished campaign the rerun
    and relocation tests copy (tests/workflow/campaigns.py, built once per session), copied once
    for the tests on this worker that read it, so their dry runs never meet another's copy."""
    from .campaigns import Campaign, copy_tree, finished_campaign

    root = tmp_path_factory.mktemp("tiny") / "campaign"
    copy_tree(finished_campaign(tmp_path_factory), root)
    return Campaign(root, root, root / "tiny.yaml")


@pytest.fixture(scope="session")
def tiny_run(tiny_campaign) -> Path:
    """The tiny campaign's results folder."""
    return tiny_campaign.work / "results" / "tiny"
