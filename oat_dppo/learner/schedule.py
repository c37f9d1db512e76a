"""The learning-rate schedule, set once per iteration (a pure function of the iteration: resumed runs
continue it exactly).

    warm-up (iteration i < W):  lr * (i + 1) / (W + 1)
    then, over the remaining iterations i = W .. N-1 (progress p = (i - W) / (N - W)):
        constant  lr
        linear    lr * (1 - p)
        cosine    lr * (1 + cos(pi p)) / 2

The last iteration's factor is small but positive (p < 1). Raising `--iterations` on `--resume`
stretches the rest of a decaying schedule over the new length.
"""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["constant", "linear", "cosine"]


def lr_factor(iteration: int, iterations: int, schedule: Schedule = "constant", warmup: int = 0) -> float:
    """The multiplier of the peak learning rate at 0-based `iteration` of `iterations`."""
    if iteration < warmup:
        return (iteration + 1) / (warmup + 1)
    if schedule == "constant" or iterations <= warmup:
        return 1.0
    progress = (iteration - warmup) / (iterations - warmup)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"schedule must be constant, linear or cosine, got {schedule!r}")
