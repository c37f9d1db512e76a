"""What travels from the actor to the learner, and how it becomes a `TokenBatch`.

The unit is the episode (`DPPOEpisodeData`, single-turn ones included): Oat's collector splits an actor's
items evenly between its learners, so a fixed count of episodes travels however many turns they hold. The
learner's dataset unpacks each into its turns, keeping the episode of each row.

A turn (`DPPOTransitionData`) adds to Oat's `TransitionData` its advantage (computed in the actor, where
group baselines see whole groups) and mu's top-K, as dataclass fields in compact numpy arrays, not in
`info`, whose every key Oat's collector averages. `DPPOTransitionDataset` copies them, as Oat's
`MultiTurnTransitionDataset` copies its own. Imports Oat's types and dataset only (torch, no vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import torch
from oat.types import TransitionData
from oat.utils.data import TransitionDataset

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
    """Prompt and response tokens the learner computes for an item (an episode's turns, or one turn)."""
    return sum(len(t.prompt_ids) + len(t.response_ids) for t in turns_of(item))


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


class DPPOTransitionDataset(TransitionDataset):
    """Oat's dataset over the turns of the buffer's episodes (a plain `TransitionData` is an episode of
    one turn), plus each turn's advantage, top-K arrays (None where absent) and episode (its item's
    position in the buffer)."""

    EXTRA = ("advantage", "topk_ids", "topk_logprobs")

    def __init__(self, buffer: Sequence[Any], tokenizer, strategy, **kw) -> None:
        turns = [(e, t) for e, item in enumerate(buffer) for t in turns_of(item)]
        super().__init__([t for _, t in turns], tokenizer, strategy, **kw)
        for item, (episode, src) in zip(self.transitions, turns):
            for name in self.EXTRA:
                item[name] = getattr(src, name, None)
            item["episode_id"] = episode

    def collate_fn(self, item_list):
        batch = super().collate_fn(item_list)
        for name, key in (("advantage", "advantages"), ("topk_ids", "topk_ids"), ("topk_logprobs", "topk_logprobs"),
                          ("episode_id", "episode_ids")):
            batch[key] = [t[name] for t in item_list]
        return batch


def to_token_batch(trajectory: dict, topk: int, pad_id: int) -> tuple[TokenBatch, torch.Tensor, list[list[int]]]:
    """Oat's collated trajectory dict -> (the shared learner's `TokenBatch`, trained tokens [B, T] bool, the turns
    of each row), CPU tensors, packed by the shared `collate`: an episode's chat turns (`history=chat`, each
    prompt extending the last) are one row (`learner.batch.chains`), any other turn a row of its own.

    Oat right-pads `input_ids` [N, T] (prompt + response): turn n's response is input_ids[n, p_n : p_n + L_n],
    its mu `action_logprobs[n]` ([L_n]). Turns whose `loss_masks` is False are False in the returned mask (the
    learner drops their tokens from training after any recompute). `advantages` is None unless every item
    carries one (the learner then computes Oat's Monte-Carlo advantages from the rewards, one row per turn).
    """
    ids = trajectory["input_ids"].long()  # [N, T]
    attn = trajectory["attention_mask"].bool()  # [N, T]
    advs = trajectory.get("advantages")
    with_adv = advs is not None and all(a is not None for a in advs)
    samples = []
    for b in range(ids.shape[0]):
        p = int(trajectory["prompt_ids_lens"][b])
        lp = np.asarray(trajectory["action_logprobs"][b], dtype=np.float32)  # [L]
        L = lp.shape[0]
        if p + L != int(attn[b].sum()):
            raise ValueError(f"row {b}: {p} prompt + {L} response tokens, but {int(attn[b].sum())} attended positions")
        row = ids[b, : p + L].tolist()
        samples.append(Sample(
            prompt_ids=row[:p], response_ids=row[p:], behavior_logprobs=lp,
            advantage=float(advs[b]) if with_adv else 0.0,
            topk_ids=trajectory["topk_ids"][b] if topk else None,
            topk_logprobs=trajectory["topk_logprobs"][b] if topk else None,
        ))
    episode_ids = trajectory.get("episode_ids")
    rows = chains(samples, episode_ids) if with_adv and episode_ids is not None else [[i] for i in range(len(samples))]
    batch = collate(samples, pad_id, topk, rows=rows)
    if not with_adv:
        batch.advantages = None  # filled by the learner (Oat's Monte-Carlo advantages)
    trained_turns = torch.tensor([bool(m) for m in trajectory["loss_masks"]] + [False], dtype=torch.bool)  # [N + 1]
    if batch.segment_ids is None:
        trained = trained_turns[:-1][:, None].expand_as(batch.response_mask)  # [B, T], a row per turn
    else:
        trained = trained_turns[batch.segment_ids]  # [B, T]; -1 (no turn) reads the appended False
    return batch, trained, rows
