r"""`--env-option attempts=N`: a single-turn question answered in up to N turns, the grader replying between.

A single-turn environment (reasoning-gym's ACRE and Arc1D, math) grades one answer and ends. Wrapped, a wrong
answer gets the grader's reply instead of the end, e.g. "Your answer `on` is not correct. 1 attempt left.",
and the policy answers the same question again: a multi-turn task whose replies carry information (what not to
answer again), which a policy that reads them can use and one that ignores them cannot. The episode ends at a
right answer, at the last attempt, or at a reply without a `\boxed{}` answer (as a game ends at a format
failure). A turn's reward is the grader's where the episode ends there, else 0: a near miss's partial credit
(reasoning-gym pays a label inside a longer answer in part) is paid once, not at every attempt.

Where the preset names the few answers a question allows (`EnvPreset.answer_labels`: ACRE's on / off /
undetermined), the reply declares its counterfactual (`oat_dppo.agent.reply_effect`): the same reply naming
another label, the labels as the moves scored, and as the moves a reply favours those it did not name. A policy
that ignores the reply moves the same under both: 0 (tests/test_retry.py).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from oat_dppo.envs.actions import extract_action

#: What counts as right: the grader's full reward (reasoning-gym and GEM's math grade 1.0 for a right answer).
RIGHT = 1.0
_NAMED = re.compile(r"Your answer `([^`]*)` is not correct\.")


def wrong_reply(answer: str, attempts_left: int) -> str:
    left = f"{attempts_left} attempt{'s' if attempts_left != 1 else ''} left"
    return f"Your answer `{answer}` is not correct. {left}."


def named_wrong(observation: str) -> list[str]:
    """The answers the replies in `observation` named as not correct, oldest first."""
    return _NAMED.findall(observation)


class RetryAnswer:
    """`inner` (a single-turn env: `step` grades the reset's question without changing it) answered in up to
    `attempts` turns; `labels`: the answers a question allows where they are few (else the reply declares no
    counterfactual)."""

    def __init__(self, inner: Any, attempts: int, labels: Sequence[str] = ()):
        if int(attempts) < 2:
            raise ValueError(f"attempts must be >= 2 to retry (1 is the environment as it is), got {attempts!r}")
        self.inner, self.attempts, self.labels = inner, int(attempts), tuple(labels)
        self._turn = 0

    def reset(self, seed: int | None = None):
        self._turn = 0
        return self.inner.reset(seed=seed)

    def step(self, action: str):
        self._turn += 1
        _, reward, _, _, info = self.inner.step(action)
        answer = extract_action(action)
        if float(reward) >= RIGHT or answer is None or self._turn >= self.attempts:
            return "", float(reward), True, False, dict(info or {})
        return wrong_reply(answer.strip(), self.attempts - self._turn), 0.0, False, False, {}

    # The reply's counterfactual (labels only), read by the adapter as any env's own.
    def follows_feedback(self, observation: str, action: str) -> bool | None:
        named, answer = named_wrong(observation), extract_action(action)
        if not named or answer is None:
            return None
        return answer.strip() != named[-1]

    def changed_reply(self, observation: str) -> str | None:
        named = _NAMED.search(observation)
        if named is None or named.group(1) not in self.labels:
            return None
        other = self.labels[(self.labels.index(named.group(1)) + 1) % len(self.labels)]
        return observation[: named.start(1)] + other + observation[named.end(1):]

    def reply_moves(self, observation: str) -> list[str]:
        return [f"\\boxed{{{label}}}" for label in self.labels]

    def __getattr__(self, name: str) -> Any:  # the inner env's own attributes (its pool, its data)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
