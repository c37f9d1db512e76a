"""What the agent loop produces: episodes of turns, each turn one trainable transition."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Turn:
    """One policy step: the prompt it saw, what it sampled, and mu for every sampled token."""

    prompt_ids: list[int]
    response_ids: list[int]
    behavior_logprobs: np.ndarray  # [L] float32, log mu of each response token
    reward: float
    done: bool  # the episode ended after this turn (terminated or truncated)
    truncated: bool
    well_formed: bool
    finish_reason: str  # "stop" | "length"
    topk_ids: np.ndarray | None = None  # [L, K+1] int64, -1 on unused slots
    topk_logprobs: np.ndarray | None = None  # [L, K+1] float32, -inf on unused slots
    prompt_text: str = ""
    response_text: str = ""
    # The response moved the way the env's previous reply said (None: that reply gave no direction,
    # or the env declares no feedback probe). See `TextEnv`'s `follows_feedback`.
    follows_feedback: bool | None = None
    # The env's declared counterfactual of the reply this turn followed (None: no reply with
    # information, or none declared): {"changed_observation", "moves", "favoured"}, see
    # `oat_dppo.agent.reply_effect`.
    counterfactual: dict | None = None
    # The kind of reply this turn's action got, where the env classifies them (Sudoku: "correct",
    # "filled", "violates", ...; see `TextEnv`'s `outcome`), counted per episode by the metrics.
    outcome: str | None = None
    # The env's observation this turn answered (its state as the policy was shown it): turns of a group
    # that saw the same one form a step group (`--advantage gigpo`).
    observation: str = ""
    # Filled by `advantages.assign_advantages`.
    ret: float = 0.0
    advantage: float = 0.0

    @property
    def num_tokens(self) -> int:
        return len(self.response_ids)


@dataclass
class Episode:
    env_index: int
    seed: int  # the episode's start seed: episodes sharing it form a GRPO group
    turns: list[Turn] = field(default_factory=list)
    error: str | None = None  # set when the env raised; the episode is then not trained on
    truncated_by_context: bool = False  # the prompt outgrew the model's context
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def episode_return(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def finished(self) -> bool:
        return self.error is not None or (bool(self.turns) and self.turns[-1].done) or self.truncated_by_context
