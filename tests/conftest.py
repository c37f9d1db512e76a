"""Test-wide settings: never reach the Hugging Face hub, keep thread counts small on shared CPUs."""

import os

import pytest
from hypothesis import settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Property tests draw fresh examples on every local run (that is how they find bugs). CI runs the
# "ci" profile: the same examples for the same commit, so a landing never depends on the draw.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op torch thread for a module of many small forwards: on a shared 2-core machine a
    second thread makes each op slower, not faster. Use with `pytest.mark.usefixtures("one_thread")`."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
