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
from oat_dppo.learner.batch import TokenBatch


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


def to_token_batch(trajectory: dict, topk: int = 0) -> tuple[TokenBatch, torch.Tensor]:
    """Oat's collated trajectory dict -> (the shared learner's `TokenBatch`, trained rows [B] bool),
    CPU tensors.

    Oat right-pads `input_ids` [B, T] (prompt + response). Response token t of row b sits at
    position prompt_len_b + t; that is where TokenBatch keeps mu (and the top-K) for it.
    `response_mask` marks every response position; rows whose `loss_masks` is False are False in
    the returned row mask (the learner drops their tokens from training after any recompute).
    `advantages` is [B, 1] when every item carries one, else None (the learner then computes Oat's
    Monte-Carlo advantages from the rewards).
    """
    ids = trajectory["input_ids"].long()  # [B, T]
    attn = trajectory["attention_mask"].bool()  # [B, T]
    B, T = ids.shape
    resp = torch.zeros(B, T, dtype=torch.bool)
    blp = torch.zeros(B, T, dtype=torch.float32)
    S = topk + 1
    if topk:
        tk_ids = torch.zeros(B, T, S, dtype=torch.long)
        tk_lp = torch.full((B, T, S), float("-inf"), dtype=torch.float32)
        tk_valid = torch.zeros(B, T, S, dtype=torch.bool)
    for b in range(B):
        p = int(trajectory["prompt_ids_lens"][b])
        lp = np.asarray(trajectory["action_logprobs"][b], dtype=np.float32)  # [L]
        L = lp.shape[0]
        if p + L != int(attn[b].sum()):
            raise ValueError(f"row {b}: {p} prompt + {L} response tokens, but {int(attn[b].sum())} attended positions")
        blp[b, p : p + L] = torch.from_numpy(lp)
        resp[b, p : p + L] = True
        if topk:
            t_ids, t_lp = trajectory["topk_ids"][b], trajectory["topk_logprobs"][b]
            if t_ids is None or tuple(t_ids.shape) != (L, S):
                got = None if t_ids is None else tuple(t_ids.shape)
                raise ValueError(f"row {b}: a top-K strategy with K={topk} needs [L, K+1] = ({L}, {S}) top-K "
                                 f"arrays from the actor, got {got}")
            ok = torch.from_numpy(np.asarray(t_ids) >= 0)  # [L, S]
            tk_ids[b, p : p + L] = torch.where(ok, torch.from_numpy(np.asarray(t_ids, dtype=np.int64)), 0)
            tk_lp[b, p : p + L] = torch.where(ok, torch.from_numpy(np.asarray(t_lp, dtype=np.float32)), float("-inf"))
            tk_valid[b, p : p + L] = ok
    advs = trajectory.get("advantages")
    adv = None
    if advs is not None and all(a is not None for a in advs):
        adv = torch.tensor([[float(a)] for a in advs], dtype=torch.float32)  # [B, 1]
    batch = TokenBatch(input_ids=ids, attention_mask=attn, response_mask=resp, behavior_logp=blp,
                       advantages=adv)  # advantages may be None until the learner fills them
    if topk:
        batch.topk_ids, batch.topk_behavior_logp, batch.topk_valid = tk_ids, tk_lp, tk_valid
    trained_rows = torch.tensor([bool(m) for m in trajectory["loss_masks"]], dtype=torch.bool)  # [B]
    return batch, trained_rows


def select_rows(batch: TokenBatch, rows: torch.Tensor) -> TokenBatch:
    """Rows `rows` of `batch`, columns trimmed to the longest attended row (a micro-batch)."""
    width = int(batch.attention_mask[rows].sum(-1).max())

    def cut(t):
        if t is None:
            return None
        return t[rows, :width] if t.dim() >= 2 and t.shape[1] == batch.input_ids.shape[1] else t[rows]

    return TokenBatch(**{k: cut(v) for k, v in vars(batch).items()})
