"""Which attention implementation a job runs, and the attention layers' widths: one answer for
the harness, the plan and the emulator.

The model catalog's optional ``attn_implementation`` (a name, or a mapping task -> name) is
what the training harness asks transformers for, and what the emulator models. Without it
the harness passes nothing and transformers picks its default (``sdpa`` for every family
that supports SDPA).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AttentionLayers:
    """One kind of attention layer of a catalogue model: how many, their q and k/v widths
    (heads x head_dim) and whether they have a value projection."""

    count: int
    q_width: int
    kv_width: int
    has_v_proj: bool = True


def attention_layers(facts: dict[str, Any]) -> list[AttentionLayers]:
    """The kinds of attention layer of catalogue ``facts``: all alike (``heads``, ``kv_heads``,
    ``head_dim``), or Gemma-4's: every ``full_attention_every``-th layer full attention with
    ``global_head_dim`` and ``global_kv_heads`` (keys reused as values where
    ``attention_k_eq_v``), the others sliding-window layers of ``head_dim`` and ``kv_heads``."""
    layers, heads, head_dim = int(facts["layers"]), int(facts["heads"]), int(facts["head_dim"])
    kv = int(facts.get("kv_heads", heads))
    every = int(facts.get("full_attention_every", 0) or 0)
    if not every:
        return [AttentionLayers(layers, heads * head_dim, kv * head_dim)]
    full, g_dim = layers // every, int(facts.get("global_head_dim", head_dim))
    g_kv = int(facts.get("global_kv_heads", kv))
    return [
        AttentionLayers(layers - full, heads * head_dim, kv * head_dim),
        AttentionLayers(
            full, heads * g_dim, g_kv * g_dim, not facts.get("attention_k_eq_v", False)
        ),
    ]


def mean_head_dim(facts: dict[str, Any]) -> float:
    """``head_dim`` averaged over the layers (the attention FLOPs and bytes of a step scale with it)."""
    kinds = attention_layers(facts)
    return (
        sum(k.count * k.q_width for k in kinds) / sum(k.count for k in kinds) / int(facts["heads"])
    )


def catalog_attn_implementation(model_facts: dict[str, Any], task: str) -> str | None:
    """The catalog's attention implementation for ``task``; None: transformers' default."""
    impl = model_facts.get("attn_implementation")
    if isinstance(impl, dict):
        impl = impl.get(task)
    return str(impl) if impl else None
