"""The ``one_thread`` pytest fixture, for tests that train tiny models in the test process; a
conftest.py imports it: ``from tests.torch_threads import one_thread``."""

import pytest


@pytest.fixture
def one_thread():
    """Torch on one thread: tiny models train faster without thread contention on 2 cores."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def one_thread_subprocesses(monkeypatch):
    """Torch on one thread in the processes a test starts (OMP_NUM_THREADS, which torch reads at
    start; torchrun sets it only for more than one process per node): a tiny model's second
    thread mostly spins, and under the tests' load (4 workers on 2 cores) it takes another's core."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
