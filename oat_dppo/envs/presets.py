r"""Which preset an environment id gets: the hand-set one of a first-class id (the definitions of the package
`oat_dppo_envs`), else its family's defaults.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from oat_dppo_envs import DEFAULT_MAX_TURNS, EVAL_SEED_OFFSET, FIRST_CLASS, OWN_ENV_IDS, EnvPreset, games, reasoning_gym
from oat_dppo_envs.math import LOCAL_MATH_ID, PROCEDURAL_MATH_ID
from oat_dppo_envs.preset import BOXED_ASK, frozen

from oat_dppo.envs._gem import gem_registry  # cheap: GEM itself is imported on the first call
from oat_dppo.envs.imports import ImportPathError, load_object

FIRST_CLASS_ENV_IDS: tuple[str, ...] = tuple(FIRST_CLASS)
# Families whose GEM envs load a dataset from the Hugging Face hub (`dataset_name=` in the spec).
HUB_FAMILIES = ("math", "eval", "code", "qa", "logic")

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

__all__ = ["BOXED_ASK", "DEFAULT_MAX_TURNS", "EVAL_SEED_OFFSET", "EnvPreset", "FIRST_CLASS_ENV_IDS", "HUB_FAMILIES",
           "LOCAL_MATH_ID", "OWN_ENV_IDS", "PROCEDURAL_MATH_ID", "family_of", "frozen", "get_preset", "known_env_ids",
           "plays_turns", "takes_math_data"]


def family_of(env_id: str) -> str:
    """The id's family: its GEM prefix (`game`, `rg`, ...), `smoke` for the project's own, or
    `import` for `pkg.module:Factory`."""
    if env_id == LOCAL_MATH_ID:
        return "math"
    if env_id in FIRST_CLASS:
        return FIRST_CLASS[env_id].family
    prefix = env_id.split(":", 1)[0]
    if prefix in ("game", "rg") + HUB_FAMILIES:
        return prefix
    return "import" if _IMPORT_PATH.match(env_id) else prefix


def get_preset(env_id: str) -> EnvPreset:
    """The preset of a first-class id, else defaults for the id's family.

    For GEM games the turn limit comes from GEM's registration (`max_turns`), so this imports GEM."""
    if env_id in FIRST_CLASS:
        return FIRST_CLASS[env_id]
    family = family_of(env_id)
    if family == "game":
        spec = gem_registry().get(env_id)  # imports GEM (about 1 s): only for games
        return games.family_preset(env_id, spec.kwargs.get("max_turns") if spec is not None else None)
    if family == "rg":
        return reasoning_gym.family_preset(env_id)
    if family in HUB_FAMILIES:
        return _hub_preset(env_id, family)
    # A user's gymnasium-style env: its observations are taken as they are.
    return replace(
        EnvPreset(env_id, "import", multi_turn=True, max_turns=DEFAULT_MAX_TURNS),
        obs_prefix="", obs_suffix="", isolate_step_rng=True,
        format_failure_reward=_declared_format_failure_reward(env_id),
    )


def plays_turns(env_id: str, options: dict[str, Any]) -> bool:
    """Whether an episode of `env_id` under its `make_env` options can last more than one turn: a multi-turn
    preset, or a single-turn question answered in `attempts` turns (`oat_dppo.envs.retry`)."""
    return get_preset(env_id).multi_turn or int(options.get("attempts", 1)) > 1


def _declared_format_failure_reward(env_id: str) -> float:
    """An imported env's `format_failure_reward` attribute (the reward of a reply without a parseable
    action, which study reports count as collapse), else 0. Imports the env's module, as `make_env`
    does; an id that names nothing gets 0 here and its error from `make_env`."""
    try:
        factory = load_object(env_id)
    except ImportPathError:
        return 0.0
    return float(getattr(factory, "format_failure_reward", 0.0))


def _gem_entry_point(env_id: str) -> str:
    spec = gem_registry().get(env_id)
    return str(spec.entry_point) if spec is not None else ""


def takes_math_data(env_id: str) -> bool:
    """Whether `math_data=FILE` can replace the env's dataset: `math` and GEM ids served by
    GEM's MathEnv (math:Math12K, eval:MATH500, ...; not the QA, code or visual ones)."""
    if env_id == LOCAL_MATH_ID:
        return True
    return family_of(env_id) in ("math", "eval") and _gem_entry_point(env_id).endswith("math_env:MathEnv")


def _hub_preset(env_id: str, family: str) -> EnvPreset:
    # GEM ids load their data from the hub; the grader (named by the entry point) fixes the
    # answer format: MathEnv and RuleTaker read \boxed{}, CodeEnv a code block, QaEnv <answer>.
    entry_point = _gem_entry_point(env_id)
    base = EnvPreset(env_id, family, multi_turn=False, max_turns=1, hub_dataset=True, split_key="observation")
    if entry_point.endswith("code_env:CodeEnv"):
        return replace(
            base, action_format="code",
            obs_prefix=(
                "You are an expert Python programmer. You will be given a question (problem "
                "specification) and will generate a correct Python program that matches the "
                "specification and passes all tests.\nQuestion: "
            ),
            obs_suffix="\nPlease reason step by step, and write your code in markdown format, "
            "e.g., ```python\n# YOUR CODE HERE\n```.",
        )
    if entry_point.endswith("qa_env:QaEnv"):
        if not gem_registry()[env_id].kwargs.get("extract_boxed", False):
            return replace(
                base, action_format="answer_tag",
                obs_suffix="\nPlease reason step by step, and put your final answer within "
                "<answer> </answer> tags.",
            )
    return base


def known_env_ids() -> list[str]:
    """Every id `make_env` knows by name: all GEM-registered ids, `math`, `math:procedural` and the
    project's own (sorted). Imports GEM."""
    return sorted(set(gem_registry()) | {LOCAL_MATH_ID, PROCEDURAL_MATH_ID} | set(OWN_ENV_IDS))
