"""Named splits of an environment's tasks: `train`, `validation` and `test`.

A task belongs to one split by a hash of what identifies it, never by which stream drew it:

* the first observation the environment shows (a Sudoku board, an ACRE question, an Arc1D task, a math
  problem), for environments whose first observation names the task (`EnvPreset.split_key="observation"`);
* the episode's seed where the first observation is the same for every task (GuessTheNumber: the hidden
  number is what varies, and it is never shown) (`split_key="seed"`).

One key in 16 is `test`, one in 16 `validation`, the other 14 `train`. An env built for a split draws its
episode, then draws again (from seeds derived from the one asked for) until the task falls in its split: a
training run, a warm start's demonstrator and a validation evaluation can never play a test task, however
many episodes they draw, and a group of episodes asked for with one seed still shares one task.

The seeds each evaluation asks for (`split_seeds`) are independent of the run seed for `test` (every run and
arm is scored on the same test episodes, so arms compare pair by pair) and follow the run seed for
`validation` (the stream every held-out evaluation before the splits used).
"""

from __future__ import annotations

import hashlib

from oat_dppo.seeds import derive_seed, eval_seeds

SPLITS = ("train", "validation", "test")
EVAL_SPLITS = ("validation", "test")
SPLIT_KEYS = ("observation", "seed")
BUCKETS = 16  # test: bucket 0, validation: bucket 1, train: the rest
# Draws before giving up on finding a task of the split: a 1-in-16 split misses 400 draws with
# probability (15/16)**400 ~ 6e-12, so reaching the limit means the key never changes.
MAX_DRAWS = 400


def split_of(key: str) -> str:
    """The split the task with this key belongs to (sha256: the same in every process and version)."""
    bucket = int.from_bytes(hashlib.sha256(f"oat_dppo.split:{key}".encode()).digest()[:8], "little") % BUCKETS
    return "test" if bucket == 0 else "validation" if bucket == 1 else "train"


def task_key(split_key: str, *, seed: int, observation: str) -> str:
    """What identifies an episode's task under `split_key` ("observation": its first observation's text,
    "seed": the seed it started from)."""
    if split_key == "observation":
        return observation
    if split_key == "seed":
        return f"seed:{seed}"
    raise ValueError(f"split_key must be one of {SPLIT_KEYS}, got {split_key!r}")


def redraw_seed(seed: int, attempt: int) -> int:
    """The seed of the `attempt`-th draw for a request of `seed` (attempt 0: the seed itself)."""
    return seed if attempt == 0 else derive_seed(seed, "split-redraw", attempt)


def split_seeds(split: str, n: int, run_seed: int) -> list[int]:
    """The start seeds an evaluation on `split` asks for: the same test episodes for every run, the
    run's own validation stream (see the module docstring)."""
    if split == "test":
        return [derive_seed("test", j) for j in range(n)]
    if split == "validation":
        return eval_seeds(run_seed, n)
    raise ValueError(f"evaluation split must be one of {EVAL_SPLITS}, got {split!r}")


def check_split(split: str | None) -> str | None:
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


class SplitExhausted(RuntimeError):
    """No task of the split in MAX_DRAWS draws: the env's key does not vary with the seed."""
