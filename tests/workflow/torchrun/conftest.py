"""Fixtures shared by the torchrun tests."""

from tests.torch_threads import one_thread, one_thread_subprocesses  # noqa: F401 (fixtures)
