"""`oat_dppo/backends/oat/cpu.py` in isolation: what each stand-in does, and that nothing changes where CUDA
is present. (That they make Oat's program run is tests/test_oat_program.py.)"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("oat.utils.distributed", reason="Oat's stack is .venv-oat (`make setup-oat`)")

from oat_dppo.backends.oat import cpu  # noqa: E402


def test_gpu_slots_answers_only_inside_the_block():
    before, cuda = torch.cuda.device_count(), cpu.cuda_present()  # outside: is_available() may ask device_count()
    with cpu.gpu_slots(6):
        assert torch.cuda.device_count() == (before if cuda else 6)
    assert torch.cuda.device_count() == before


def test_where_cuda_is_present_nothing_is_replaced(monkeypatch):
    monkeypatch.setattr(cpu, "cuda_present", lambda: True)
    monkeypatch.setattr(cpu, "_applied", False)
    sync, current = torch.cuda.synchronize, torch.cuda.current_device
    assert cpu.apply() is False
    assert (torch.cuda.synchronize, torch.cuda.current_device) == (sync, current)
    count = torch.cuda.device_count
    with cpu.gpu_slots(6):
        assert torch.cuda.device_count is count  # the real count, whatever it is


@pytest.mark.skipif(torch.cuda.is_available(), reason="the stand-ins apply without CUDA only")
def test_on_a_cpu_the_stand_ins_are_in_force_and_idempotent():
    import oat.learners.base as learner_base
    import oat.utils.distributed as distributed

    assert cpu.apply() is True and cpu.apply() is True
    torch.cuda.set_device(0)  # P1: nothing to select
    torch.cuda.synchronize()  # P2: nothing to wait for
    assert torch.cuda.current_device() == "cpu"  # P3
    for module in (distributed, learner_base):  # P6, both ends, wrapped once
        fn = module.init_process_group
        assert fn.__oat_dppo_cpu__ and not getattr(fn.__wrapped__, "__oat_dppo_cpu__", False)
    assert distributed.WorkerWrap.update_weight is cpu._update_weight_on_cpu  # P7


def test_the_weight_sync_group_uses_gloo_instead_of_nccl():
    seen = []
    wrapped = cpu._gloo_instead_of_nccl(lambda *a, backend=None, **k: seen.append(backend))
    wrapped(backend="nccl", init_method="tcp://127.0.0.1:1")
    wrapped(backend="gloo")
    wrapped()
    assert seen == ["gloo", "gloo", "gloo"]
