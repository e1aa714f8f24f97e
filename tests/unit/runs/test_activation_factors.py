"""The plan's activation factors (wattflex.runs.plan.ACTIVATION_FACTORS) against the bytes a real
transformers decoder layer of each catalogue family saves for backward, counted with saved-tensor
hooks by tests/layer_saved_bytes.py (benchmarks/activation_bytes.py's measurement), here at tiny widths (1/k of the catalogue's, extrapolated
to its hidden size): a transformers or peft upgrade that changes what a layer saves fails here."""

import pytest

from tests import layer_saved_bytes
from wattflex.runs import plan

pytestmark = pytest.mark.usefixtures("one_thread")
TOLERANCE = 0.15
TINY_MAX_K = 64  # up to 1/64 of the catalogue's widths (the benchmark stops at 1/16)


def test_every_catalogue_family_and_task_has_measured_factors():
    families = set(layer_saved_bytes.families())
    assert {(f, t) for f in families for t in ("pt", "lora")} == set(plan.ACTIVATION_FACTORS)


@pytest.mark.parametrize("task", ["pt", "lora"])
@pytest.mark.parametrize("family", sorted(layer_saved_bytes.families()))
def test_the_plans_factor_is_within_15_percent_of_a_real_layers_saved_bytes(family, task):
    measured = layer_saved_bytes.measure(family, task, max_k=TINY_MAX_K)
    used = plan.activation_factors(family, task)
    assert used.factor == pytest.approx(measured.factor, rel=TOLERANCE), measured
    assert used.expert_weight == pytest.approx(measured.expert_weight, rel=TOLERANCE, abs=0.05), (
        measured
    )
    if measured.attention == "eager":
        assert used.score == pytest.approx(measured.score, rel=TOLERANCE), measured
    assert (
        measured.checkpointed == plan.ACT_BYTES_CKPT_INPUT
    )  # a checkpointed layer keeps its bf16 input
