"""Transitions -> right-padded [B, T] tensors, aligned so that position t holds the token predicted
from t - 1. The one packing of both backends: the local learner packs its `Turn`s, the Oat learner
the `Sample`s it reads back from Oat's collated batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import torch
from torch import Tensor


class Packable(Protocol):
    """What `collate` reads from a transition (`agent.Turn` and `Sample` have these fields)."""

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    behavior_logprobs: np.ndarray  # [L] log mu of each response token
    advantage: float
    topk_ids: np.ndarray | None  # [L, K+1], -1 on unused slots
    topk_logprobs: np.ndarray | None  # [L, K+1], -inf on unused slots


@dataclass
class Sample:
    """A trained transition that is not an agent `Turn` (e.g. one row of Oat's batch)."""

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    behavior_logprobs: np.ndarray
    advantage: float = 0.0
    topk_ids: np.ndarray | None = None
    topk_logprobs: np.ndarray | None = None


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
    old_logp:        [B, T] float32 or None, recomputed log pi_old at response tokens (learner.loop)
    sequence_ids:    [B] long or None, the episode of each row, for strategies whose sequence is the
                     whole episode (`Requirements.trajectory_sequences`); None: each row is one sequence
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    behavior_logp: Tensor
    advantages: Tensor
    topk_ids: Tensor | None = None
    topk_behavior_logp: Tensor | None = None
    topk_valid: Tensor | None = None
    old_logp: Tensor | None = None
    sequence_ids: Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.response_mask.sum())

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> "TokenBatch":
        return TokenBatch(**{k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in vars(self).items()})

    def rows(self, rows: Sequence[int] | Tensor) -> "TokenBatch":
        """Rows `rows` (in that order), columns trimmed to the longest attended one: a micro-batch
        with exactly the padding `collate` of those rows alone would give."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.attention_mask[rows].sum(-1).max())
        T = self.input_ids.shape[1]

        def cut(t: Tensor | None) -> Tensor | None:
            if t is None:
                return None
            return t[rows, :width] if t.dim() >= 2 and t.shape[1] == T else t[rows]

        return TokenBatch(**{k: cut(v) for k, v in vars(self).items()})


def collate(samples: Sequence[Packable], pad_id: int, topk: int = 0) -> TokenBatch:
    """Pad `samples` into a `TokenBatch`. Only tokens the engine sampled (and recorded mu for) are
    trained; prompt tokens, template-appended tokens and padding are not."""
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    B, T = len(samples), max(lengths)
    ids = np.full((B, T), pad_id, dtype=np.int64)
    attn = np.zeros((B, T), dtype=bool)
    resp = np.zeros((B, T), dtype=bool)
    blp = np.zeros((B, T), dtype=np.float32)
    S = topk + 1
    if topk:
        tk_ids = np.zeros((B, T, S), dtype=np.int64)
        tk_lp = np.full((B, T, S), -np.inf, dtype=np.float32)
        tk_valid = np.zeros((B, T, S), dtype=bool)
    for b, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        if len(s.behavior_logprobs) != r:
            raise ValueError(f"sample {b}: {r} response tokens but {len(s.behavior_logprobs)} behavior log-probs")
        ids[b, :p] = s.prompt_ids
        ids[b, p : p + r] = s.response_ids
        attn[b, : p + r] = True
        resp[b, p : p + r] = True
        blp[b, p : p + r] = s.behavior_logprobs
        if topk:
            if s.topk_ids is None or tuple(s.topk_ids.shape) != (r, S):
                got = None if s.topk_ids is None else tuple(s.topk_ids.shape)
                raise ValueError(f"sample {b}: a top-K strategy with K={topk} needs [L, K+1] = ({r}, {S}) top-K "
                                 f"arrays, got {got}")
            slot_ok = np.asarray(s.topk_ids) >= 0
            tk_ids[b, p : p + r] = np.where(slot_ok, s.topk_ids, 0)
            tk_lp[b, p : p + r] = np.where(slot_ok, s.topk_logprobs, -np.inf)
            tk_valid[b, p : p + r] = slot_ok
    batch = TokenBatch(
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(attn),
        response_mask=torch.from_numpy(resp),
        behavior_logp=torch.from_numpy(blp),
        advantages=torch.tensor([[float(s.advantage)] for s in samples], dtype=torch.float32),  # [B, 1]
    )
    if topk:
        batch.topk_ids = torch.from_numpy(tk_ids)
        batch.topk_behavior_logp = torch.from_numpy(tk_lp)
        batch.topk_valid = torch.from_numpy(tk_valid)
    return batch
