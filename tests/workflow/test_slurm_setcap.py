"""The sudo wrapper (slurm/wattflex-setcap) against REAL SLURM jobs on the local cluster
(partition "setcap", tests/slurm/cluster.sh), through REAL sudo as uid 65534, REAL squeue and
slurmd -G; the GPUs are FAKE at the driver: nvidia-smi (tests/fakes/fake_nvidia_smi.py over FAKE
NVML GPUs), /proc/driver/nvidia/gpus (a folder per bus id naming its device minor) and the
cluster's device files (/dev/fakegpuN, NVIDIA's major 195, minor N).

Issue 47's case: ``scontrol show job -d`` prints a job's name unquoted, so a job named
``x Nodes=<node> GRES=gpu:h200:4(IDX:0-3)`` made the wrapper, which matched that pattern anywhere
in the text, cap the GPUs of another user's job. The wrapper now reads squeue's JSON, the job's
own fields; the test checks it against what SLURM itself allocated (squeue --json, as root).
Issue 51's point too: SLURM's GPU k reaches nvidia-smi's GPU through device file, minor and bus
id; the FAKE driver here gives minor k the bus of nvidia-smi's GPU (k + 1) % 4."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.fakes import fake_pynvml
from tests.slurm_cluster import partition
from tests.unit.commands.test_setcap_rule import (
    FAKES,
    NOBODY,
    as_nobody_sudo,
    bus,
    fake_pynvml_state,
    nvidia_driver,
    set_calls,
)
from wattflex.runs.devices import setcap

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.fake_gpu,
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(p) for p in ("sudo", "visudo", "setpriv")),
        reason="a sudoers rule and uid 65534 need root, sudo, visudo and setpriv",
    ),
]
PARTITION = "setcap"


@pytest.fixture(scope="module")
def setcap_partition(tmp_path_factory):
    return partition(tmp_path_factory, PARTITION)


@pytest.fixture
def rig(setcap_partition):
    """The wrapper for the partition's node (real squeue, FAKE nvidia-smi with 4 FAKE GPUs) in a
    root-owned 0755 folder, and a sudoers drop-in letting nobody run exactly it."""
    (node,) = setcap_partition.nodes
    where = Path(tempfile.mkdtemp(prefix="wattflex_setcap_slurm_"))
    where.chmod(0o755)
    dropin = Path("/etc/sudoers.d") / f"wattflex_test_{secrets.token_hex(4)}"
    try:
        shutil.copy(FAKES / "fake_nvidia_smi.py", where / "nvidia-smi")
        (where / "nvidia-smi").chmod(0o755)
        shutil.copy(FAKES / "fake_pynvml.py", where / "fake_pynvml.py")
        fake_pynvml.reset(n_gpus=4, path=where / "gpus.json")
        os.environ.pop(fake_pynvml.STATE_ENV)
        (where / "gpus.json").chmod(0o644)
        nvidia_driver(where / "nvidia-proc", {k: (k + 1) % 4 for k in range(4)})
        tools = {
            "NVIDIA_SMI": str(where / "nvidia-smi"),
            "SQUEUE": shutil.which("squeue"),
            "SLURMD": shutil.which("slurmd"),
            "SLURM_CONF": os.environ["SLURM_CONF"],  # the cluster's, set by partition()
            "NVIDIA_PROC": str(where / "nvidia-proc"),
        }
        (where / "wattflex-setcap").write_text(setcap.wrapper_text(tools, node_name=node))
        (where / "wattflex-setcap").chmod(0o755)
        rule = setcap.sudoers_line(user="nobody", path=str(where / "wattflex-setcap"))
        (where / "sudoers").write_text(rule)
        subprocess.run(["visudo", "-cf", str(where / "sudoers")], check=True, capture_output=True)
        shutil.copy(where / "sudoers", dropin)
        dropin.chmod(0o440)
        yield where, node
    finally:
        dropin.unlink(missing_ok=True)
        shutil.rmtree(where, ignore_errors=True)


def sbatch(*argv: str, as_nobody: bool = False) -> int:
    who = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] * as_nobody
    cmd = [*who, "sbatch", "--parsable", "--chdir=/tmp", "-o", "/dev/null", "-p", PARTITION]
    r = subprocess.run([*cmd, *argv, "--wrap", "sleep 300"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip().split(";")[0])


def running(job_ids: list[int], timeout_s: float = 60) -> dict[int, dict]:
    """squeue's JSON of the jobs once all run (as root: SLURM's own record of each)."""
    end = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(["squeue", "--json"], capture_output=True, text=True, check=True)
        jobs = {j["job_id"]: j for j in json.loads(out.stdout)["jobs"] if j["job_id"] in job_ids}
        if len(jobs) == len(job_ids) and all(j["job_state"] == "RUNNING" for j in jobs.values()):
            return jobs
        assert time.monotonic() < end, f"jobs not running after {timeout_s} s: {jobs}"
        time.sleep(0.5)


def idx(job: dict) -> set[int]:
    ((detail,),) = [job["gres_detail"]]
    lo, _, hi = detail.split("(IDX:")[1].rstrip(")").partition("-")
    return set(range(int(lo), int(hi or lo) + 1))


def test_a_job_name_that_looks_like_gres_detail_reaches_no_other_users_gpu(rig):
    where, node = rig
    lure = f"x Nodes={node} GRES=gpu:h200:4(IDX:0-3)"
    mine = sbatch("--gres=gpu:h200:1", "-J", lure, as_nobody=True)
    theirs = sbatch("--gres=gpu:h200:3", "-J", "root-job")
    try:
        jobs = running([mine, theirs])
        assert jobs[mine]["name"] == lure and jobs[mine]["user_id"] == NOBODY
        my_gpus, their_gpus = idx(jobs[mine]), idx(jobs[theirs])
        assert len(my_gpus) == 1 and my_gpus.isdisjoint(their_gpus) and len(their_gpus) == 3
        (slurm_gpu,) = my_gpus
        gpu = (slurm_gpu + 1) % 4  # the same GPU as nvidia-smi numbers it (the FAKE driver's map)
        for other in sorted({(k + 1) % 4 for k in their_gpus}):
            r = as_nobody_sudo(where, str(other), "300")
            assert r.returncode == 2, r.stderr
            assert (
                f"GPU {other} (0000:{other + 1:02x}:00.0) is not a GPU of a running SLURM job of "
                f"uid {NOBODY} on {node} (its GPUs here: 0000:{gpu + 1:02x}:00.0 (SLURM's GPU "
                f"{slurm_gpu}))" in r.stderr
            ), r.stderr
        r = as_nobody_sudo(where, str(gpu), "300")
        assert r.returncode == 0, r.stderr
        assert set_calls(where) == [["-i", bus(gpu), "-pl", "300"]]
        limits = [g["limit_mw"] for g in fake_pynvml_state(where)["gpus"]]
        assert limits == [300_000 if i == gpu else 700_000 for i in range(4)]
    finally:
        subprocess.run(["scancel", str(mine), str(theirs)], capture_output=True)
