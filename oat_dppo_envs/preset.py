r"""`EnvPreset`: one environment's defaults (instruction text, turn limit, token budget, answer
format, discount), and the texts and numbers the families share.

The instruction wrappers reproduce GEM's own training templates (`qwen3_game` for games,
`qwen3_general` for reasoning-gym and math) minus the chat markup, which `render_prompt` adds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

BOXED_ASK = "\nPlease reason step by step, and put your final answer within \\boxed{}."
GAME_PREFIX = "You are playing language games. Make valid actions to win.\nObservation: "
QUESTION_PREFIX = "Question: "

# GEM's oat examples: generate_max_length 4096, gamma 0.9 for games and 1.0 otherwise.
PAPER_MAX_NEW_TOKENS = 4096
# Cap on the number of turns for environments that state none (an episode must end).
DEFAULT_MAX_TURNS = 100
# Eval instances: seeds and data seeds shifted by this, far from any run's training seeds.
EVAL_SEED_OFFSET = 1_000_003


@dataclass(frozen=True)
class EnvPreset:
    """Defaults for one environment id. `make_env` options override the env-facing ones."""

    env_id: str
    family: str  # "game", "rg", "math", "eval", "code", "qa", "logic", "smoke", "import"
    multi_turn: bool
    max_turns: int
    max_new_tokens: int = PAPER_MAX_NEW_TOKENS
    gamma: float = 1.0
    # An episode's reward when its first response has no parseable action (GEM's games end it with
    # format_error_reward; reasoning-gym and math grade it 0). A batch whose mean reward sits here
    # has collapsed to format failures (study reports count such iterations).
    format_failure_reward: float = 0.0
    # Feedback use (games whose replies say which way to move): "module:object" naming a probe with
    # `follows(observation, action) -> bool | None` (the action moves the way the env's newest reply
    # said; None where that reply gives no direction) and `blind_success(env, max_turns) -> float` (the
    # most success a policy that ignores every reply can reach in that env instance). Envs of the
    # project's own and users' may define `follows_feedback` / `feedback_blind_success` methods instead.
    feedback_probe: str | None = None
    template: str = "qwen3"  # a hint for the model family the paper used (Qwen3 base)
    obs_prefix: str = QUESTION_PREFIX
    obs_suffix: str = BOXED_ASK
    action_format: str = "boxed"
    action_pattern: str | None = None  # regex the boxed answer must fully match to be well formed
    env_kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    data_seed: int = 0  # seed of the data pool (rg dataset, math shuffle), shared by all instances
    eval_seed_offset: int = EVAL_SEED_OFFSET
    # What names a task for the train / validation / test splits (oat_dppo.envs.splits): "observation" (the
    # first observation, where it shows the task: a board, a question) or "seed" (where every task starts
    # with the same text, GuessTheNumber's hidden number).
    split_key: str = "seed"
    # The few answers a question allows, where they are few (ACRE's labels): with `attempts` (oat_dppo.envs.retry)
    # a wrong answer's reply then declares its counterfactual for the reply effect.
    answer_labels: tuple[str, ...] = ()
    # Run step() with a private copy of the global `random`/`np.random` state (games draw from it).
    isolate_step_rng: bool = False
    first_class: bool = False
    hub_dataset: bool = False
    description: str = ""
    # The project's own environments: the factory `make_env` builds ("module:Class"), else None.
    factory: str | None = None


def frozen(**kw: Any) -> Mapping[str, Any]:
    """An immutable mapping of constructor options (presets are shared by every instance)."""
    return MappingProxyType(dict(kw))
