"""Every catalogue family through the harness's sharded path, in one 2-rank gloo job:
a real-format checkpoint of each family's transformers class (``save_pretrained``; tied where the
family's published config ties) loaded by ``trainer.prepare_model``, and the harness's random init;
and a multimodal Gemma-4 checkpoint, of which the harness trains the text decoder. The cases and
the checkpoints: tests/family_checkpoints.py; the table: benchmarks/family_checkpoints.py.
"""

import pytest

from tests import family_checkpoints as fc
from tests.workflow.torchrun.training_jobs import ProbeJob, run_probes

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/workflow/torchrun/conftest.py


@pytest.fixture(scope="module")
def family_probes(tmp_path_factory) -> ProbeJob:
    """All cases in one job (a launch costs ~10 s of CPU on 2 cores; the cases, compile off, ~1-2 s
    each, 31 of them: ~1 min alone, more beside the other slow tests on 2 cores)."""
    work = tmp_path_factory.mktemp("family_probes")
    return run_probes(fc.cases(work), work, timeout_s=900.0)


@pytest.mark.slow
@pytest.mark.parametrize("family", fc.FAMILIES, ids=lambda f: f.name)
def test_checkpoint_of_every_family_loads_sharded_exactly_and_trains(family, family_probes):
    """Loaded sharded: the unsharded model's logits and gradient, every weight and buffer the
    checkpoint's (RoPE of llama3 / yarn kinds, Gemma's embed_scale recomputed), tied embeddings
    still one parameter, and a step that moves every trainable parameter."""
    reports = family_probes.reports(f"{family.name}-model_path")
    s = fc.summary(reports)
    assert s["tied"] == family.tied and all(r["ref_tied"] == family.tied for r in reports)
    assert all(r["sharded_build"] for r in reports)
    assert s["params_equal"], [n for r in reports for n, ok in r["params_equal"].items() if not ok]
    assert s["buffers"] and s["buffers_equal"], s["unequal_buffers"]
    assert s["logits_max_diff"] < 1e-5 and s["grad_max_diff"] < 1e-6, s
    assert s["loss"] == pytest.approx(s["ref_loss"], abs=1e-5) and s["loss"] == pytest.approx(
        5.5, abs=0.5
    )  # ln 256
    assert s["step_taken"], s["unchanged"]


@pytest.mark.slow
@pytest.mark.parametrize("family", fc.FAMILIES, ids=lambda f: f.name)
def test_random_init_of_every_family_has_a_fresh_models_buffers_and_trains(family, family_probes):
    reports = family_probes.reports(f"{family.name}-random_init")
    s = fc.summary(reports)
    assert s["tied"] == family.tied
    assert s["buffers"] and s["buffers_equal"], s["unequal_buffers"]
    assert not s["params_equal"]  # each rank drew its own shard (CPU): not the one-process build
    assert s["logits_max_diff"] < 1e-5 and s["grad_max_diff"] < 1e-6, s
    assert s["step_taken"], s["unchanged"]


@pytest.mark.slow
@pytest.mark.parametrize("name", fc.LORA)
def test_lora_from_every_moe_familys_checkpoint_trains_the_adapters(name, family_probes):
    """peft's adapters on the loaded checkpoint (the fused experts through target_parameters): the
    base weights the checkpoint's, logits and gradient the unsharded model's, every adapter with a
    gradient moved by the step (lora_A has none while lora_B is zero)."""
    reports = family_probes.reports(f"{name}-lora")
    s = fc.summary(reports)
    assert s["params_equal"] and s["buffers_equal"], s["unequal_buffers"]
    assert s["logits_max_diff"] < 1e-5 and s["grad_max_diff"] < 1e-6, s
    assert s["step_taken"], s["unchanged"]
    assert all(all("lora_A" in n for n in r["unchanged"]) for r in reports), s["unchanged"]
    assert s["moved"] >= s["trainable"] // 2  # every lora_B


@pytest.mark.slow
def test_multimodal_gemma4_checkpoint_trains_its_text_decoder_only(family_probes):
    """google/gemma-4-26B-A4B is a Gemma4ForConditionalGeneration checkpoint: the harness built and
    loaded that whole class sharded (vision and audio towers; the first ``layers`` list found, the
    vision encoder's, as the FSDP units), then failed reading the decoder's facts off the multimodal
    config (``'Gemma4Config' object has no attribute 'num_hidden_layers'``, in flops_per_token); now
    Gemma4ForCausalLM from its text_config, the decoder's weights read from
    ``model.language_model.*``, the towers never loaded."""
    for r in family_probes.reports(fc.MULTIMODAL):
        assert (
            r["model_class"] == "Gemma4ForCausalLM"
            and r["hf_config"]["model_type"] == "gemma4_text"
        )
        assert sorted(r["params"]) == sorted(
            n.replace("model.language_model.", "model.", 1) for n in r["text_params"]
        )
        assert not any("vision" in n or "audio" in n for n in r["params"])
        assert r["layers"] == 2  # the text decoder's
        assert r["params_equal"] and all(r["params_equal"].values()), r["params_equal"]
        assert r["buffers"] and all(r["buffers"].values()), r["buffers"]
        assert r["logits_max_diff"] < 1e-5
        assert r["loss"] == pytest.approx(5.5, abs=0.5)
