"""Memory measurements that mean the same thing on every machine.

- `largest_allocation`: a dispatch mode sees every tensor an op creates (outputs that do not alias an
  input): the largest single allocation and the total bytes allocated, deterministically.
- `peak_rss_delta`: the process's peak resident memory above what it held before the call, measured
  in a fresh child process from the kernel's high-water mark (real memory, allocator included).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import queue as queue_mod
import time
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class AllocationTracker(TorchDispatchMode):
    """Records the largest new storage and the sum of new storages created by ops under it."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        seen = {a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)}
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                ptr = t.untyped_storage().data_ptr()
                if ptr and ptr not in seen:
                    seen.add(ptr)
                    nbytes = t.untyped_storage().nbytes()
                    self.largest = max(self.largest, nbytes)
                    self.total += nbytes
        return out


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Release freed heap pages, then reset the kernel's peak-RSS mark (Linux >= 4.0)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _child_main(fn: Callable[..., Any], args: tuple, queue) -> None:
    queue.put(fn(*args))


def in_fresh_process(fn: Callable[..., Any], *args: Any, timeout: float = 1800) -> Any:
    """`fn(*args)` in a freshly spawned Python process (so memory measured there starts clean);
    `fn` must be a module-level function, its result picklable. A child that dies without a
    result (an exception, the OOM killer) raises RuntimeError at once instead of a hang."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_child_main, args=(fn, args, results))
    proc.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                return results.get(timeout=1.0)
            except queue_mod.Empty:
                if not proc.is_alive():
                    try:  # the result may have landed just as the child exited
                        return results.get(timeout=1.0)
                    except queue_mod.Empty:
                        raise RuntimeError(f"{fn.__name__} died in its child process (exit code {proc.exitcode}; "
                                           "a Python error printed its traceback above)") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{fn.__name__} gave no result within {timeout:.0f} s")
    finally:
        if proc.is_alive():
            proc.terminate()
        proc.join()


def peak_rss_delta(make_inputs: Callable[[], Any], run: Callable[[Any], None]) -> int | None:
    """Extra peak resident memory of `run(inputs)` over what the process held before it.

    Needs Linux's /proc (peak reset via clear_refs); returns None elsewhere. Run it in a fresh
    process so that earlier allocations do not hide in the allocator's free lists.
    """
    inputs = make_inputs()
    if not _reset_peak():
        return None
    before = _status_kib("VmRSS")
    run(inputs)
    peak = _status_kib("VmHWM")
    if before is None or peak is None:
        return None
    return max(0, peak - before) * 1024
