"""The model families the real training harness builds and wraps with LoRA.

A core fact: ``config`` checks a campaign's ``hf_model_type`` against it before anything runs,
``runs.training`` builds the model by it. ``hf_model_type`` is transformers' ``model_type``.
"""

from __future__ import annotations

# hf_model_type -> "dense" | "moe" (transformers 5 model classes wattflex.runs.training.models builds).
ARCHITECTURES = {
    "llama": "dense",
    "mistral": "dense",
    "qwen2": "dense",
    "qwen3": "dense",
    "qwen3_moe": "moe",
    "mixtral": "moe",
    "gpt_oss": "moe",
    "deepseek_v2": "moe",
    "gemma4_text": "moe",
}

# Published checkpoints of some families are multimodal, the text decoder one part of a larger model:
# the checkpoint config's model_type -> where the decoder's weights sit in its state dict (its config:
# the config's text_config, model_type one of ARCHITECTURES). transformers 5.25's
# Gemma4ForConditionalGeneration keeps Gemma4TextModel at ``model.language_model`` and ties
# ``lm_head.weight`` to ``model.language_model.embed_tokens.weight`` (its _tied_weights_keys);
# google/gemma-4-26B-A4B's config.json is this model_type "gemma4", vision and audio towers beside.
MULTIMODAL_TEXT_PREFIX = {"gemma4": "model.language_model."}
