"""The project's own environments for tests and smoke runs with tiny random models.

`smoke:digits`: a reply earns the share of its characters that are digits (0 to 1). A random byte-level tiny model
writes a digit about once in 25 characters, so the rewards of a batch vary from the first iteration
(non-zero advantages: the trust region and the optimizer have something to act on), and a few
iterations at a high learning rate raise them visibly. Two turns per episode, the second seeing the
first reply: multi-turn bookkeeping is exercised too. GEM games give such models a constant format
failure instead (every episode -0.1, zero advantages, zero gradients).

`smoke:hidden_digit`: guess a hidden digit 0..9 in 4 turns; each wrong guess is answered "higher"
or "lower". Reading the replies is necessary to do well: a policy that ignores them says a fixed
sequence of digits whatever the target is, and finds it in at most 4 of 10 targets (success <= 0.4);
binary search finds every target (success 1.0). With `feedback=False` the replies only say "no",
which takes the bound down for every policy: the control of the credit-assignment test.

`smoke:ask_first`: credit across turns. Turn 1: ask (the reply reveals a key) or not (the reply says
nothing); turn 2: answer. Only a right answer pays (1), and only on turn 2: turn 1's action earns
nothing itself, yet decides whether turn 2 can beat chance. A policy that never asks succeeds 1 time
in `keys`; one that always asks and reads the key, always. Learning to ask needs turn 2's reward to
reach turn 1 (gamma > 0): with gamma 0 turn 1's return is 0 whatever it did.
"""

from __future__ import annotations

import random
import re

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
    EnvPreset(
        env_id="smoke:hidden_digit",
        family="smoke",
        multi_turn=True,
        max_turns=4,
        max_new_tokens=2,  # a digit and a stop
        obs_prefix="",
        obs_suffix="",
        action_format="any",  # a reply without a digit is a wasted guess, not a format failure
        first_class=True,
        factory="oat_dppo_envs.smoke:HiddenDigit",
        description="guess a hidden digit in 4 turns from higher/lower replies: blind success <= 0.4 (multi-turn)",
    ),
    EnvPreset(
        env_id="smoke:ask_first",
        family="smoke",
        multi_turn=True,
        max_turns=2,
        max_new_tokens=1,  # one character a turn
        obs_prefix="",
        obs_suffix="",
        action_format="any",
        first_class=True,
        factory="oat_dppo_envs.smoke:AskFirst",
        description="turn 1: ask for a key or not; turn 2: answer; only a right answer pays (multi-turn credit)",
    ),
)

_DIGIT = re.compile(r"\d")
_HINT = re.compile(r"(\d): (higher|lower)\.")


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


def first_digit(text: str) -> int | None:
    """The guess a reply makes: its first digit character, else None."""
    found = _DIGIT.search(text)
    return int(found.group()) if found else None


def first_char_digit(text: str, digits: int = 10) -> int | None:
    """The guess of `guess="any_char"`: the first character's code point minus '0', modulo `digits`. Digits
    name themselves and every other character names one too, so a random byte-level model guesses
    every digit alike from its first reply instead of first learning to write digits."""
    return (ord(text[0]) - ord("0")) % digits if text else None


def follows_hint(observation: str, action: str, read_guess=first_digit) -> bool | None:
    """Whether `action`'s guess (as `read_guess` reads it) moves the way the hint `observation` (the
    env's newest reply) gave: after "5: higher." a guess above 5. None when the reply is no hint or
    the action no guess."""
    hint = _HINT.fullmatch(observation.strip())
    guess = read_guess(action)
    if hint is None or guess is None:
        return None
    previous = int(hint.group(1))
    return guess > previous if hint.group(2) == "higher" else guess < previous


def changed_hint(observation: str) -> str | None:
    """The hint `observation` with its direction reversed ("5: higher." -> "5: lower."); None when it is no hint."""
    hint = _HINT.fullmatch(observation.strip())
    if hint is None:
        return None
    other = "lower" if hint.group(2) == "higher" else "higher"
    return observation.replace(f"{hint.group(1)}: {hint.group(2)}.", f"{hint.group(1)}: {other}.")


