"""The model families the real training harness builds and wraps with LoRA.

A core fact: ``config`` checks a campaign's ``hf_model_type`` against it before anything runs,
``runs.training`` builds the model by it. ``hf_model_type`` is transformers' ``model_type``.
"""

from __future__ import annotations

# hf_model_type -> "dense" | "moe" (transformers 5 model classes wattflex.runs.training.models builds).
ARCHITECTURES = {
    "llama": "dense", "mistral": "dense", "qwen2": "dense", "qwen3": "dense",
    "qwen3_moe": "moe", "mixtral": "moe", "gpt_oss": "moe", "deepseek_v2": "moe", "gemma4_text": "moe",
}
