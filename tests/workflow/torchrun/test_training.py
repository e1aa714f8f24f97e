"""The training harness in real 2-process gloo torchrun jobs on CPU, tiny random-init models
(hidden 64, 2 layers, vocab 256, seq 32); real torch, transformers and peft throughout. (In one
process, and ``tiny_cfg``: tests/unit/runs/training/test_training.py.)"""

import json
import os
from pathlib import Path

import pytest

from tests.unit.runs.training.test_training import tiny_cfg
from tests.workflow.torchrun.training_jobs import train_torchrun
from wattflex.provenance import read_parquet

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/workflow/torchrun/conftest.py


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, task, parallel, binding",
    [("Llama-3.1-70B", "pt", "ddp", True), ("gpt-oss-20b", "lora", "fsdp", False)],
)
def test_torchrun_two_process_gloo(model, task, parallel, binding, tmp_path):
    """Two gloo ranks train, evaluate and checkpoint. cuda.cpu_binding (default on): the 2 ranks
    of a node run on disjoint shares of the CPUs torchrun may use, recorded per rank; off, both
    keep the whole set (checked on these runs rather than on two runs of their own)."""
    cfg = tiny_cfg(
        model,
        task,
        tmp_path,
        batch=2,
        max_steps=6,
        eval_at_s=0.0,
        eval_batches=1,
        checkpoint_at_s=0.0,
        parallel=parallel,
        cpu_binding=binding,
    )
    r = train_torchrun(cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = read_parquet(tmp_path / "steps.parquet")
    assert list(steps["step"]) == list(range(1, 7))
    assert (steps["tokens"] == 2 * 2 * 32).all()  # job tokens: both ranks
    facts = json.loads((tmp_path / ".training.json").read_text())["training"]
    assert facts["world_size"] == 2 and facts["parallel"] == parallel
    assert [e["event"] for e in facts["events"]] == ["eval", "checkpoint"]
    ck = facts["events"][1]
    assert (
        ck["async"] and ck["bytes"] > 0 and not Path(ck["path"]).exists()
    )  # written, summed, removed
    assert facts["sharded_build"] == (parallel == "fsdp")
    # the chunked loss (training.loss) under FSDP2; DDP keeps transformers' loss
    assert (facts["loss_unchunked_because"] is None) == (parallel == "fsdp") and facts[
        "loss_chunk_tokens"
    ] == 8192
    assert facts["cpu_binding"] is binding
    allowed = sorted(os.sched_getaffinity(0))
    (r0, l0, cpus0), (r1, l1, cpus1) = [
        (e["rank"], e["local_rank"], e["cpus"]) for e in facts["cpus_per_rank"]
    ]
    assert (r0, l0, r1, l1) == (0, 0, 1, 1)
    if not binding:
        assert [cpus0, cpus1] == [allowed, allowed]
    elif len(allowed) >= 2:  # a CPU each at least (with one CPU there is nothing to split)
        assert cpus0 and cpus1 and not set(cpus0) & set(cpus1)
        assert set(cpus0) | set(cpus1) <= set(allowed)
