"""The machinery that runs text environments for the agent loop: GEM ids (and `math`,
`math:procedural`, the project's own `smoke:*`, or `package.module:Factory`) -> `TextEnv`, preset
lookup, prompt templates, action parsing. The definitions (presets per family, the project's own
environments) live in the package `oat_dppo_envs`, beside this one.

    env = make_env("game:Sudoku-v0-easy", seed=123)
    obs, info = env.reset()
    prompt = render_prompt("qwen3", obs)
    obs, reward, terminated, truncated, info = env.step(response_text)

Importing this package is cheap: GEM (about 1 s) is imported by `make_env` and the id listing.
`python -m oat_dppo.envs --list` prints every known id.
"""

from oat_dppo_envs.math import procedural_math_dataset

from oat_dppo.envs.actions import ACTION_FORMATS, extract_action, is_well_formed
from oat_dppo.envs.adapter import HISTORY_MODES, TextEnv
from oat_dppo.envs.errors import (
    DatasetUnavailableError,
    EnvError,
    EnvOptionError,
    EnvResetError,
    EnvStepError,
    UnknownEnvError,
)
from oat_dppo.envs.math_data import load_math_file
from oat_dppo.envs.presets import (
    FIRST_CLASS_ENV_IDS,
    LOCAL_MATH_ID,
    PROCEDURAL_MATH_ID,
    EnvPreset,
    family_of,
    get_preset,
    known_env_ids,
)
from oat_dppo.envs.registry import make_env
from oat_dppo.envs.templates import CHAT_TEMPLATES, TEMPLATES, chat_turn, render_prompt, stop_strings

__all__ = [
    "ACTION_FORMATS",
    "DatasetUnavailableError",
    "EnvError",
    "EnvOptionError",
    "EnvPreset",
    "EnvResetError",
    "EnvStepError",
    "FIRST_CLASS_ENV_IDS",
    "CHAT_TEMPLATES",
    "HISTORY_MODES",
    "chat_turn",
    "LOCAL_MATH_ID",
    "PROCEDURAL_MATH_ID",
    "TEMPLATES",
    "TextEnv",
    "UnknownEnvError",
    "extract_action",
    "family_of",
    "get_preset",
    "is_well_formed",
    "known_env_ids",
    "load_math_file",
    "make_env",
    "procedural_math_dataset",
    "render_prompt",
    "stop_strings",
]
