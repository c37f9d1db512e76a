r"""Per-environment defaults: instruction text, turn limit, token budget, template hint.

The first-class ids have hand-set presets (tested offline); any other id gets its family's
defaults. The instruction wrappers reproduce GEM's own training templates (`qwen3_game` for games,
`qwen3_general` for reasoning-gym and math) minus the chat markup, which `render_prompt` adds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

# Local math datasets and the offline procedural math set; not GEM registry ids.
LOCAL_MATH_ID = "math"
PROCEDURAL_MATH_ID = "math:procedural"

_BOXED_ASK = "\nPlease reason step by step, and put your final answer within \\boxed{}."
GAME_PREFIX = "You are playing language games. Make valid actions to win.\nObservation: "
QUESTION_PREFIX = "Question: "

# GEM's oat examples: generate_max_length 4096, gamma 0.9 for games and 1.0 otherwise.
_PAPER_MAX_NEW_TOKENS = 4096
# Cap on the number of turns for environments that state none (an episode must end).
DEFAULT_MAX_TURNS = 100
# Eval instances: seeds and data seeds shifted by this, far from any run's training seeds.
EVAL_SEED_OFFSET = 1_000_003
# Families whose GEM envs load a dataset from the Hugging Face hub (`dataset_name=` in the spec).
HUB_FAMILIES = ("math", "eval", "code", "qa", "logic")


@dataclass(frozen=True)
class EnvPreset:
    """Defaults for one environment id. `make_env` options override the env-facing ones."""

    env_id: str
    family: str  # "game", "rg", "math", "eval", "code", "qa", "logic", "import"
    multi_turn: bool
    max_turns: int
    max_new_tokens: int = _PAPER_MAX_NEW_TOKENS
    gamma: float = 1.0
    # An episode's reward when its first response has no parseable action (GEM's games end it with
    # format_error_reward; reasoning-gym and math grade it 0). A batch whose mean reward sits here
    # has collapsed to format failures (study reports count such iterations).
    format_failure_reward: float = 0.0
    template: str = "qwen3"  # a hint for the model family the paper used (Qwen3 base)
    obs_prefix: str = QUESTION_PREFIX
    obs_suffix: str = _BOXED_ASK
    action_format: str = "boxed"
    action_pattern: str | None = None  # regex the boxed answer must fully match to be well formed
    env_kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    data_seed: int = 0  # seed of the data pool (rg dataset, math shuffle), shared by all instances
    eval_seed_offset: int = EVAL_SEED_OFFSET
    # Run step() with a private copy of the global `random`/`np.random` state (games draw from it).
    isolate_step_rng: bool = False
    first_class: bool = False
    hub_dataset: bool = False
    description: str = ""


def _frozen(**kw: Any) -> Mapping[str, Any]:
    return MappingProxyType(dict(kw))


_GAME = dict(
    family="game",
    multi_turn=True,
    gamma=0.9,
    format_failure_reward=-0.1,  # gem.utils.constants.LanguageGameReward.format_error_reward
    obs_prefix=GAME_PREFIX,
    isolate_step_rng=True,
)

_FIRST_CLASS: dict[str, EnvPreset] = {
    p.env_id: p
    for p in (
        EnvPreset(
            env_id="game:Sudoku-v0-easy",
            max_turns=15,
            action_pattern=r"\d+\s\d+\s\d+",
            first_class=True,
            description="4x4 Sudoku, about 9 empty cells, one move per turn (multi-turn)",
            **_GAME,
        ),
        EnvPreset(
            env_id="game:Sudoku-v0-hard",
            max_turns=50,
            action_pattern=r"\d+\s\d+\s\d+",
            first_class=True,
            description="9x9 Sudoku, about 47 empty cells in 50 turns (multi-turn)",
            **_GAME,
        ),
        EnvPreset(
            env_id="rg:arc_1d",
            family="rg",
            multi_turn=False,
            max_turns=1,
            # arc_1d generates items lazily, so a huge pool costs nothing and never repeats.
            env_kwargs=_frozen(size=1_000_000),
            first_class=True,
            description="reasoning-gym 1D ARC: infer the rule, output the test grid (single-turn)",
        ),
        EnvPreset(
            env_id="rg:acre",
            family="rg",
            multi_turn=False,
            max_turns=1,
            # ACRE generates its whole pool up front (about 0.3 s per 2000 items).
            env_kwargs=_frozen(size=2000),
            first_class=True,
            description="reasoning-gym ACRE blicket causal induction: on/off/undetermined (single-turn)",
        ),
        EnvPreset(
            env_id=LOCAL_MATH_ID,
            family="math",
            multi_turn=False,
            max_turns=1,
            first_class=True,
            description="math problems from a local file (--math-data FILE), graded by GEM's MathEnv",
        ),
        EnvPreset(
            env_id=PROCEDURAL_MATH_ID,
            family="math",
            multi_turn=False,
            max_turns=1,
            first_class=True,
            description="offline arithmetic/equations from reasoning-gym, graded by GEM's MathEnv",
        ),
    )
}

FIRST_CLASS_ENV_IDS: tuple[str, ...] = tuple(_FIRST_CLASS)

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def family_of(env_id: str) -> str:
    """The id's family: its GEM prefix (`game`, `rg`, ...) or `import` for `pkg.module:Factory`."""
    if env_id == LOCAL_MATH_ID:
        return "math"
    prefix = env_id.split(":", 1)[0]
    if prefix in ("game", "rg") + HUB_FAMILIES:
        return prefix
    return "import" if _IMPORT_PATH.match(env_id) else prefix


