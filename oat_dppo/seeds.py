"""Seeds derived from a run seed: the same on both backends, across processes and Python versions."""

from __future__ import annotations

import hashlib
from typing import Any


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed from any tuple of parts (sha256 of their text: no dependence on PYTHONHASHSEED)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def episode_seeds(run_seed: int, iteration: int, n: int, group_size: int) -> list[int]:
    """Start seeds of one iteration's episodes: n // group_size groups sharing a seed each."""
    return [derive_seed(run_seed, "train", iteration, g) for g in range(n // group_size) for _ in range(group_size)]


def eval_seeds(run_seed: int, n: int) -> list[int]:
    """Held-out start seeds, the same at every evaluation (eval envs also draw from a separate pool)."""
    return [derive_seed(run_seed, "eval", j) for j in range(n)]
