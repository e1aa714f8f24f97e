"""The chunked causal-LM loss (wattflex.runs.training.loss) under FSDP2 over 2 real gloo ranks
(torchrun; lm_head, its own FSDP unit, called once per chunk and again in backward) equals
transformers' own loss and gives the same gradients. (In one process, and ``tiny_cfg``:
tests/unit/runs/training/test_training_loss.py.)"""

import pytest

from tests.unit.runs.training.test_training_loss import CATALOG, tiny_cfg
from tests.workflow.torchrun.training_jobs import ProbeJob, run_probes

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/workflow/torchrun/conftest.py


# Each rank: the harness's FSDP2 model; transformers' loss and gradients, then the chunked ones,
# gradients gathered to full tensors.
FSDP_PROBE = """
    from pathlib import Path
    from wattflex.runs.training.loss import chunked_applies, chunked_causal_lm_loss
    torch.manual_seed(100 + dist.rank)
    x = torch.randint(0, sharded.hf_model(model).config.vocab_size, (cfg.batch, cfg.seq_len))
    def run(fn):
        model.zero_grad(set_to_none=True)
        loss = fn()
        loss.backward()
        return float(loss), {n: p.grad.full_tensor() for n, p in model.named_parameters() if p.grad is not None}
    want, want_g = run(lambda: model(input_ids=x, labels=x).loss)
    got, got_g = run(lambda: chunked_causal_lm_loss(model, x, 7))
    diffs = {}
    for n in want_g:
        try:
            torch.testing.assert_close(got_g[n], want_g[n], rtol=1e-5, atol=1e-6)
        except (AssertionError, KeyError) as e:
            diffs[n] = str(e)[:300]
    out = {"parallel": info["parallel"], "applies": chunked_applies(model, 7), "want": want, "got": got,
           "grads": len(want_g), "same_keys": sorted(want_g) == sorted(got_g), "diffs": diffs}
    (Path(cfg.outdir) / f"probe{dist.rank}.json").write_text(json.dumps(out))
"""


# Each rank: the collectives of one training step (the second: the first includes lazy init),
# counted per FSDP unit: each unit's unshard and post-backward are wrapped to name the unit, and
# torch.distributed's all-gather and reduce(-scatter) calls are counted under the unit running.
COUNT_PROBE = """
    from pathlib import Path
    import torch.distributed as tdist
    from torch.distributed.fsdp import FSDPModule
    from wattflex.runs.training.loss import chunked_applies, causal_lm_loss
    running, counts = [], {}
    def labelled(fn, name):
        def call(*a, **k):
            running.append(name)
            try:
                return fn(*a, **k)
            finally:
                running.pop()
        return call
    for name, unit in model.named_modules():
        if isinstance(unit, FSDPModule):
            group = unit._get_fsdp_state()._fsdp_param_group
            group.unshard, group.post_backward = labelled(group.unshard, name), labelled(group.post_backward, name)
    def counted(fn, kind):
        def call(*a, **k):
            if running:
                unit = counts.setdefault(running[-1], {"all_gather": 0, "reduce": 0})
                unit[kind] += 1
            return fn(*a, **k)
        return call
    for fn, kind in [("all_gather_single", "all_gather"), ("all_gather_into_tensor", "all_gather"),
                     ("reduce_scatter_single", "reduce"), ("reduce_scatter_tensor", "reduce"), ("all_reduce", "reduce")]:
        if hasattr(tdist, fn):
            setattr(tdist, fn, counted(getattr(tdist, fn), kind))
    base = sharded.hf_model(model)
    head_weight = base.get_output_embeddings().weight
    head_unit = [n for n, m in model.named_modules()            # the innermost unit holding lm_head's weight
                 if isinstance(m, FSDPModule) and any(p is head_weight for p in m.parameters())][-1]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    torch.manual_seed(100 + dist.rank)
    x = torch.randint(0, base.config.vocab_size, (cfg.batch, cfg.seq_len))
    chunked = chunked_applies(model, 7) is None
    for step in range(2):
        counts.clear()
        causal_lm_loss(model, x, 7, chunked).backward()     # 64 tokens: 10 chunks
        optimizer.step()
        optimizer.zero_grad()
    out = {"chunked": chunked, "head_unit": head_unit, "counts": counts}
    (Path(cfg.outdir) / f"probe{dist.rank}.json").write_text(json.dumps(out))
"""


TASKS = ["pt", "lora"]
COUNTED = {"pt": {}, "lora": {"task": "lora"}, "tied": {"tie_word_embeddings": True}}


@pytest.fixture(scope="module")
def fsdp_probes(tmp_path_factory) -> ProbeJob:
    """Both tasks' probes, and the collective counts, in one 2-rank job (a launch costs ~8.5 s of CPU)."""
    work = tmp_path_factory.mktemp("fsdp_probes")
    cases = {
        task: (FSDP_PROBE, tiny_cfg("Qwen3-32B", work / task, task=task, parallel="fsdp"))
        for task in TASKS
    }
    for case, kw in COUNTED.items():
        facts = {
            **CATALOG["Qwen3-32B"],
            "tie_word_embeddings": kw.get("tie_word_embeddings", False),
        }
        cfg = tiny_cfg(
            "Qwen3-32B",
            work / f"count-{case}",
            task=kw.get("task", "pt"),
            parallel="fsdp",
            model_facts=facts,
        )
        cases[f"count-{case}"] = (COUNT_PROBE, cfg)
    return run_probes(cases, work)


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_chunked_loss_under_fsdp2_on_two_gloo_ranks(task, fsdp_probes):
    for r in fsdp_probes.reports(task):
        assert r["parallel"] == "fsdp" and r["applies"] is None
        assert r["got"] == pytest.approx(r["want"], rel=1e-5)
        assert r["grads"] > 0 and r["same_keys"] and r["diffs"] == {}


@pytest.mark.slow
@pytest.mark.parametrize("case", COUNTED)
def test_lm_head_is_gathered_once_per_step(case, fsdp_probes):
    """The chunked loss all-gathers lm_head's unit once a step (the forward's, kept for all the
    chunks and their recomputation in backward) and reduces its gradient once, not once per
    chunk (10 chunks here). Tied: the head's weight is the embedding's, in one unit with it."""
    for r in fsdp_probes.reports(f"count-{case}"):
        assert r["chunked"]
        head = r["counts"].get(r["head_unit"], {})
        frozen = case == "lora"  # no gradient to reduce
        assert head == {"all_gather": 1, "reduce": 0 if frozen else 1}, (
            r["head_unit"],
            r["counts"],
        )
