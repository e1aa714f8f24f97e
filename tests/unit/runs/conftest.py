"""Fixtures shared by the runs/ tests."""

from tests.torch_threads import one_thread  # noqa: F401 (fixture)
