"""What travels from the actor to the learner, and how it becomes a `TokenBatch`.

The unit is the episode (`DPPOEpisodeData`, single-turn ones included): Oat's collector splits an actor's
items evenly between its learners, so a fixed count of episodes travels however many turns they hold. A
turn (`DPPOTransitionData`) adds to Oat's `TransitionData` its advantage (computed in the actor, where group
baselines see whole groups) and mu's top-K, as dataclass fields in compact numpy arrays, not in `info`,
whose every key Oat's collector averages. The learner's dataset (`EpisodeTurns`) unpacks the episodes into
their turns; `to_token_batch` packs them. Imports Oat's types only (torch, no vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import torch
from oat.types import TransitionData

from oat_dppo.agent.types import Turn
from oat_dppo.learner.batch import Sample, TokenBatch, chains, collate


@dataclass
class DPPOTransitionData(TransitionData):
    """One turn. Plain `TransitionData` (no advantage, no top-K) is accepted by the learner too."""

    advantage: Optional[float] = None  # the turn's advantage, shared by its tokens
    topk_ids: Optional[np.ndarray] = None  # [L, K+1] int32, -1 on unused slots
    topk_logprobs: Optional[np.ndarray] = None  # [L, K+1] float32, -inf on unused slots


@dataclass
class DPPOEpisodeData(TransitionData):
    """One episode: its trainable turns in order. The fields of `TransitionData` summarize it for Oat's
    collector metrics (`actor/response_tok_len`: tokens sampled in the episode; `actor/avg_reward`: its
    best turn's reward); the learner reads `turns`."""

    turns: list = field(default_factory=list)  # [DPPOTransitionData], turns with a response


def episode_data(turns: Sequence[Turn], *, ignore_no_eos: bool = False, info: dict | None = None) -> DPPOEpisodeData:
    """A played episode's turns (advantages assigned) -> the item an Oat actor sends. Turns without a
    response token (nothing to train) are left out; an episode that failed travels with no turn, so that
    the actor's count of items stays exact."""
    trained = [transition_from_turn(t, ignore_no_eos=ignore_no_eos) for t in turns if t.response_ids]
    return DPPOEpisodeData(
        prompt=trained[0].prompt if trained else "",
        prompt_ids=list(trained[0].prompt_ids) if trained else [],
        response="".join(t.response for t in trained),
        response_ids=[i for t in trained for i in t.response_ids],
        response_logprobs=[],
        rewards=[float(t.reward) for t in turns] or [0.0],
        info=dict(info or {}),
        turns=trained,
    )


def episode_tokens(item: TransitionData) -> int:
    """Tokens the learner computes for an item: each row `to_token_batch` packs it into (one for a chat episode)."""
    turns = turns_of(item)
    return sum(len(turns[r[-1]].prompt_ids) + len(turns[r[-1]].response_ids) for r in chains(turns, [0] * len(turns)))


def turns_of(item: TransitionData) -> list:
    """The transitions an item trains: an episode's turns, or the item itself (plain `TransitionData`)."""
    return list(item.turns) if isinstance(item, DPPOEpisodeData) else [item]


def transition_from_turn(turn: Turn, *, ignore_no_eos: bool = False) -> DPPOTransitionData:
    """A played turn (advantage assigned) -> the transition an episode carries."""
    L = len(turn.response_ids)
    rewards = [0.0] * L
    if L:
        rewards[-1] = float(turn.reward)  # Oat's dense convention: the reward on the last token
    return DPPOTransitionData(
        prompt=turn.prompt_text,
        prompt_ids=list(turn.prompt_ids),
        response=turn.response_text,
        response_ids=list(turn.response_ids),
        response_logprobs=np.asarray(turn.behavior_logprobs, dtype=np.float32).tolist(),
        rewards=rewards,
        # Oat's --ignore-no-eos: responses cut by the budget are not trained on.
        loss_mask=not (ignore_no_eos and turn.finish_reason == "length"),
        info={},  # the episode's item carries the round's metrics
        advantage=float(turn.advantage),
        # int32 ids and float32 log-probs: [4096, 21] is 344 KiB per turn through Oat's plasma store.
        topk_ids=None if turn.topk_ids is None else np.asarray(turn.topk_ids, dtype=np.int32),
        topk_logprobs=None if turn.topk_logprobs is None else np.asarray(turn.topk_logprobs, dtype=np.float32),
    )


class EpisodeTurns(torch.utils.data.Dataset):
    """Oat's `dataset_builder` for the buffer: its episodes' turns in order, each as (episode, transition)
    (a plain `TransitionData` is an episode of one turn). `collate_fn` hands them over as they are; the
    learner packs them itself (`to_token_batch`), with no padded round trip through Oat's tensors."""

    def __init__(self, buffer: Sequence[Any], tokenizer=None, strategy=None, **_) -> None:
        self.turns = [(e, t) for e, item in enumerate(buffer) for t in turns_of(item)]

    def __len__(self) -> int:
        return len(self.turns)

    def __getitem__(self, i: int) -> tuple[int, TransitionData]:
        return self.turns[i]

    @staticmethod
    def collate_fn(turns: list) -> list:
        return list(turns)


def to_token_batch(turns: Sequence[tuple[int, TransitionData]], topk: int,
                   pad_id: int) -> tuple[TokenBatch, torch.Tensor, list[list[int]]]:
    """The learner's (episode, transition) list -> (the shared learner's `TokenBatch`, trained tokens [B, T]
    bool, the turns of each row), CPU tensors, packed by the shared `collate`: an episode's chat turns
    (`history=chat`, each prompt extending the last) are one row (`learner.batch.chains`), any other turn a
    row of its own. Turns whose `loss_mask` is False are False in the returned mask (the learner drops their
    tokens after any recompute). `advantages` is None unless every turn carries one (the learner then
    computes Oat's Monte-Carlo advantages from the rewards, one row per turn)."""
    with_adv = all(getattr(t, "advantage", None) is not None for _, t in turns)
    samples = [Sample(prompt_ids=list(t.prompt_ids), response_ids=list(t.response_ids),
                      behavior_logprobs=np.asarray(t.response_logprobs, dtype=np.float32),
                      advantage=float(t.advantage) if with_adv else 0.0,
                      topk_ids=getattr(t, "topk_ids", None), topk_logprobs=getattr(t, "topk_logprobs", None))
               for _, t in turns]
    rows = chains(samples, [e for e, _ in turns]) if with_adv else [[i] for i in range(len(samples))]
    batch = collate(samples, pad_id, topk, rows=rows)
    if not with_adv:
        batch.advantages = None  # filled by the learner (Oat's Monte-Carlo advantages)
    trained_turns = torch.tensor([bool(t.loss_mask) for _, t in turns] + [False], dtype=torch.bool)  # [N + 1]
    if batch.segment_ids is None:
        trained = trained_turns[:-1][:, None].expand_as(batch.response_mask)  # [B, T], a row per turn
    else:
        trained = trained_turns[batch.segment_ids]  # [B, T]; -1 (no turn) reads the appended False
    return batch, trained, rows
