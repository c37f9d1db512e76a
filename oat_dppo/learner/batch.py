"""Transitions -> right-padded [B, T] tensors, aligned so that position t holds the token predicted
from t - 1. The one packing of both backends: the local learner packs its `Turn`s, the Oat learner
the `Sample`s it reads back from Oat's collated batch.

A row is a chain of turns: one turn, or (`chains`) consecutive turns of an episode whose prompts extend
each other, prompt_{k+1} = prompt_k + response_k + the tokens between (`history=chat`). Such an episode is
one sequence, computed in one forward, with each turn's response trained at its place in it; the turns
stay the units of the loss (`segment_ids`) and of the advantages (per token)."""

from __future__ import annotations

import math

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
    segment_ids:     [B, T] long or None, on rows of several turns: the turn of each trained token (its
                     index in the turns collated), -1 elsewhere; None: each row is one turn
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
    segment_ids: Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.response_mask.sum())

    def num_turns(self, rows: Sequence[int] | Tensor) -> int:
        """Turns held by `rows` (the loss's sequences)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        if self.segment_ids is None:
            return int(rows.numel())
        seg = self.segment_ids[rows]
        return int(torch.unique(seg[seg >= 0]).numel())

    def trained_turns(self, rows: Sequence[int] | Tensor) -> set[int]:
        """The turns (their index among the turns collated) of `rows` with at least one token in the loss."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        mask = self.response_mask[rows]  # [R, T]
        if self.segment_ids is None:
            return {int(r) for r, m in zip(rows, mask) if bool(m.any())}
        return {int(s) for s in torch.unique(self.segment_ids[rows][mask])}

    def advantage_stats(self) -> dict[str, float]:
        """`adv_mean`, `adv_min`, `adv_max` over the tokens in the loss (a packed row's padding and untrained turns
        are not data); NaN where there is none (a rank whose share trains nothing)."""
        adv = torch.broadcast_to(self.advantages.detach().float(), self.response_mask.shape)[self.response_mask]  # [N]
        return {f"adv_{k}": float(getattr(torch, k)(adv)) if adv.numel() else math.nan for k in ("mean", "min", "max")}

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


def chains(samples: Sequence[Packable], episode_ids: Sequence[int]) -> list[list[int]]:
    """Indices of `samples` grouped into rows: consecutive samples of one episode (in order) where each prompt
    starts with the previous prompt and response (`history=chat`); any other sample is a row of its own."""
    rows: list[list[int]] = []
    for i, s in enumerate(samples):
        if rows and episode_ids[rows[-1][-1]] == episode_ids[i]:
            prev = samples[rows[-1][-1]]
            head = list(prev.prompt_ids) + list(prev.response_ids)
            if len(s.prompt_ids) >= len(head) and list(s.prompt_ids[:len(head)]) == head:
                rows[-1].append(i)
                continue
        rows.append([i])
    return rows


def row_of(rows: Sequence[Sequence[int]]) -> list[int]:
    """The row of each sample, from the rows' lists of samples (`chains`)."""
    out = [0] * sum(len(r) for r in rows)
    for r, samples in enumerate(rows):
        for i in samples:
            out[i] = r
    return out


def collate(samples: Sequence[Packable], pad_id: int, topk: int = 0,
            rows: Sequence[Sequence[int]] | None = None) -> TokenBatch:
    """Pad `samples` into a `TokenBatch`, one row per sample or, with `rows` (see `chains`), one row per chain
    of samples: the last one's prompt and response, every sample's response trained where it stands. Only
    tokens the engine sampled (and recorded mu for) are trained; prompt tokens, template-appended tokens and
    padding are not."""
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    rows = [[i] for i in range(len(samples))] if rows is None else [list(r) for r in rows]
    packed = any(len(r) > 1 for r in rows)
    lengths = [len(samples[r[-1]].prompt_ids) + len(samples[r[-1]].response_ids) for r in rows]
    B, T = len(rows), max(lengths)
    ids = np.full((B, T), pad_id, dtype=np.int64)
    attn = np.zeros((B, T), dtype=bool)
    resp = np.zeros((B, T), dtype=bool)
    blp = np.zeros((B, T), dtype=np.float32)
    adv = np.zeros((B, T) if packed else (B, 1), dtype=np.float32)
    seg = np.full((B, T), -1, dtype=np.int64)
    S = topk + 1
    if topk:
        tk_ids = np.zeros((B, T, S), dtype=np.int64)
        tk_lp = np.full((B, T, S), -np.inf, dtype=np.float32)
        tk_valid = np.zeros((B, T, S), dtype=bool)
    for b, row in enumerate(rows):
        last = samples[row[-1]]
        ids[b, : lengths[b]] = list(last.prompt_ids) + list(last.response_ids)
        attn[b, : lengths[b]] = True
        for i in row:
            s = samples[i]
            p, r = len(s.prompt_ids), len(s.response_ids)
            if len(s.behavior_logprobs) != r:
                raise ValueError(f"sample {i}: {r} response tokens but {len(s.behavior_logprobs)} behavior log-probs")
            resp[b, p : p + r] = True
            blp[b, p : p + r] = s.behavior_logprobs
            seg[b, p : p + r] = i
            if packed:
                adv[b, p : p + r] = float(s.advantage)
            else:
                adv[b, 0] = float(s.advantage)
            if topk:
                if s.topk_ids is None or tuple(s.topk_ids.shape) != (r, S):
                    got = None if s.topk_ids is None else tuple(s.topk_ids.shape)
                    raise ValueError(f"sample {i}: a top-K strategy with K={topk} needs [L, K+1] = ({r}, {S}) top-K "
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
        advantages=torch.from_numpy(adv),  # [B, 1], or [B, T] on rows of several turns
        segment_ids=torch.from_numpy(seg) if packed else None,
    )
    if topk:
        batch.topk_ids = torch.from_numpy(tk_ids)
        batch.topk_behavior_logp = torch.from_numpy(tk_lp)
        batch.topk_valid = torch.from_numpy(tk_valid)
    return batch
