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
* Replies with a direction (optional): `follows_feedback(observation, action) -> bool | None` (the
  action moves the way the reply said: `rollout/hint_direction_agreement`), `changed_reply(observation)
  -> str | None` (the reply saying the other direction) and `reply_moves()` (the moves to score):
  evaluations then report `eval/reply_effect`, how much the reply moves the policy
  (`oat_dppo.agent.reply_effect`: 0 for a policy that ignores replies, 1 for one that follows them).
"""

from __future__ import annotations

import random
import re

_BOXED_INT = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")
_HINT = re.compile(r"(-?\d+): the number is (higher|lower)\.")


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

    # Feedback, declared (see the module docstring).
    def follows_feedback(self, observation: str, action: str) -> bool | None:
        hint, found = _HINT.search(observation), _BOXED_INT.findall(action)
        if hint is None or not found:
            return None
        previous, guess = int(hint.group(1)), int(found[-1])
        return guess > previous if hint.group(2) == "higher" else guess < previous

    def changed_reply(self, observation: str) -> str | None:
        hint = _HINT.search(observation)
        if hint is None:
            return None
        other = "lower" if hint.group(2) == "higher" else "higher"
        return observation[: hint.start(2)] + other + observation[hint.end(2):]

    def reply_moves(self, observation: str) -> list[str]:
        return [f"\\boxed{{{n}}}" for n in range(1, self.high + 1)]
