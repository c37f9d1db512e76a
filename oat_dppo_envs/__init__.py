"""The environment definitions of oat_dppo (the package `oat_dppo_envs`, beside the runtime `oat_dppo`).

    preset.py          `EnvPreset`: an environment's defaults (instructions, turns, budget, format)
    games.py           GEM's language games (`game:*`): Sudoku, GuessTheNumber, ... (multi-turn)
    reasoning_gym.py   reasoning-gym tasks through GEM (`rg:*`): Arc1D, ACRE, ... (single-turn)
    math.py            `math` (a local file) and `math:procedural` (offline arithmetic and equations)
    smoke.py           the project's own `smoke:digits`: a reward that tiny random models earn
    custom_example.py  how to write your own (`--env oat_dppo_envs.custom_example:HigherLower`)

The machinery that runs any environment (`make_env`, the adapter, prompt templates, action parsing)
lives in `oat_dppo.envs`; nothing here imports it. Installed with the project (`pip install -e .`),
so Oat's actor processes find these definitions as they find `oat_dppo`.
"""

from . import games, math, reasoning_gym, smoke
from .preset import DEFAULT_MAX_TURNS, EVAL_SEED_OFFSET, EnvPreset

#: Hand-set presets of the ids tested offline, by id.
FIRST_CLASS: dict[str, EnvPreset] = {
    p.env_id: p for module in (games, reasoning_gym, math, smoke) for p in module.PRESETS
}
#: The project's own environments (built from `EnvPreset.factory`, not from GEM's registry).
OWN_ENV_IDS: tuple[str, ...] = tuple(i for i, p in FIRST_CLASS.items() if p.factory)

__all__ = ["DEFAULT_MAX_TURNS", "EVAL_SEED_OFFSET", "EnvPreset", "FIRST_CLASS", "OWN_ENV_IDS", "games", "math",
           "reasoning_gym", "smoke"]
