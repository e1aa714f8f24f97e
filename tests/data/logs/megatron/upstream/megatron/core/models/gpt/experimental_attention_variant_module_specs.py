# From NVIDIA/Megatron-LM megatron/core/models/gpt/experimental_attention_variant_module_specs.py
# at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22),
# copied unchanged by tests/data/logs/megatron/make_lines.py extract: the file's
# stdlib and torch imports, then:
# GDN_ATTENTION_VARIANTS, _DEPRECATED_ATTENTION_VARIANT_ALIASES, is_gated_delta_net_variant, is_linear_attention_variant.
# The file's notice: Copyright (c) 2026, NVIDIA CORPORATION. All rights reserved.

import warnings
from typing import List, Optional


GDN_ATTENTION_VARIANTS = ("gdn", "gdn2")


_DEPRECATED_ATTENTION_VARIANT_ALIASES = {"gated_delta_net": "gdn"}


def is_gated_delta_net_variant(experimental_attention_variant: Optional[str]) -> bool:
    """Check if the experimental attention variant is served by a gated delta net layer.

    Accepts the deprecated ``gated_delta_net`` spelling without warning; use
    :func:`normalize_experimental_attention_variant` to emit the deprecation notice.
    """
    canonical = _DEPRECATED_ATTENTION_VARIANT_ALIASES.get(
        experimental_attention_variant, experimental_attention_variant
    )
    return canonical in GDN_ATTENTION_VARIANTS


def is_linear_attention_variant(experimental_attention_variant: Optional[str]) -> bool:
    """Check if the experimental attention variant is a linear attention variant."""
    return is_gated_delta_net_variant(experimental_attention_variant)
