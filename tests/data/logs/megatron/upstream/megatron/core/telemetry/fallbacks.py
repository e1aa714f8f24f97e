# From NVIDIA/Megatron-LM megatron/core/telemetry/fallbacks.py
# at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22),
# copied unchanged by tests/data/logs/megatron/make_lines.py extract: the file's
# stdlib and torch imports, then:
# trace_fn, managed_span.
# (Defined in a try's except branch there: dedented here.)
# The file's notice: Copyright (c) 2026, NVIDIA CORPORATION & AFFILIATES. All rights reserved.

from contextlib import contextmanager


def trace_fn(group, name, tracer=None):
    """No-op decorator — returns the function unchanged."""

    def decorator(func):
        return func

    return decorator


@contextmanager
def managed_span(group, name, tracer=None, **attributes):
    """No-op context manager — yields None."""
    yield None
