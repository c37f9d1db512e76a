"""Small gymnasium-style text environments that tests load by import path
(`make_env("test_envs_helpers:CountdownEnv", ...)`); pytest puts tests/ on sys.path.
No tests here."""

from __future__ import annotations

import random
import re


class CountdownEnv:
    r"""Guess a hidden number in [1, 9] with \boxed{n}; "higher"/"lower" feedback.

    The number comes from the seed given to reset(), so episodes are reproducible. The action
    CRASH makes step() raise, to exercise the adapter's error contract."""

    def __init__(self, seed: int | None = None, *, low: int = 1, high: int = 9):
        self.init_seed = seed
        self.low, self.high = low, high
        self.target = None

    def reset(self, seed=None):
        self.target = random.Random(seed).randint(self.low, self.high)
        return f"Guess a number between {self.low} and {self.high}.", {"prefix": "[countdown] "}

    def step(self, action):
        if "CRASH" in action:
            raise ZeroDivisionError("the toy env crashed on purpose")
        m = re.search(r"\\boxed\{(\d+)\}", action)
        if m is None:
            return "No number found.", 0.0, False, False, {}
        guess = int(m.group(1))
        if guess == self.target:
            return "Correct!", 1.0, True, False, {}
        return ("higher" if guess < self.target else "lower"), 0.0, False, False, {}


def make_countdown(*, high: int = 9):
    """A factory that takes no seed: the adapter must not pass one."""
    return CountdownEnv(seed=None, high=high)


class GlobalRandomEnv:
    """Draws from the GLOBAL `random` module in reset and step, as GEM's games do."""

    def reset(self, seed=None):
        if seed is not None:
            random.seed(seed)
        return f"start {random.random():.12f}", {}

    def step(self, action):
        return f"draw {random.random():.12f}", 0.0, False, False, {}


class NoSeedResetEnv:
    def reset(self):
        return "hello", {}

    def step(self, action):
        return "bye", 0.0, True, False, {}


class BytesObsEnv:
    def reset(self, seed=None):
        return "start", {}

    def step(self, action):
        return b"not text", 0.0, False, False, {}


NOT_AN_ENV = 42
