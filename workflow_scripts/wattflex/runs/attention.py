"""Which attention implementation a job runs: one answer for the harness and the emulator.

The model catalog's optional ``attn_implementation`` (a name, or a mapping task -> name) is
what the training harness asks transformers for, and what the emulator models. Without it
the harness passes nothing and transformers picks its default (``sdpa`` for every family
that supports SDPA).
"""

from __future__ import annotations

from typing import Any


def catalog_attn_implementation(model_facts: dict[str, Any], task: str) -> str | None:
    """The catalog's attention implementation for ``task``; None: transformers' default."""
    impl = model_facts.get("attn_implementation")
    if isinstance(impl, dict):
        impl = impl.get(task)
    return str(impl) if impl else None
