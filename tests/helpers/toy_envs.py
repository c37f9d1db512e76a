"""Small gymnasium-style text environments used by the tests through `--env helpers.toy_envs:Name`."""

from __future__ import annotations


class DigitsEnv:
    """Single turn; the reward is the share of digit characters in the reply (dense, so a random
    tiny model gets signal from its first batch)."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def reset(self, seed=None):
        return "Reply with digits only.", {}

    def step(self, action: str):
        reward = sum(c.isdigit() for c in action) / max(len(action), 1)
        return "", reward, True, False, {}


class FlakyEnv(DigitsEnv):
    """Raises on every step whose episode seed is odd: the loop must drop just those episodes."""

    def reset(self, seed=None):
        self._odd = bool(seed is not None and seed % 2)
        return super().reset(seed)

    def step(self, action: str):
        if self._odd:
            raise RuntimeError("simulated environment crash")
        return super().step(action)
