"""Turns -> right-padded [B, T] tensors, aligned so that position t holds the token predicted from t-1."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from oat_dppo.agent.types import Turn


@dataclass
class TokenBatch:
    """B transitions, each prompt + response, right-padded to T tokens.

    input_ids:       [B, T] long
    attention_mask:  [B, T] bool
    response_mask:   [B, T] bool, True at response tokens that have a behavior log-prob (trained)
    behavior_logp:   [B, T] float32, log mu at response tokens, 0 elsewhere
    advantages:      [B, 1] float32
    topk_ids:        [B, T, S] long or None (S = K + 1), 0 on unused slots
    topk_behavior_logp: [B, T, S] float32 or None, -inf on unused slots
    topk_valid:      [B, T, S] bool or None
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    behavior_logp: Tensor
    advantages: Tensor
    topk_ids: Tensor | None = None
    topk_behavior_logp: Tensor | None = None
    topk_valid: Tensor | None = None
    old_logp: Tensor | None = None  # [B, T] float32, recomputed log pi_old (anchor="recompute")

    @property
    def num_tokens(self) -> int:
        return int(self.response_mask.sum())

    def to(self, device: torch.device | str) -> "TokenBatch":
        return TokenBatch(**{k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in vars(self).items()})


def collate(turns: Sequence[Turn], pad_id: int, topk: int = 0) -> TokenBatch:
    """Pad `turns` into a `TokenBatch`. Only tokens the engine sampled (and recorded mu for) are
    trained; prompt tokens, template-appended tokens and padding are not."""
    if not turns:
        raise ValueError("cannot collate an empty list of turns")
    lengths = [len(t.prompt_ids) + len(t.response_ids) for t in turns]
    B, T = len(turns), max(lengths)
    ids = np.full((B, T), pad_id, dtype=np.int64)
    attn = np.zeros((B, T), dtype=bool)
    resp = np.zeros((B, T), dtype=bool)
    blp = np.zeros((B, T), dtype=np.float32)
    with_old = all(t.old_logprobs is not None for t in turns)
    old = np.zeros((B, T), dtype=np.float32) if with_old else None
    S = topk + 1
    with_topk = topk > 0
    if with_topk:
        tk_ids = np.zeros((B, T, S), dtype=np.int64)
        tk_lp = np.full((B, T, S), -np.inf, dtype=np.float32)
        tk_valid = np.zeros((B, T, S), dtype=bool)
    for b, turn in enumerate(turns):
        p, r = len(turn.prompt_ids), len(turn.response_ids)
        if len(turn.behavior_logprobs) != r:
            raise ValueError(f"turn {b}: {r} response tokens but {len(turn.behavior_logprobs)} behavior log-probs")
        ids[b, :p] = turn.prompt_ids
        ids[b, p : p + r] = turn.response_ids
        attn[b, : p + r] = True
        resp[b, p : p + r] = True
        blp[b, p : p + r] = turn.behavior_logprobs
        if old is not None:
            old[b, p : p + r] = turn.old_logprobs
        if with_topk:
            if turn.topk_ids is None or turn.topk_ids.shape != (r, S):
                got = None if turn.topk_ids is None else turn.topk_ids.shape
                raise ValueError(f"turn {b}: top-K strategy needs [L, K+1] = ({r}, {S}) top-K arrays, got {got}")
            slot_ok = turn.topk_ids >= 0
            tk_ids[b, p : p + r] = np.where(slot_ok, turn.topk_ids, 0)
            tk_lp[b, p : p + r] = np.where(slot_ok, turn.topk_logprobs, -np.inf)
            tk_valid[b, p : p + r] = slot_ok
    adv = torch.tensor([[t.advantage] for t in turns], dtype=torch.float32)
    batch = TokenBatch(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(attn),
        response_mask=torch.from_numpy(resp),
        behavior_logp=torch.from_numpy(blp),
        advantages=adv,
        old_logp=None if old is None else torch.from_numpy(old),
    )
    if with_topk:
        batch.topk_ids = torch.from_numpy(tk_ids)
        batch.topk_behavior_logp = torch.from_numpy(tk_lp)
        batch.topk_valid = torch.from_numpy(tk_valid)
    return batch
