"""Expert parallelism (ep > 1) in the training harness, through transformers' DistributedConfig,
in real 2- and 4-process torchrun jobs on CPU (gloo): tiny random-init or locally saved MoE
models (hidden 64, 2 layers, 4 experts, 2 active). (The layout decisions, without processes, and
``tiny_cfg``: tests/unit/runs/training/test_training_ep.py.)"""

import json
import math

import pytest
import torch

from tests.unit.runs.training.test_training_ep import GPT_OSS, QWEN_MOE, tiny_cfg
from tests.workflow.torchrun.training_jobs import ProbeJob, run_probes, train_torchrun
from wattflex.provenance import read_parquet
from wattflex.runs.training import models

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/workflow/torchrun/conftest.py


# ---- real multi-process runs (gloo) -------------------------------------------------------------
# Each rank builds the harness's model, then reports what it holds and computes: its slice of the
# expert weights against an unsharded reference from the same seed, and the loss of one batch.
PROBE = """
    out = {"info": {k: info[k] for k in ("ep_used", "ep_requested", "parallel")}, "experts": {}}
    for name, p in model.named_parameters():
        if ".mlp.experts." in name:
            local = p.to_local()
            n = local.shape[0]
            out["experts"][name] = {
                "global": list(p.shape), "local": list(local.shape), "mesh": list(p.device_mesh.mesh_dim_names),
                "is_own_slice": bool(torch.equal(local, ref_params[name][dist.rank * n:(dist.rank + 1) * n])),
                "std": float(local.std()), "ref_std": float(ref_params[name].std()), "first": float(local.flatten()[0]),
                "module_experts": model.get_submodule(name.rsplit(".", 1)[0]).num_experts}
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(dist.rank))
    with torch.no_grad():
        out["loss"], out["ref_loss"] = float(model(input_ids=x, labels=x).loss), float(ref(input_ids=x, labels=x).loss)
    open(f"{cfg.outdir}/probe{dist.rank}.json", "w").write(json.dumps(out))
    torch.distributed.destroy_process_group()
"""


@pytest.fixture(scope="module")
def ep2_probes(tmp_path_factory) -> ProbeJob:
    """Both sources' probes in one 2-rank job (a launch costs ~8.5 s of CPU)."""
    work = tmp_path_factory.mktemp("ep2_probes")
    stored = work / "model"  # a stored model, loaded offline like real weights
    torch.manual_seed(1)
    models.build_model(tiny_cfg(QWEN_MOE, work), torch.float32).save_pretrained(stored)
    return run_probes(
        {
            "random_init": (PROBE, tiny_cfg(QWEN_MOE, work / "random_init", ep=2)),
            "model_path": (
                PROBE,
                tiny_cfg(QWEN_MOE, work / "model_path", ep=2, tiny=False, model_path=str(stored)),
            ),
        },
        work,
    )


@pytest.mark.slow
@pytest.mark.parametrize("source", ["random_init", "model_path"])
def test_ep2_each_rank_holds_and_runs_half_the_experts(source, ep2_probes):
    probes = ep2_probes.reports(source)
    for probe in probes:
        assert probe["info"] == {"ep_used": 2, "ep_requested": 2, "parallel": "fsdp"}
        assert len(probe["experts"]) == 4  # gate_up_proj + down_proj, 2 layers
        for name, e in probe["experts"].items():
            assert e["global"][0] == 4 and e["local"][0] == 2, (
                name
            )  # 2 of the 4 experts on this rank
            assert e["module_experts"] == 2 and "ep" in e["mesh"], name
            if source == "model_path":
                assert e["is_own_slice"], name  # rank r: experts 2r, 2r+1
            else:  # built on meta, each rank initialises its own experts: the init's spread, not the copy's
                assert not e["is_own_slice"] and e["std"] == pytest.approx(e["ref_std"], rel=0.2), (
                    name
                )
        if source == "model_path":
            assert probe["loss"] == pytest.approx(
                probe["ref_loss"], rel=1e-5
            )  # same function as unsharded
        else:
            assert math.isfinite(probe["loss"]) and probe["loss"] == pytest.approx(
                probe["ref_loss"], rel=0.05
            )
    if source == "random_init":  # the two ranks' experts are drawn apart, not copies
        firsts = [probe["experts"] for probe in probes]
        assert all(firsts[0][n]["first"] != firsts[1][n]["first"] for n in firsts[0])


@pytest.mark.slow
def test_torchrun_ep2_trains_like_fsdp_with_events(tmp_path):
    # One stored model for both: built sharded, random init would differ between the two layouts
    torch.manual_seed(1)
    models.build_model(tiny_cfg(QWEN_MOE, tmp_path), torch.float32).save_pretrained(
        tmp_path / "model"
    )
    events = dict(
        eval_at_s=0.0,
        eval_batches=1,
        checkpoint_at_s=0.0,
        grad_checkpointing=True,
        tiny=False,
        model_path=str(tmp_path / "model"),
    )
    r = train_torchrun(tiny_cfg(QWEN_MOE, tmp_path / "ep2", ep=2, **events))
    assert r.returncode == 0, r.stderr[-3000:]
    facts = json.loads((tmp_path / "ep2" / ".training.json").read_text())["training"]
    assert (facts["ep_used"], facts["ep_requested"], facts["parallel"], facts["world_size"]) == (
        2,
        2,
        "fsdp",
        2,
    )
    assert facts["loss_unchunked_because"].startswith(
        "expert parallelism"
    )  # training.loss: not chunked
    assert [e["event"] for e in facts["events"]] == ["eval", "checkpoint"]
    assert math.isfinite(facts["events"][0]["loss"])
    ep2 = read_parquet(tmp_path / "ep2" / "steps.parquet")
    assert list(ep2["step"]) == list(range(1, 7)) and (ep2["tokens"] == 2 * 2 * 32).all()
    assert ep2["loss"].map(math.isfinite).all()
    # Same seed, data and optimiser with experts FSDP-sharded instead: the same training, up to float error
    r = train_torchrun(tiny_cfg(QWEN_MOE, tmp_path / "ep1", parallel="fsdp", **events))
    assert r.returncode == 0, r.stderr[-3000:]
    ep1 = read_parquet(tmp_path / "ep1" / "steps.parquet")
    assert json.loads((tmp_path / "ep1" / ".training.json").read_text())["training"]["ep_used"] == 1
    assert list(ep2["loss"]) == pytest.approx(list(ep1["loss"]), rel=1e-4)


@pytest.mark.slow
def test_torchrun_ep2_of_4_processes_shards_expert_copies_with_fsdp(tmp_path):
    """The paper's ep4-of-8 shape at small scale: 2 expert groups, each expert's 2 copies FSDP-sharded."""
    r = train_torchrun(tiny_cfg(GPT_OSS, tmp_path, ep=2, max_steps=3), nproc=4)
    assert r.returncode == 0, r.stderr[-3000:]
    facts = json.loads((tmp_path / ".training.json").read_text())["training"]
    assert (facts["ep_used"], facts["world_size"]) == (2, 4)
    steps = read_parquet(tmp_path / "steps.parquet")
    assert len(steps) == 3 and steps["loss"].map(math.isfinite).all()


@pytest.mark.slow
def test_torchrun_ep_that_does_not_divide_the_processes_fails_clearly(tmp_path):
    r = train_torchrun(tiny_cfg(QWEN_MOE, tmp_path, ep=3), nproc=2)
    assert r.returncode != 0
    assert "ep 3 does not divide the 2 training processes" in r.stderr
    assert not (tmp_path / "steps.parquet").exists()
