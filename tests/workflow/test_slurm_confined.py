"""One job on GPUs 4-7 of an 8-GPU node of the local SLURM (partition "confined",
tests/slurm_cluster.py), with device confinement modelled, and ``wattflex doctor`` and a real
CapGuard inside it.

The test cluster runs ``task/none`` (no cgroups on a test machine), so the job script stands in
for what ``task/cgroup`` with ``ConstrainDevices=yes`` does: it sets ``CUDA_VISIBLE_DEVICES`` to
the job-local ``0..n-1`` (SLURM ``gres_common.c`` ``common_gres_set_env`` under
``gres_use_local_device_index``), and the FAKE driver-like NVML (tests/fakes/fake_pynvml.py via
tests/fakes/pynvml_path) grants the process only the GPUs SLURM allocated (``SLURM_JOB_GPUS``,
set by SLURM itself), refusing the others with ``NVML_ERROR_NO_PERMISSION`` in both count
behaviours of nvml.h. A first job holds GPUs 0-3, so SLURM gives the second 4-7."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.slurm_cluster import partition
from tests.workflow.test_slurm_multinode import fake_gpus

from .conftest import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.fake_gpu]
PARTITION = "confined"

JOB = r"""#!/bin/bash
set -u
# task/cgroup + ConstrainDevices=yes, modelled: the cgroup grants SLURM's GPUs, CUDA numbers them 0..n-1
export FAKE_PYNVML_DEVICES=$SLURM_JOB_GPUS
export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((SLURM_GPUS_ON_NODE - 1)))
echo "$SLURM_JOB_GPUS $CUDA_VISIBLE_DEVICES" > env.txt
for count in all accessible; do
  FAKE_PYNVML_COUNT=$count wattflex doctor --json > doctor-$count.json 2> doctor-$count.err
  echo $? > doctor-$count.rc
done
python - <<'PY' > capped.json
import json
from wattflex.runs.devices import caps, nvml
gpus = nvml.open_gpus(gpm=False)
with caps.CapGuard(gpus, 300, "nvml", "caps"):
    print(json.dumps([[g.uuid, g.power_limit_w()] for g in gpus]))
PY
echo $? > capped.rc
"""


def wait_running(job_id: str, timeout_s: float = 60.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        state = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True
        ).stdout.strip()
        if state == "RUNNING":
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not running after {timeout_s:g} s")


def sbatch(env: dict, tmp: Path, name: str, *args: str) -> str:
    return subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--ntasks=1",
            "--gres=gpu:4",
            "--mem=500",
            "--time=5",
            f"--job-name={name}",
            f"--partition={PARTITION}",
            f"--chdir={tmp}",
            f"--output={tmp}/{name}.out",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.strip()


def test_a_confined_job_on_gpus_4_to_7_sees_caps_and_doctors_only_its_own(
    tmp_path_factory, tmp_path
):
    part = partition(tmp_path_factory, PARTITION)
    (node,) = part.nodes
    template = fake_gpus(tmp_path, n_gpus=8, nodes=[node])
    fakes = REPO / "tests" / "fakes"
    env = {
        **os.environ,
        "FAKE_PYNVML_STATE": template,
        "WATTFLEX_STATE_DIR": str(tmp_path / "caps"),
        "PYTHONPATH": os.pathsep.join(
            [str(fakes / "pynvml_path"), str(REPO / "workflow_scripts"), str(REPO)]
        ),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    blocker = sbatch(env, tmp_path, "first", "--wrap", "sleep 300")
    try:
        wait_running(blocker)
        (tmp_path / "job.sh").write_text(JOB)
        job = sbatch(env, tmp_path, "confined", str(tmp_path / "job.sh"))
        deadline = time.time() + 240
        while not (tmp_path / "capped.rc").exists() and time.time() < deadline:
            time.sleep(1)
    finally:
        subprocess.run(["scancel", blocker], capture_output=True)
    out = (tmp_path / "confined.out").read_text() if (tmp_path / "confined.out").exists() else ""
    assert (tmp_path / "capped.rc").exists(), f"job {job} did not finish: {out}"
    assert (tmp_path / "env.txt").read_text().split() == ["4,5,6,7", "0,1,2,3"]
    mine = [f"GPU-fake-{i:04d}" for i in (4, 5, 6, 7)]
    for count in ("all", "accessible"):
        err = (tmp_path / f"doctor-{count}.err").read_text()
        report = json.loads((tmp_path / f"doctor-{count}.json").read_text())
        nv = report["nvml"]
        assert [g["uuid"] for g in nv["gpus"]] == mine, (count, err)
        assert nv["node_gpus"] == (8 if count == "all" else 4)
        assert not [p for p in nv["problems"] if "cannot be opened" in p["what"]], nv["problems"]
    assert (tmp_path / "capped.rc").read_text().strip() == "0", out
    assert json.loads((tmp_path / "capped.json").read_text()) == [[u, 300.0] for u in mine]
    state = json.loads(Path(template.replace("{node}", node)).read_text())
    assert sorted({h for h, _ in state["set_calls"]}) == [4, 5, 6, 7]  # never another job's GPU
    assert [g["limit_mw"] for g in state["gpus"]] == [700_000] * 8  # all restored
