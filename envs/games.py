"""GEM's language games (`game:*`): multi-turn, one move per turn, discounted returns (gamma 0.9)."""

from __future__ import annotations

import math
import re

from .preset import DEFAULT_MAX_TURNS, GAME_PREFIX, EnvPreset

# What every game shares. GEM's games draw from the global `random`: each instance gets a private copy.
GAME = dict(
    family="game",
    multi_turn=True,
    gamma=0.9,
    format_failure_reward=-0.1,  # gem.utils.constants.LanguageGameReward.format_error_reward
    obs_prefix=GAME_PREFIX,
    isolate_step_rng=True,
)

PRESETS = (
    EnvPreset(
        env_id="game:Sudoku-v0-easy",
        max_turns=15,
        action_pattern=r"\d+\s\d+\s\d+",
        first_class=True,
        description="4x4 Sudoku, about 9 empty cells, one move per turn (multi-turn)",
        **GAME,
    ),
    EnvPreset(
        env_id="game:Sudoku-v0-hard",
        max_turns=50,
        action_pattern=r"\d+\s\d+\s\d+",
        first_class=True,
        description="9x9 Sudoku, about 47 empty cells in 50 turns (multi-turn)",
        **GAME,
    ),
)


def family_preset(env_id: str, max_turns: int | None) -> EnvPreset:
    """Any other game: the family's defaults, with the turn limit GEM registered for it."""
    probe = "oat_dppo_envs.games:GUESS_THE_NUMBER" if env_id.startswith("game:GuessTheNumber-") else None
    return EnvPreset(env_id=env_id, max_turns=max_turns or DEFAULT_MAX_TURNS, feedback_probe=probe, **GAME)


class GuessTheNumberFeedback:
    """Feedback use in GEM's GuessTheNumber: its reply to a valid wrong guess is "At turn 2, you
    guessed 5, and the target number is higher than 5."; a guess is the last `\\boxed{N}`."""

    _HINT = re.compile(r"you guessed (\d+), and the target number is (higher|lower) than")
    _GUESS = re.compile(r"\\boxed\{(\d+)\}")  # GEM's own pattern

    def follows(self, observation: str, action: str) -> bool | None:
        hint = self._HINT.search(observation)
        guesses = self._GUESS.findall(action)
        if hint is None or not guesses:
            return None
        previous, guess = int(hint.group(1)), int(guesses[-1])
        return guess > previous if hint.group(2) == "higher" else guess < previous

    def changed(self, observation: str) -> str | None:
        """The reply had the target been on the other side (`oat_dppo.agent.reply_effect`)."""
        hint = self._HINT.search(observation)
        if hint is None:
            return None
        other = "lower" if hint.group(2) == "higher" else "higher"
        return observation[: hint.start(2)] + other + observation[hint.end(2):]

    def moves(self, env) -> list[str]:
        """Every guess in the env's range, as GEM reads it (none for the random-range variant)."""
        low, high = getattr(env, "min_number", None), getattr(env, "max_number", None)
        if low is None or high is None or getattr(env, "_is_random", False):
            return []
        return [f"\\boxed{{{n}}}" for n in range(low, high + 1)]

    def blind_success(self, env, max_turns: int) -> float:
        """min(turns, N) distinct guesses of N equally likely targets (NaN for the random-range variant,
        whose range is drawn at every reset)."""
        low, high = getattr(env, "min_number", None), getattr(env, "max_number", None)
        if low is None or high is None or getattr(env, "_is_random", False):
            return math.nan
        n = high - low + 1
        return min(max_turns, getattr(env, "max_turns", max_turns), n) / n


GUESS_THE_NUMBER = GuessTheNumberFeedback()
