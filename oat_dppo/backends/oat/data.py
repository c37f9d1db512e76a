"""What travels from the actor to the learner, and how it becomes a `TokenBatch`.

Oat's `TransitionData` carries the sampled-token log-probs (`response_logprobs`); DPPO also needs the
turn's advantage (computed in the actor by the shared `assign_advantages`, so group baselines see
whole groups) and, for top-K strategies, mu's top-K. They travel as extra dataclass fields in compact
numpy arrays, *not* in `info`: Oat's collector averages every `info` key over the batch
(`FeedbackCollector.get_metrics`). Oat's `TransitionDataset` copies only its own fields, so
`DPPOTransitionDataset` adds ours (the pattern of Oat's `MultiTurnTransitionDataset`).

Imports Oat's types and dataset only (torch, no vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch
from oat.types import TransitionData
from oat.utils.data import TransitionDataset

from oat_dppo.agent.types import Turn
from oat_dppo.learner.batch import Sample, TokenBatch, collate


@dataclass
class DPPOTransitionData(TransitionData):
    """One turn. Plain `TransitionData` (no advantage, no top-K) is accepted by the learner too."""

    advantage: Optional[float] = None  # the turn's advantage, shared by its tokens
    topk_ids: Optional[np.ndarray] = None  # [L, K+1] int32, -1 on unused slots
    topk_logprobs: Optional[np.ndarray] = None  # [L, K+1] float32, -inf on unused slots


def transition_from_turn(turn: Turn, *, ignore_no_eos: bool = False, info: dict | None = None) -> DPPOTransitionData:
    """A played turn (advantage assigned) -> the transition an Oat actor sends."""
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
        info=dict(info or {}),
        advantage=float(turn.advantage),
        # int32 ids and float32 log-probs: [4096, 21] is 344 KiB per turn through Oat's plasma store.
        topk_ids=None if turn.topk_ids is None else np.asarray(turn.topk_ids, dtype=np.int32),
        topk_logprobs=None if turn.topk_logprobs is None else np.asarray(turn.topk_logprobs, dtype=np.float32),
    )


class DPPOTransitionDataset(TransitionDataset):
    """Oat's dataset plus each item's advantage and top-K arrays (None where absent)."""

    EXTRA = ("advantage", "topk_ids", "topk_logprobs")

    def __init__(self, buffer: Sequence[Any], tokenizer, strategy, **kw) -> None:
        super().__init__(buffer, tokenizer, strategy, **kw)
        for item, src in zip(self.transitions, buffer):
            for name in self.EXTRA:
                item[name] = getattr(src, name, None)

    def collate_fn(self, item_list):
        batch = super().collate_fn(item_list)
        batch["advantages"] = [t["advantage"] for t in item_list]
        batch["topk_ids"] = [t["topk_ids"] for t in item_list]
        batch["topk_logprobs"] = [t["topk_logprobs"] for t in item_list]
        return batch


def to_token_batch(trajectory: dict, topk: int, pad_id: int) -> tuple[TokenBatch, torch.Tensor]:
    """Oat's collated trajectory dict -> (the shared learner's `TokenBatch`, trained rows [B] bool),
    CPU tensors, packed by the shared `collate`.

    Oat right-pads `input_ids` [B, T] (prompt + response): row b's response is
    input_ids[b, p_b : p_b + L_b], its mu `action_logprobs[b]` ([L_b]). Rows whose `loss_masks` is
    False are False in the returned row mask (the learner drops their tokens from training after any
    recompute). `advantages` is None unless every item carries one (the learner then computes Oat's
    Monte-Carlo advantages from the rewards).
    """
    ids = trajectory["input_ids"].long()  # [B, T]
    attn = trajectory["attention_mask"].bool()  # [B, T]
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
    batch = collate(samples, pad_id, topk)
    if not with_adv:
        batch.advantages = None  # filled by the learner (Oat's Monte-Carlo advantages)
    trained_rows = torch.tensor([bool(m) for m in trajectory["loss_masks"]], dtype=torch.bool)  # [B]
    return batch, trained_rows
