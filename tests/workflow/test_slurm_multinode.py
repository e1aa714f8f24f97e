"""A real run across two SLURM nodes, through the workflow: tests/slurm/cluster.sh ``--nodes 2``
(two slurmd on this machine, one FAKE GPU each), the real executor plugin with the shipped
profile, ``backend: cuda`` with ``device: cpu``: one tiny model trained by torchrun on gloo,
one process per node, rendezvous through c10d on the first node. Each node's agent caps,
samples and restores its node's FAKE NVML GPU (tests/fakes/fake_pynvml.py, one state file per
node, imported as ``pynvml`` through tests/fakes/pynvml_path in the SLURM steps).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.fakes import fake_pynvml
from wattflex.provenance import read_json, read_parquet

from .conftest import REPO, SNAKEMAKE
from .test_slurm import SLURM_ARGS, job_field, local_cluster, squeue

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
NODES = ["wattflex-node0", "wattflex-node1"]
CAP_W = 400


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    with local_cluster(tmp_path_factory.mktemp("slurm2"), ngpus=1, nnodes=2) as cluster:
        yield cluster


def fake_gpus(tmp: Path) -> str:
    """One FAKE H200 per node, each node's in its own file; the FAKE_PYNVML_STATE template."""
    template = str(tmp / "gpus-{node}.json")
    old = os.environ.get("SLURMD_NODENAME")
    try:
        for node in NODES:
            os.environ["SLURMD_NODENAME"] = node
            fake_pynvml.reset(n_gpus=1, path=template)
    finally:
        fake_pynvml.reset()
        if old is not None:
            os.environ["SLURMD_NODENAME"] = old
        else:
            os.environ.pop("SLURMD_NODENAME", None)
    return template


def node_state(tmp: Path, node: str) -> dict:
    return json.loads((tmp / f"gpus-{node}.json").read_text())


@pytest.fixture(scope="module")
def two_node_run(two_nodes, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multinode")
    template = fake_gpus(tmp)
    config = {
        "campaign": "mn", "backend": "cuda", "models_catalog": str(REPO / "config" / "models.yaml"), "seed": 1,
        "run": {"duration_s": 60, "sample_period_s": 0.5, "eval_at_s": 0, "checkpoint_at_s": 0, "gap_s": 0},
        "cap_grids": {"one": [CAP_W]},
        "group_defaults": {"gpu": "H200", "set": "headline", "seq_len": 32, "batch": 2, "ep": 1, "compile": False,
                           "grad_checkpointing": False, "cap_grid": "one"},
        "groups": [{"id": "dense-pt-llama70b-x2", "model": "Llama-3.1-70B", "task": "pt", "gpus": 2}],
        "repeats": [],
        "cuda": {"device": "cpu", "tiny": True, "cap_control": "nvml", "sampler": True, "sampler_period_s": 0.5,
                 "nproc_per_node": 1, "nnodes": 2, "state_dir": str(tmp / "caps"), "eval_batches": 1,
                 "max_steps": 8},
    }
    cfg_path = tmp / "mn.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    work = tmp / "work"
    work.mkdir()
    target = f"results/mn/runs/dense-pt-llama70b-x2/cap{CAP_W}/run.json"
    # Both CPUs of each node (its step should get them all: launch facts below).
    args = [a.replace("cpus_per_task=1", "cpus_per_task=2") for a in SLURM_ARGS]
    # This cluster's nodes have one GPU each (replaces the profile's --config).
    args += ["--config", "slurm_gpus_per_node=1", "slurm_gpu_model=gpu_model"]
    env = {**os.environ, "FAKE_PYNVML_STATE": template,
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "fakes" / "pynvml_path"), str(REPO / "workflow_scripts")])}
    before = {j[0] for j in squeue()}
    proc = subprocess.run([*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "--directory", str(work), target, *args,
                           "--configfile", str(cfg_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=420)
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(work.rglob("*.log")))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}\n{logs}"
    jobs = [j for j in squeue("%i|%T|%k") if j[0] not in before]
    return {"tmp": tmp, "run_dir": work / Path(target).parent, "jobs": jobs}


def test_one_run_is_one_slurm_job_on_both_nodes(two_node_run, two_nodes):
    (jobid, state, comment), = two_node_run["jobs"]
    assert state == "COMPLETED" and comment.startswith("rule_run_at_cap_")
    assert job_field(jobid, "NumNodes") == "2" and job_field(jobid, "NodeList") == "wattflex-node[0-1]"
    assert job_field(jobid, "TresPerJob") == "gres:gpu:h200:2"
    assert jobid in two_nodes["epilog_ran"].read_text().split()      # the epilog ran (on each node)


def test_torchrun_trained_across_both_nodes(two_node_run):
    run = read_json(two_node_run["run_dir"] / "run.json")
    assert run["training"]["world_size"] == 2
    steps = read_parquet(two_node_run["run_dir"] / "steps.parquet")
    assert len(steps) >= 2 and steps["loss"].notna().all()
    nodes = run["nodes"]
    assert [n["node_rank"] for n in nodes] == [0, 1] and [n["host"] for n in nodes] == NODES
    for n in nodes:
        launch = n["launch"]
        # One srun step: each node's agent got its node's GPU and all the job's CPUs there.
        assert launch["slurm_step_id"] == "0" and launch["slurm_step_gpus"] == "0"
        assert launch["slurm_cpus_on_node"] == "2"
        assert n["nccl_env"] == {"NCCL_DEBUG": "WARN"}


def test_fake_nvml_caps_set_and_restored_on_both_nodes(two_node_run):
    run = read_json(two_node_run["run_dir"] / "run.json")
    assert run["original_limit_w"] == [700.0, 700.0]
    assert run["enforced_limit_w"] == [float(CAP_W)] * 2 and run["power_limit_w"] == [float(CAP_W)] * 2
    for n in run["nodes"]:
        assert [g["power_limit_w"] for g in n["gpus_after_set"]] == [float(CAP_W)]
        assert n["gpus_after_restore"] == [{"index": 0, "power_limit_w": 700.0}]
    tel = read_parquet(two_node_run["run_dir"] / "telemetry.parquet")
    assert sorted(tel["node"].unique()) == NODES and (tel["power_limit_w"] == CAP_W).all()
    for node in NODES:           # each node's FAKE GPU is back at its original limit
        state = node_state(two_node_run["tmp"], node)
        assert state["gpus"][0]["limit_mw"] == 700_000
        assert [c[1] for c in state["set_calls"]] == [CAP_W * 1000, 700_000]
    assert not list((two_node_run["tmp"] / "caps").glob("caps-*.json"))
