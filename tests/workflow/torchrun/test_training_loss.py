"""The chunked causal-LM loss (wattflex.runs.training.loss) under FSDP2 over 2 real gloo ranks
(torchrun; lm_head, its own FSDP unit, called once per chunk and again in backward) equals
transformers' own loss and gives the same gradients. (In one process, and ``tiny_cfg``:
tests/unit/runs/training/test_training_loss.py.)"""

import pytest

from tests.unit.runs.training.test_training_loss import tiny_cfg
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


TASKS = ["pt", "lora"]


@pytest.fixture(scope="module")
def fsdp_probes(tmp_path_factory) -> ProbeJob:
    """Both tasks' probes in one 2-rank job (a launch costs ~8.5 s of CPU)."""
    work = tmp_path_factory.mktemp("fsdp_probes")
    return run_probes({task: (FSDP_PROBE, tiny_cfg("Qwen3-32B", work / task, task=task, parallel="fsdp"))
                       for task in TASKS}, work)


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_chunked_loss_under_fsdp2_on_two_gloo_ranks(task, fsdp_probes):
    for r in fsdp_probes.reports(task):
        assert r["parallel"] == "fsdp" and r["applies"] is None
        assert r["got"] == pytest.approx(r["want"], rel=1e-5)
        assert r["grads"] > 0 and r["same_keys"] and r["diffs"] == {}