def get_preset(env_id: str) -> EnvPreset:
    """The preset of a first-class id, else defaults for the id's family.

    For GEM games the turn limit comes from GEM's registration (`max_turns`), so this imports GEM."""
    if env_id in _FIRST_CLASS:
        return _FIRST_CLASS[env_id]
    family = family_of(env_id)
    if family == "game":
        from oat_dppo.envs._gem import gem_registry

        spec = gem_registry().get(env_id)
        turns = spec.kwargs.get("max_turns") if spec is not None else None
        return EnvPreset(env_id=env_id, max_turns=turns or DEFAULT_MAX_TURNS, **_GAME)
    if family == "rg":
        # Most reasoning-gym datasets are lazy (ACRE and word_ladder are not): a large pool by default.
        kwargs = {} if env_id in ("rg:word_ladder", "rg:composite") else {"size": 1_000_000}
        return EnvPreset(env_id, "rg", multi_turn=False, max_turns=1, env_kwargs=_frozen(**kwargs))
    if family in HUB_FAMILIES:
        return _hub_preset(env_id, family)
    # A user's gymnasium-style env: its observations are taken as they are.
    return replace(
        EnvPreset(env_id, "import", multi_turn=True, max_turns=DEFAULT_MAX_TURNS),
        obs_prefix="", obs_suffix="", isolate_step_rng=True,
    )


def _gem_entry_point(env_id: str) -> str:
    from oat_dppo.envs._gem import gem_registry

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
    base = EnvPreset(env_id, family, multi_turn=False, max_turns=1, hub_dataset=True)
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
        from oat_dppo.envs._gem import gem_registry

        if not gem_registry()[env_id].kwargs.get("extract_boxed", False):
            return replace(
                base, action_format="answer_tag",
                obs_suffix="\nPlease reason step by step, and put your final answer within "
                "<answer> </answer> tags.",
            )
    return base


def known_env_ids() -> list[str]:
    """Every id `make_env` knows by name: all GEM-registered ids plus `math` and `math:procedural`
    (sorted). Imports GEM."""
    from oat_dppo.envs._gem import gem_registry

    return sorted(set(gem_registry()) | {LOCAL_MATH_ID, PROCEDURAL_MATH_ID})
