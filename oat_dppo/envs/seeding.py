"""Reproducible episodes for environments that draw from the GLOBAL random generators.

GEM's `Env.reset(seed)` calls `random.seed(seed); np.random.seed(seed)`, and its games (Sudoku's
board generator, 2048's tiles, ...) draw from the module-level `random` / `np.random`. Two env
instances, or the trainer and an env, would then disturb each other's sequences, and seeding the
globals would also reseed the caller's code. `PrivateGlobalRNG` gives each adapter its own copy of
that global state: it is swapped in around each call into the env and swapped out afterwards, under
one process-wide lock (the swap is not thread-safe otherwise).
"""

from __future__ import annotations

import random
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

_SWAP_LOCK = threading.RLock()


class PrivateGlobalRNG:
    """A saved `random` + `np.random` global state that `active()` installs for a block of code."""

    def __init__(self, seed: int):
        # String seeds hash deterministically (sha512), so this is stable across processes.
        self._py_state = random.Random(f"oat_dppo.envs.global:{seed}").getstate()
        self._np_state: Any = np.random.RandomState(
            random.Random(f"oat_dppo.envs.np:{seed}").getrandbits(32)
        ).get_state()

    @contextmanager
    def active(self) -> Iterator[None]:
        with _SWAP_LOCK:
            outer_py, outer_np = random.getstate(), np.random.get_state()
            random.setstate(self._py_state)
            np.random.set_state(self._np_state)
            try:
                yield
            finally:
                self._py_state, self._np_state = random.getstate(), np.random.get_state()
                random.setstate(outer_py)
                np.random.set_state(outer_np)


def episode_seed_stream(seed: int) -> random.Random:
    """The per-instance generator of episode seeds (what each seedless `reset()` uses)."""
    return random.Random(f"oat_dppo.envs.episodes:{seed}")


def draw_episode_seed(stream: random.Random) -> int:
    # 31 bits: valid for np.random.seed, datasets' shuffle and every GEM env.
    return stream.getrandbits(31)
