"""`oat_dppo/patches.py` in isolation: what each stand-in does, and that nothing changes where CUDA
is present. (That they make Oat's program run is tests/test_oat_program.py.)"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("oat.utils.distributed", reason="Oat's stack is .venv-oat (`make setup-oat`)")

from oat_dppo import patches  # noqa: E402


def test_gpu_slots_answers_only_inside_the_block():
    before, cuda = torch.cuda.device_count(), patches.cuda_present()  # outside: is_available() may ask device_count()
    with patches.gpu_slots(6):
        assert torch.cuda.device_count() == (before if cuda else 6)
    assert torch.cuda.device_count() == before


# A fresh process whose torch reports one CUDA device, before anything of the project is imported: then
# every module that applies the stand-ins on import (the learner's, the actor's) is imported, the launcher's
# steps are run, and each stand-in's target is compared with what it was before any of it.
_CUDA_PROCESS = """
import json, torch
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
import oat.utils.distributed as distributed
import oat.learners.base as learner_base
names = ("set_device", "synchronize", "current_device", "device_count")
before = {n: getattr(torch.cuda, n) for n in names}
ends = {"actor": distributed.init_process_group, "learner": learner_base.init_process_group,
        "update_weight": distributed.WorkerWrap.update_weight}
from oat_dppo import patches
from oat_dppo.backends.oat import learner, actor, program  # noqa: F401  learner/actor apply on import
applied = patches.apply()
with patches.gpu_slots(6):
    slots = torch.cuda.device_count()
now = {"actor": distributed.init_process_group, "learner": learner_base.init_process_group,
       "update_weight": distributed.WorkerWrap.update_weight}
print(json.dumps({"applied": applied, "slots": slots,
                  "replaced": [n for n in names if getattr(torch.cuda, n) is not before[n]]
                              + [k for k in ends if now[k] is not ends[k]]}))
"""


def test_where_cuda_is_present_nothing_is_replaced():
    import json
    import subprocess
    import sys

    from helpers.child import child_env

    # DeepSpeed picks its accelerator from the CUDA report too: its CPU one, so that it does not ask the driver
    out = subprocess.run([sys.executable, "-c", _CUDA_PROCESS], capture_output=True, text=True,
                         env=child_env(DS_ACCELERATOR="cpu"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"applied": False, "slots": 1, "replaced": []}


def test_the_same_check_sees_the_stand_ins_without_cuda():
    """The control: the same process without the CUDA report finds every stand-in replaced."""
    import json
    import subprocess
    import sys

    from helpers.child import child_env

    if torch.cuda.is_available():
        pytest.skip("the stand-ins apply without CUDA only")
    script = _CUDA_PROCESS.replace("torch.cuda.is_available = lambda: True\ntorch.cuda.device_count = lambda: 1\n", "")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=child_env(DS_ACCELERATOR="cpu"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["applied"] is True and result["slots"] == 6
    assert set(result["replaced"]) == {"set_device", "synchronize", "current_device", "actor", "learner",
                                       "update_weight"}


def test_an_oat_that_cannot_import_its_learner_is_an_error_not_nccl_on_a_cpu(monkeypatch):
    """If `oat.learners.base` cannot be imported, the learner's end of the weight sync would stay on NCCL and
    fail later with an unrelated error: the ImportError is raised instead."""
    import sys

    if torch.cuda.is_available():
        pytest.skip("the stand-ins apply without CUDA only")
    monkeypatch.setitem(sys.modules, "oat.learners.base", None)  # what a broken install looks like to import
    with pytest.raises(ImportError, match="oat.learners.base"):
        patches._patch_weight_sync()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the stand-ins apply without CUDA only")
def test_on_a_cpu_the_stand_ins_are_in_force_and_idempotent():
    import oat.learners.base as learner_base
    import oat.utils.distributed as distributed

    assert patches.apply() is True and patches.apply() is True
    torch.cuda.set_device(0)  # P1: nothing to select
    torch.cuda.synchronize()  # P2: nothing to wait for
    assert torch.cuda.current_device() == "cpu"  # P3
    for module in (distributed, learner_base):  # P6, both ends, wrapped once
        fn = module.init_process_group
        assert fn.__oat_dppo_cpu__ and not getattr(fn.__wrapped__, "__oat_dppo_cpu__", False)
    assert distributed.WorkerWrap.update_weight is patches._update_weight_on_cpu  # P7


def test_the_weight_sync_group_uses_gloo_instead_of_nccl():
    seen = []
    wrapped = patches._gloo_instead_of_nccl(lambda *a, backend=None, **k: seen.append(backend))
    wrapped(backend="nccl", init_method="tcp://127.0.0.1:1")
    wrapped(backend="gloo")
    wrapped()
    assert seen == ["gloo", "gloo", "gloo"]
