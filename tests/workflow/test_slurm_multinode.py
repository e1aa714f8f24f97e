"""A real run across two SLURM nodes, through the workflow: the two-node partition of the
session's SLURM (tests/slurm_cluster.py: two slurmd on this machine, one FAKE GPU each), the
real executor plugin with the shipped profile, ``backend: cuda`` with ``device: cpu``: one
tiny model trained by torchrun on gloo,
one process per node, rendezvous through c10d on the first node. Each node's agent caps,
samples and restores its node's FAKE NVML GPU (tests/fakes/fake_pynvml.py, one state file per
node, imported as ``pynvml`` through tests/fakes/pynvml_path in the SLURM steps). One test
runs the user's own script (tests/data/own_job) on one of the nodes: a job that ignores SIGTERM,
scancel'ed under the cluster's KillWait of 5 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.fakes import fake_pynvml
from tests.slurm_cluster import Partition, nodes_of, partition
from tests.unit.runs.test_real_run import _cmdline_has
from wattflex.provenance import read_json, read_parquet
from wattflex.telemetry import job_series

from .conftest import REPO, SNAKEMAKE
from .test_slurm import job_field, slurm_args
from .test_slurm import squeue as squeue_all

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PARTITION = "pair"
NODES = nodes_of(PARTITION)
GROUP = "dense-pt-llama70b-x2"
CAP_W = 400


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> Partition:
    return partition(tmp_path_factory, PARTITION)


def squeue(fmt: str = "%i|%T|%r|%S|%e|%k") -> list[list[str]]:
    return squeue_all(fmt, PARTITION)


def fake_gpus(tmp: Path, n_gpus: int = 1, nodes: list[str] = NODES) -> str:
    """``n_gpus`` FAKE H200s per node of ``nodes`` (one unless told), each node's in its own file;
    the FAKE_PYNVML_STATE template."""
    template = str(tmp / "gpus-{node}.json")
    old = os.environ.get("SLURMD_NODENAME")
    try:
        for node in nodes:
            os.environ["SLURMD_NODENAME"] = node
            fake_pynvml.reset(n_gpus=n_gpus, path=template)
    finally:
        fake_pynvml.reset()
        if old is not None:
            os.environ["SLURMD_NODENAME"] = old
        else:
            os.environ.pop("SLURMD_NODENAME", None)
    return template


def node_state(tmp: Path, node: str) -> dict:
    return json.loads((tmp / f"gpus-{node}.json").read_text())


def campaign(tmp: Path, caps: list[int], config: dict | None = None, **cuda) -> Path:
    """A cuda campaign of one 2-GPU group on the 2-node cluster (one process per node, cpu)."""
    config = {
        "campaign": "mn",
        "backend": "cuda",
        "models_catalog": str(REPO / "config" / "models.yaml"),
        "seed": 1,
        "run": {
            "duration_s": 60,
            "sample_period_s": 0.5,
            "eval_at_s": 0,
            "checkpoint_at_s": 0,
            "gap_s": 0,
        },
        "cap_grids": {"grid": caps},
        "group_defaults": {
            "gpu": "H200",
            "set": "headline",
            "seq_len": 32,
            "batch": 2,
            "ep": 1,
            "compile": False,
            "grad_checkpointing": False,
            "cap_grid": "grid",
        },
        "groups": [{"id": GROUP, "model": "Llama-3.1-70B", "task": "pt", "gpus": 2}],
        "repeats": [],
        "cuda": {
            "device": "cpu",
            "tiny": True,
            "cap_control": "nvml",
            "sampler": True,
            "sampler_period_s": 0.5,
            "nproc_per_node": 1,
            "nnodes": 2,
            "state_dir": str(tmp / "caps"),
            "eval_batches": 1,
            **cuda,
        },
        **(config or {}),
    }
    path = tmp / "mn.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def workflow(tmp: Path, config: Path, target: str) -> tuple[list[str], dict[str, str], Path]:
    """The snakemake command, environment and working directory that make ``target`` through
    the SLURM profile on the 2-node cluster, FAKE NVML GPUs (one per node) made fresh."""
    template = fake_gpus(tmp)
    work = tmp / "work"
    work.mkdir()
    # Both CPUs of each node (its step should get them all: launch facts below).
    args = [a.replace("cpus_per_task=1", "cpus_per_task=2") for a in slurm_args(PARTITION)]
    # This cluster's nodes have one GPU each (replaces the profile's --config).
    args += ["--config", "slurm_gpus_per_node=1", "slurm_gpu_model=gpu_model"]
    env = {
        **os.environ,
        "FAKE_PYNVML_STATE": template,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "tests" / "fakes" / "pynvml_path"), str(REPO / "workflow_scripts")]
        ),
    }
    cmd = [
        *SNAKEMAKE,
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(work),
        target,
        *args,
        "--configfile",
        str(config),
    ]
    return cmd, env, work


def run_workflow(tmp: Path, config: Path, target: str) -> dict:
    """``target`` through the SLURM profile on the 2-node cluster; the run's directory and jobs."""
    cmd, env, work = workflow(tmp, config, target)
    before = {j[0] for j in squeue()}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=420)
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(work.rglob("*.log")))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}\n{logs}"
    jobs = [j for j in squeue("%i|%T|%k") if j[0] not in before]
    return {"tmp": tmp, "run_dir": work / Path(target).parent, "jobs": jobs}