class HiddenDigit:
    """A hidden digit 0..`digits`-1, `max_turns` guesses (the first digit of each reply, or with
    `guess="any_char"` its first character). Reward 1 on a hit
    (the episode ends); a miss is answered "N: higher." or "N: lower." (`feedback=False`: "N: no.").
    A wasted guess costs `wasted_guess_reward`: a reply without a digit, a digit said before, or one
    the replies already ruled out. (A random byte-level model writes a digit in 1 reply of 26: the
    cost is what teaches it to guess at all, and to read the replies within a minute of CPU time.
    Without feedback only repeats are ruled out, so the control is not charged for what it cannot see.)"""

    def __init__(self, seed: int = 0, max_turns: int = 4, feedback: bool = True, reveal: bool = False, guess: str = "digit", digits: int = 10, wasted_guess_reward: float = -0.1):
        self.max_turns = max_turns
        self.feedback = bool(feedback)
        self.reveal = bool(reveal)
        if guess not in ("digit", "any_char"):
            raise ValueError(f"guess must be 'digit' or 'any_char', got {guess!r}")
        if not 2 <= int(digits) <= 10:
            raise ValueError(f"digits must be in 2..10, got {digits!r}")
        self.digits = int(digits)
        self._read_guess = first_digit if guess == "digit" else (lambda text: first_char_digit(text, self.digits))
        self.wasted_guess_reward = float(wasted_guess_reward)
        self._rng = random.Random(seed)
        self._target = 0
        self._turn = 0
        self._open: set[int] = set()  # the digits the replies so far leave possible

    def reset(self, seed: int | None = None):
        self._rng = random.Random(seed)
        self._target = self._rng.randrange(self.digits)
        self._turn = 0
        self._open = set(range(self.digits))
        return f"Guess my digit (0-{self.digits - 1}).", {}

    def step(self, action: str):
        self._turn += 1
        truncated = self._turn >= self.max_turns
        guess = self._read_guess(action)
        if self.reveal and self._turn == 1:  # the first reply tells the digit; the first guess only asks
            return f"it is {self._target}." if self.feedback else "ok.", 0.0, False, truncated, {"success": False}
        if guess == self._target:
            return f"{guess}: yes!", 1.0, True, False, {"success": True}
        if guess is None:
            return "no digit.", self.wasted_guess_reward, False, truncated, {"success": False}
        reward = 0.0 if guess in self._open else self.wasted_guess_reward
        self._open.discard(guess)
        if not self.feedback:
            return f"{guess}: no.", reward, False, truncated, {"success": False}
        higher = guess < self._target
        self._open = {d for d in self._open if (d > guess) == higher}
        return f"{guess}: {'higher' if higher else 'lower'}.", reward, False, truncated, {"success": False}

    @property
    def target(self) -> int:
        """The hidden digit of the current episode (for tests and analyses; the policy never sees it)."""
        return self._target

    # What the adapter reads to measure feedback use (see `EnvPreset.feedback_probe`).
    def follows_feedback(self, observation: str, action: str) -> bool | None:
        return follows_hint(observation, action, self._read_guess)

    # What `oat_dppo.agent.reply_effect` reads: the reply had the target been on the other side, and
    # the moves it scores (the digits, which name themselves in both guess modes).
    def changed_reply(self, observation: str) -> str | None:
        return changed_hint(observation)

    def reply_moves(self, observation: str) -> list[str]:
        return [str(d) for d in range(self.digits)]

    def feedback_blind_success(self, max_turns: int) -> float:
        """A policy that ignores the replies says the same digits whatever the target: at most one
        distinct guess per scoring turn (reveal mode: the first turn cannot score) of `digits` equally
        likely targets."""
        guesses = min(max_turns, self.max_turns) - (1 if self.reveal else 0)
        return min(guesses, self.digits) / self.digits


class AskFirst:
    """Credit across turns: the reward comes on turn 2 and depends on turn 1's action.

    A reply names a number by its first character (code point minus '0', modulo `keys`; every
    character names one, so a random byte-level model does from its first reply). Turn 1 asks when
    its first character's code point is a multiple of `ask_one_in` (a random model's first characters
    are far from uniform: tiny-qwen3 asks about 1 time in 4 at 2): the reply is the key K written
    `width` times ("2222222222"; a whole reply of it is what a random model reads soonest), else
    `width` dashes. Turn 2 answers: reward 1 when it names K, 0 otherwise; the episode ends there.
    Never asking: success 1/`keys`; always asking and reading: 1. (`max_turns` is fixed at 2.)"""

    def __init__(self, seed: int = 0, max_turns: int = 2, keys: int = 4, ask_one_in: int = 2, width: int = 10):
        if int(max_turns) != 2:
            raise ValueError(f"smoke:ask_first has exactly 2 turns, got max_turns={max_turns!r}")
        if not 2 <= int(keys) <= 10:
            raise ValueError(f"keys must be in 2..10, got {keys!r}")
        self.max_turns, self.keys = 2, int(keys)
        self.ask_one_in, self.width = max(1, int(ask_one_in)), max(1, int(width))
        self._rng = random.Random(seed)
        self._key, self._turn, self.asked = 0, 0, False

    def reset(self, seed: int | None = None):
        self._rng = random.Random(seed)
        self._key, self._turn, self.asked = self._rng.randrange(self.keys), 0, False
        return "Ask for the key, or answer blind.", {}

    def step(self, action: str):
        self._turn += 1
        if self._turn == 1:
            self.asked = bool(action) and ord(action[0]) % self.ask_one_in == 0
            reply = str(self._key) * self.width if self.asked else "-" * self.width
            return reply, 0.0, False, False, {"asked": self.asked}
        right = first_char_digit(action, self.keys) == self._key
        return ("right." if right else "wrong."), float(right), True, False, {"success": right, "asked": self.asked}

    @property
    def key(self) -> int:
        """The current episode's key (for tests; the policy sees it only after asking)."""
        return self._key
