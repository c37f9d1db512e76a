"""GEM's language games (`game:*`): multi-turn, one move per turn, discounted returns (gamma 0.9)."""

from __future__ import annotations

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
    return EnvPreset(env_id=env_id, max_turns=max_turns or DEFAULT_MAX_TURNS, **GAME)
