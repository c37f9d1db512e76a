"""The timing hook of the learner: `on_timing(name, seconds)` gets the wall time of each piece of an update
(benchmarks/local.py sums them). Unset (None) it costs one `is None` test per piece."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, ContextManager

OnTiming = Callable[[str, float], None]

# The pieces reported: collating turns and micro-batches, the policy's forward (pi_old's too), the trust
# region and loss aggregation, backward, and the optimizer step (clipping included).
PIECES = ("collate", "forward", "trust_region", "backward", "optimizer")


@contextlib.contextmanager
def _timed(on_timing: OnTiming, name: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        on_timing(name, time.perf_counter() - t0)


def timed(on_timing: OnTiming | None, name: str) -> ContextManager:
    """`with timed(on_timing, "forward"): ...` reports the block's seconds as `name`; nothing when None."""
    return contextlib.nullcontext() if on_timing is None else _timed(on_timing, name)
