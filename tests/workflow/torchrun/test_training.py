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
    "model, task, parallel", [("Llama-3.1-70B", "pt", "ddp"), ("gpt-oss-20b", "lora", "fsdp")]
)
def test_torchrun_two_process_gloo(model, task, parallel, tmp_path):
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


@pytest.mark.slow
@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to give 2 ranks one each"
)
def test_torchrun_binds_each_rank_to_its_own_cpus(tmp_path):
    """cuda.cpu_binding (default on): the 2 ranks of a node run on disjoint shares of the CPUs
    torchrun may use, recorded per rank; off, both keep the whole set."""
    allowed = sorted(os.sched_getaffinity(0))
    per_rank = {}
    for binding in (True, False):
        cfg = tiny_cfg(
            "Llama-3.1-70B",
            "pt",
            tmp_path / str(binding),
            batch=1,
            max_steps=1,
            eval_at_s=None,
            checkpoint_at_s=None,
            cpu_binding=binding,
        )
        r = train_torchrun(cfg)
        assert r.returncode == 0, r.stderr[-3000:]
        facts = json.loads((Path(cfg.outdir) / ".training.json").read_text())["training"]
        assert facts["cpu_binding"] is binding
        per_rank[binding] = [
            (e["rank"], e["local_rank"], e["cpus"]) for e in facts["cpus_per_rank"]
        ]
    (r0, l0, cpus0), (r1, l1, cpus1) = per_rank[True]
    assert (r0, l0, r1, l1) == (0, 0, 1, 1)
    assert (
        cpus0 and cpus1 and not set(cpus0) & set(cpus1) and set(cpus0) | set(cpus1) <= set(allowed)
    )
    assert [cpus for _, _, cpus in per_rank[False]] == [allowed, allowed]