@pytest.fixture(scope="module")
def two_node_run(two_nodes, tmp_path_factory):
    """One run at CAP_W (8 steps)."""
    tmp = tmp_path_factory.mktemp("multinode")
    return run_workflow(
        tmp, campaign(tmp, [CAP_W], max_steps=8), f"results/mn/runs/{GROUP}/cap{CAP_W}/run.json"
    )


def test_one_run_is_one_slurm_job_on_both_nodes(two_node_run, two_nodes):
    ((jobid, state, comment),) = two_node_run["jobs"]
    assert state == "COMPLETED" and comment.startswith("rule_run_at_cap_")
    hostlist = subprocess.run(
        ["scontrol", "show", "hostlist", ",".join(NODES)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()  # wattflex-node[1-2]
    assert job_field(jobid, "NumNodes") == "2" and job_field(jobid, "NodeList") == hostlist
    # a per-node split (1 GPU on each of the 2 nodes), not a job total SLURM may split unevenly
    assert job_field(jobid, "TresPerNode") == "gres:gpu:h200:1"
    assert job_field(jobid, "TresPerJob") == ""
    assert job_field(jobid, "NumTasks") == "2" and job_field(jobid, "NtasksPerN:B:S:C").startswith(
        "1:"
    )
    assert jobid in two_nodes.epilog_ran.read_text().split()  # the epilog ran (on each node)


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
    assert (
        run["enforced_limit_w"] == [float(CAP_W)] * 2 and run["power_limit_w"] == [float(CAP_W)] * 2
    )
    for n in run["nodes"]:
        assert [g["power_limit_w"] for g in n["gpus_after_set"]] == [float(CAP_W)]
        assert n["gpus_after_restore"] == [{"index": 0, "power_limit_w": 700.0}]
    tel = read_parquet(two_node_run["run_dir"] / "telemetry.parquet")
    assert sorted(tel["node"].unique()) == NODES and (tel["power_limit_w"] == CAP_W).all()
    # Both nodes' samples on one grid: every job-level sample sums both GPUs.
    series = job_series(tel)
    assert len(series) >= 10 and (series["n_gpus"] == 2).all()
    for node in NODES:  # each node's FAKE GPU is back at its original limit
        state = node_state(two_node_run["tmp"], node)
        assert state["gpus"][0]["limit_mw"] == 700_000
        assert [c[1] for c in state["set_calls"]] == [CAP_W * 1000, 700_000]
    assert not list((two_node_run["tmp"] / "caps").glob("caps-*.json"))


# ---- the staircase across both nodes ----------------------------------------------------------
STAIRCASE_CAPS = [300, 450, 600]  # below the FAKE GPUs' 700 W, so each set and the restore show
# Loose enough for CPU step-time noise (tests/unit/runs/sweep/test_sweep_real.py): control flow, not precision.
CRITERIA = {
    "target_rel_se": 0.5,
    "min_settle_s": 0.3,
    "min_samples": 4,
    "min_steps": 2,
    "max_dwell_s": 8.0,
}


@pytest.fixture(scope="module")
def two_node_staircase(two_nodes, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multinode-staircase")
    config = campaign(tmp, STAIRCASE_CAPS, {"sweep": "staircase", "staircase": CRITERIA})
    return run_workflow(tmp, config, f"results/mn/runs/{GROUP}/staircase/run.json")


def test_staircase_steps_both_nodes_through_every_cap_and_restores_both(two_node_staircase):
    run_dir = two_node_staircase["run_dir"]
    run = read_json(run_dir / "run.json")
    assert run["stop_reason"] == "all_caps_measured" and run["training"]["world_size"] == 2
    assert [v["cap_w"] for v in run["visits"]] == STAIRCASE_CAPS
    tel = read_parquet(run_dir / "telemetry.parquet")
    series = job_series(tel)
    assert (series["n_gpus"] == 2).all()
    period = read_json(run_dir / "run.json")["telemetry"]["period_s"]
    for visit in run["visits"]:  # each window measured at its own cap, on both nodes
        # (a sample is labelled up to one period before it was read: align_nodes)
        window = tel[(tel.t_s >= visit["t_settled_s"]) & (tel.t_s <= visit["t_end_s"] - period)]
        assert sorted(window["node"].unique()) == NODES
        assert (window["power_limit_w"] == visit["cap_w"]).all()
    for node in NODES:
        state = node_state(two_node_staircase["tmp"], node)
        assert state["gpus"][0]["limit_mw"] == 700_000
        # The guard set the lowest cap, the controller each of the others, then the original back.
        assert [c[1] / 1000 for c in state["set_calls"]] == [300.0, 450.0, 600.0, 700.0]
    for n in run["nodes"]:
        assert n["gpus_after_restore"] == [{"index": 0, "power_limit_w": 700.0}]
    assert not list((two_node_staircase["tmp"] / "caps").glob("caps-*.json"))
    assert not list(run_dir.glob(".node*")) and not (run_dir / ".sweep_cap.json").exists()


def scancel_while_training(
    tmp: Path,
    cmd: list[str],
    env: dict[str, str],
    work: Path,
    step_line: str,
    every_node: bool = True,
) -> tuple[str, str]:
    """Start the workflow, wait until every node (else: one) is capped at CAP_W and a train.log
    shows ``step_line``, then scancel the run's job; its id and the workflow's output once it failed."""
    before = {j[0] for j in squeue()}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    capped = all if every_node else any
    try:
        deadline = time.monotonic() + 180
        while not (
            capped(node_state(tmp, n)["gpus"][0]["limit_mw"] == CAP_W * 1000 for n in NODES)
            and any(step_line in p.read_text(errors="replace") for p in work.rglob("train*.log"))
        ):
            assert time.monotonic() < deadline and proc.poll() is None, (
                "the run never trained capped"
            )
            time.sleep(0.3)
        ((jobid, _, _),) = [j for j in squeue("%i|%T|%k") if j[0] not in before]
        subprocess.run(["scancel", jobid], check=True)
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, output[-3000:]
    return jobid, output


def left_alive(work: Path, grace_s: float = 5 + 10) -> list[str]:
    """The command lines of processes of the run in ``work`` still alive after ``grace_s``: the
    workflow can fail before slurmstepd has reaped the job's steps (SIGKILL comes KillWait = 5 s
    after SIGTERM, tests/slurm/cluster.sh), so a leak is what outlives that, plus a margin for load."""
    deadline = time.monotonic() + grace_s
    while True:
        left = [p for p in Path("/proc").glob("[0-9]*") if _cmdline_has(p, str(work))]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    lines = []
    for p in left:
        try:
            lines.append((p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass  # gone since
    return lines


def test_scancel_mid_run_restores_the_caps_on_both_nodes(two_nodes, tmp_path):
    """A run cancelled while it trains (scancel: SIGTERM to the batch script and to each node's
    agent): each agent stops its training and restores its own node's GPU."""
    config = campaign(
        tmp_path,
        [CAP_W],
        {
            "run": {
                "duration_s": 300,
                "sample_period_s": 0.5,
                "eval_at_s": 0,
                "checkpoint_at_s": 0,
                "gap_s": 0,
                "retries": 0,
            }
        },
    )
    cmd, env, work = workflow(tmp_path, config, f"results/mn/runs/{GROUP}/cap{CAP_W}/run.json")
    _, output = scancel_while_training(tmp_path, cmd, env, work, "step 2 ")
    for node in NODES:
        state = node_state(tmp_path, node)
        assert state["gpus"][0]["limit_mw"] == 700_000, output[-3000:]
        assert [c[1] for c in state["set_calls"]] == [CAP_W * 1000, 700_000]
    assert not list(
        (tmp_path / "caps").glob("caps-*.json")
    )  # restored by the agents, not left for the epilog
    left = left_alive(work)
    assert not left, f"processes of the cancelled run are still alive: {left}"


OWN_JOB = REPO / "tests" / "data" / "own_job" / "train_tiny_lm.py"


def test_scancel_of_a_job_that_ignores_sigterm_restores_the_caps_before_killwait(
    two_nodes, tmp_path
):
    """scancel of a run whose training ignores SIGTERM (the user's own script, command backend,
    one node of the pair): stopping it takes the agent's whole grace (30 s), far past the
    cluster's KillWait (5 s, tests/slurm/cluster.sh), so SLURM SIGKILLs the agent. The caps
    are back by then, put back by the agent itself (its state file gone; the epilog reads
    another state folder and has no FAKE NVML), not left capped for the epilog."""
    group = {
        "id": "dense-pt-own-tinylm-x1",
        "model": "Mistral-Small-24B-Base-2501",
        "task": "pt",
        "gpus": 1,
        "command": {
            "launch": [
                sys.executable,
                str(OWN_JOB),
                "--steps",
                "1000000",
                "--step-s",
                "0.1",
                "--ignore-term",
            ],
            "throughput": {"preset": "torchtitan"},
        },
    }
    config = campaign(
        tmp_path,
        [CAP_W],
        {
            "groups": [group],
            "run": {
                "duration_s": 300,
                "sample_period_s": 0.5,
                "eval_at_s": 0,
                "checkpoint_at_s": 0,
                "gap_s": 0,
                "retries": 0,
            },
        },
        nnodes=1,
        tiny=False,
    )
    cmd, env, work = workflow(
        tmp_path, config, f"results/mn/runs/{group['id']}/cap{CAP_W}/run.json"
    )
    jobid, output = scancel_while_training(tmp_path, cmd, env, work, "step:  2 ", every_node=False)
    (node,) = [n for n in NODES if node_state(tmp_path, n)["set_calls"]]
    state = node_state(tmp_path, node)
    assert state["gpus"][0]["limit_mw"] == 700_000, output[-3000:]
    assert [c[1] for c in state["set_calls"]] == [CAP_W * 1000, 700_000]
    assert not list(
        (tmp_path / "caps").glob("caps-*.json")
    )  # the agent's own restore, not the epilog's
    assert jobid in two_nodes.epilog_ran.read_text().split()  # the job did end (its epilog ran)
    left = left_alive(work)
    assert not left, f"processes of the cancelled run are still alive: {left}"


def test_a_cap_one_node_refuses_mid_staircase_ends_the_sweep_restored_on_both(two_nodes, tmp_path):
    """Node 1's GPU refuses the second cap (FAKE NVML NoPermission for 450 W only): its agent
    reports the error and exits, the controller's sweep fails with it, and both nodes' GPUs
    are back at their original limit (node 0's agent stopped by srun, node 1's by the error)."""
    config = campaign(
        tmp_path,
        STAIRCASE_CAPS,
        {
            "sweep": "staircase",
            "staircase": CRITERIA,
            "run": {
                "duration_s": 60,
                "sample_period_s": 0.5,
                "eval_at_s": 0,
                "checkpoint_at_s": 0,
                "gap_s": 0,
                "retries": 0,
            },
        },
    )
    cmd, env, work = workflow(tmp_path, config, f"results/mn/runs/{GROUP}/staircase/run.json")
    state_path = tmp_path / f"gpus-{NODES[1]}.json"
    state = json.loads(state_path.read_text())
    state["gpus"][0]["deny_set_mw"] = [450_000]
    state_path.write_text(json.dumps(state))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=420)
    log = (work / f"logs/mn/runs/{GROUP}/staircase.log").read_text(errors="replace")
    assert proc.returncode != 0 and "node 1: " in log and "450" in log, log[-3000:]
    for node, sets in zip(NODES, ([300_000, 450_000, 700_000], [300_000, 700_000])):
        s = node_state(tmp_path, node)
        assert s["gpus"][0]["limit_mw"] == 700_000 and [c[1] for c in s["set_calls"]] == sets, log[
            -3000:
        ]
    assert not list((tmp_path / "caps").glob("caps-*.json"))
    left = [p for p in Path("/proc").glob("[0-9]*") if _cmdline_has(p, str(work))]
    assert not left, "processes of the failed sweep are still alive"
