import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESOURCES = REPO / "resources"  # published data shipped with the repository
sys.path.insert(0, str(REPO / "workflow_scripts"))
os.environ.setdefault("MPLBACKEND", "Agg")

# the suites (unit, integration, conformance), and the guard that keeps them apart; the SLURM tests' cluster, stopped at the end
pytest_plugins = ["tests.tiers", "tests.slurm_cluster"]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def resources() -> Path:
    return RESOURCES


@pytest.fixture(scope="session")
def default_config():
    from wattflex.config import load_config

    return load_config(REPO / "config" / "config.yaml")
