r"""How to write your own text environment: a worked example, runnable as it is.

    python -m oat_dppo.main --env oat_dppo_envs.custom_example:HigherLower --model smollm2 \
        --response-prefix '\boxed{' --max-new-tokens 6

Any class (or factory) with the gymnasium text API works as `--env package.module:Name`:

* `__init__(seed=..., **options)`: `seed` is passed when the constructor takes it, and so is
  `max_turns` when `--max-turns` is given; other options come from `--env-option key=value`.
* `reset(seed=None) -> (observation, info)`: the agent loop passes an explicit seed for every
  episode (episodes of a `--group-size` group share it): draw everything random from it.
* `step(action) -> (observation, reward, terminated, truncated, info)`: `action` is the model's
  reply (with any `--response-prefix`); the reward is the turn's. The adapter adds the history of
  observations, the instruction text, `well_formed` (a `\boxed{}` answer is present) and the
  `--max-turns` limit, so the environment only states its rules.
* `format_failure_reward` (a class attribute, optional): the reward of a reply without a parseable
  action. Study reports count an iteration whose mean reward sits there as collapsed (default 0).
"""

from __future__ import annotations

import random
import re

_BOXED_INT = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")


class HigherLower:
    """Guess a secret integer in [1, `high`] in at most `max_turns` guesses; reward 1 on a hit,
    -0.1 for a reply without a `\\boxed{N}` guess (which ends the episode, as GEM's games do)."""

    format_failure_reward = -0.1

    def __init__(self, seed: int = 0, high: int = 20, max_turns: int = 5):
        self.high, self.max_turns = high, max_turns
        self._rng = random.Random(seed)
        self._secret, self._turn = 0, 0

    def reset(self, seed: int | None = None):
        self._rng = random.Random(seed)
        self._secret, self._turn = self._rng.randint(1, self.high), 0
        example = self._rng.randint(1, self.high)  # a number, not "N": small models copy the example
        return (f"I have chosen an integer between 1 and {self.high}. Guess it in at most {self.max_turns} "
                f"turns; after each guess I say higher or lower. Write your guess in \\boxed{{}}, for example "
                f"\\boxed{{{example}}}."), {}

    def step(self, action: str):
        self._turn += 1
        found = _BOXED_INT.findall(action)
        if not found:
            return "No guess found.", self.format_failure_reward, True, False, {}
        guess = int(found[-1])
        if guess == self._secret:
            return f"{guess} is right!", 1.0, True, False, {"success": True}
        hint = "higher" if guess < self._secret else "lower"
        return f"{guess}: the number is {hint}.", 0.0, False, self._turn >= self.max_turns, {}
