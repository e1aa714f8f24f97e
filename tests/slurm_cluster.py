"""The local SLURM of the SLURM tests (tests/slurm/cluster.sh): one cluster per test session,
started by the first test that asks for it, with a partition of its own for each test module
that uses it, so that modules on different pytest-xdist workers run at the same time (each
module stays on one worker: tests/tiers.py), and stopped when the session ends.

Why one cluster and not one per module: the executor's job step strips SLURM_CONF before it
calls srun, so every job reads /etc/slurm/slurm.conf and one machine can hold one such cluster.
Why partitions: a module's jobs, nodes and squeue listings are then its own while others run.
Every job ends with the shipped epilog (real wattflex, an empty cap-record directory); a
wrapper notes each job it ran for, so a test can see that it ran and kept the node up.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.shared_builds import built_once

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "tests" / "slurm" / "cluster.sh"
EPILOG = REPO / "slurm" / "epilog.sh"
NAME = (
    "slurm_cluster"  # built_once's folder (epilog wrapper, its logs) in the session's shared folder
)
# Partition -> (nodes, fake GPUs per node). single: the one-node sweep (tests/workflow/test_slurm.py),
# pair: runs across two nodes (test_slurm_multinode.py), grid: a grid event over a two-node job
# (test_slurm_grid.py), topo: a site of 2 racks x 2 nodes under its electrical limits
# (test_slurm_topology.py), knobs: pause and requeue of harness jobs (test_slurm_knobs.py),
# setcap: the sudo wrapper against real jobs of two users (test_slurm_setcap.py).
# confined: a job on GPUs 4-7 of 8 under modelled device confinement (test_slurm_confined.py).
PARTITIONS = {
    "single": (1, 8),
    "pair": (2, 1),
    "grid": (2, 2),
    "topo": (4, 1),
    "knobs": (1, 2),
    "setcap": (1, 4),
    "confined": (1, 8),
}


def nodes_of(name: str) -> list[str]:
    """Partition ``name``'s node names: cluster.sh numbers the nodes through the partitions in order."""
    first = 0
    for part, (n, _) in PARTITIONS.items():
        if part == name:
            return [f"wattflex-node{i}" for i in range(first, first + n)]
        first += n
    raise KeyError(name)


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: list[str]
    gpus_per_node: int
    epilog_ran: Path  # one SLURM job id per line, for every job the epilog ran for (all partitions)
    epilog_log: Path


def _start(folder: Path) -> None:
    folder.mkdir()
    (folder / "caps").mkdir()
    wrapper = folder / "epilog.sh"
    wrapper.write_text(
        f'#!/bin/bash\necho "$SLURM_JOB_ID" >> {folder / "epilog-ran.txt"}\n'
        f"WATTFLEX={shutil.which('wattflex') or 'wattflex'} WATTFLEX_STATE_DIR={folder / 'caps'} "
        f"WATTFLEX_EPILOG_LOG={folder / 'epilog.log'} exec {EPILOG}\n"
    )
    wrapper.chmod(0o755)
    env = {**os.environ, "WATTFLEX_SLURM_EPILOG": str(wrapper)}
    subprocess.run(
        [str(CLUSTER), "down"], env=env, capture_output=True, text=True
    )  # one left by a killed session
    parts = [a for name, (n, g) in PARTITIONS.items() for a in ("--partition", f"{name}:{n}:{g}")]
    up = subprocess.run([str(CLUSTER), "up", *parts], env=env, capture_output=True, text=True)
    if up.returncode != 0:
        subprocess.run([str(CLUSTER), "down"], capture_output=True)
        raise RuntimeError(f"cluster.sh up failed:\n{up.stdout}\n{up.stderr}")


def partition(tmp_path_factory, name: str) -> Partition:
    """Partition ``name`` of the session's cluster (started if it is not up yet); SLURM_CONF set
    for this process."""
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        pytest.skip(
            "slurmctld/munged not installed (apt-get install slurm-wlm munge): SLURM tests skipped"
        )
    if os.geteuid() != 0:
        pytest.skip("starting a SLURM cluster needs root: SLURM tests skipped")
    folder = built_once(tmp_path_factory, NAME, _start)
    conf = subprocess.run([str(CLUSTER), "env"], capture_output=True, text=True, check=True).stdout
    os.environ["SLURM_CONF"] = conf.strip().split("=", 1)[1]
    nodes = subprocess.run(
        [str(CLUSTER), "nodes", name], capture_output=True, text=True, check=True
    ).stdout.split()
    assert nodes == nodes_of(name), f"partition {name}: nodes {nodes}, expected {nodes_of(name)}"
    return Partition(
        name, nodes, PARTITIONS[name][1], folder / "epilog-ran.txt", folder / "epilog.log"
    )


def pytest_sessionfinish(session):
    """The controller (or the one process without xdist) stops the cluster if a test started it."""
    if hasattr(session.config, "workerinput"):
        return
    # pytest's session temp factory, the one pytest-xdist itself hands the workers their basetemp from
    if (session.config._tmp_path_factory.getbasetemp() / f"{NAME}.built").exists():
        subprocess.run([str(CLUSTER), "down"], capture_output=True, text=True)
