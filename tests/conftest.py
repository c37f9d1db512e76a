"""Test-wide settings: never reach the Hugging Face hub, keep thread counts small on shared CPUs."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op torch thread for a module of many small forwards: on a shared 2-core machine a
    second thread makes each op slower, not faster. Use with `pytest.mark.usefixtures("one_thread")`."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
