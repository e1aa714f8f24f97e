"""Fixtures shared by the runs/ tests."""

import pytest


@pytest.fixture
def one_thread():
    """Torch on one thread: tiny models train faster without thread contention on 2 cores."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
