"""`smoke:digits`: the project's own environment for smoke runs with tiny random models.

A reply earns the share of its characters that are digits (0 to 1). A random byte-level tiny model
writes a digit about once in 25 characters, so the rewards of a batch vary from the first iteration
(non-zero advantages: the trust region and the optimizer have something to act on), and a few
iterations at a high learning rate raise them visibly. Two turns per episode, the second seeing the
first reply: multi-turn bookkeeping is exercised too. GEM games give such models a constant format
failure instead (every episode -0.1, zero advantages, zero gradients).
"""

from __future__ import annotations

import random

from .preset import EnvPreset

PRESETS = (
    EnvPreset(
        env_id="smoke:digits",
        family="smoke",
        multi_turn=True,
        max_turns=2,
        max_new_tokens=8,  # smoke runs: a small budget keeps an iteration to about a second on CPU
        obs_prefix="",
        obs_suffix="",
        action_format="any",  # every reply is an answer; its value is its reward
        first_class=True,
        factory="oat_dppo_envs.smoke:Digits",
        description="smoke test for tiny models: the reward is the share of digits in the reply (multi-turn)",
    ),
)


class Digits:
    """Reward: the share of the reply's characters that are digits. `max_turns` replies per episode."""

    def __init__(self, seed: int = 0, max_turns: int = 2):
        self.max_turns = max_turns
        self._rng = random.Random(seed)
        self._turn = 0

    def reset(self, seed: int | None = None):
        self._rng = random.Random(seed)
        self._turn = 0
        return f"Reply with digits only, e.g. {self._rng.randrange(10, 100)}.", {}

    def step(self, action: str):
        digits = sum(c.isdigit() for c in action)
        self._turn += 1
        reward = digits / max(len(action), 1)
        obs = f"Your reply had {digits} digits in {len(action)} characters. Again: digits only."
        return obs, reward, self._turn >= self.max_turns, False, {"digits": digits}
