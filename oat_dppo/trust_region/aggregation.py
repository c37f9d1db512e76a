"""Reducing per-token loss terms [B, T] to a scalar loss.

Aggregation decides each token's weight in the gradient, so it is part of the algorithm: token mean
(DAPO), sequence mean of token means (GRPO), sequence mean of token sums, and Dr. GRPO's sum over a
constant length (what Oat uses by default: `masked_sum / generate_max_length`).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

AggregationMode = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_sum_constant_length"]
AGGREGATION_MODES: tuple[str, ...] = AggregationMode.__args__  # type: ignore[attr-defined]


def aggregate(
    loss_terms: Tensor,
    mask: Tensor,
    mode: AggregationMode = "token_mean",
    *,
    constant_length: int | None = None,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
    segment_ids: Tensor | None = None,
) -> Tensor:
    """Scalar loss from `loss_terms` [B, T] over trained positions `mask` [B, T].

    token_mean:              sum_{b,t} l / N_tokens
    seq_mean_token_mean:     1/N_seq sum_b (sum_t l / n_b)
    seq_mean_token_sum:      1/N_seq sum_b sum_t l
    seq_sum_constant_length: 1/N_seq sum_b sum_t l / constant_length   (Dr. GRPO)

    `num_tokens` / `num_sequences` override the denominators, for gradient accumulation over
    mini-batches whose normalizer is the whole batch's (defaults: this batch's counts; sequences
    with no trained token are not counted). Masked-out tokens count in the denominators, as PPO's
    clipped tokens do; padding does not. `segment_ids` [B, T] (>= 0 on trained tokens): the sequences
    are segments of rows, not rows (several turns packed in one row, `learner.batch.collate`).
    """
    if loss_terms.shape != mask.shape:
        raise ValueError(f"loss_terms {tuple(loss_terms.shape)} and mask {tuple(mask.shape)} must have the same [B, T] shape")
    mask = mask if mask.dtype == torch.bool else mask != 0
    terms = torch.where(mask, loss_terms, torch.zeros((), dtype=loss_terms.dtype, device=loss_terms.device))
    if segment_ids is not None and bool(mask.any()):  # one sequence per segment: [B, T] -> [S, 1] sums
        segment_ids = torch.where(mask, segment_ids, -1)
        present, seg = torch.unique(segment_ids[mask], return_inverse=True)  # [S], [N]
        terms = torch.zeros(len(present), dtype=terms.dtype, device=terms.device).index_add(0, seg, terms[mask])
        mask = torch.ones_like(terms, dtype=torch.bool)
        tokens_per_seq = torch.zeros(len(present), dtype=torch.long, device=seg.device).index_add(
            0, seg, torch.ones_like(seg))  # [S]
        terms, mask = terms[:, None], mask[:, None]  # [S, 1]: each segment's sum
    else:
        tokens_per_seq = mask.sum(-1)  # [B]
    n_seq = num_sequences if num_sequences is not None else (tokens_per_seq > 0).sum().clamp(min=1)

    if mode == "token_mean":
        denom = num_tokens if num_tokens is not None else tokens_per_seq.sum().clamp(min=1)
        return terms.sum() / denom
    if mode == "seq_mean_token_mean":
        per_seq = terms.sum(-1) / tokens_per_seq.clamp(min=1)  # [B]
        return per_seq.sum() / n_seq
    if mode == "seq_mean_token_sum":
        return terms.sum() / n_seq
    if mode == "seq_sum_constant_length":
        if constant_length is None or constant_length <= 0:
            raise ValueError("seq_sum_constant_length needs constant_length > 0 (e.g. the max response length)")
        return terms.sum() / (n_seq * constant_length)
    raise ValueError(f"unknown aggregation mode {mode!r}; choose one of {', '.join(AGGREGATION_MODES)}")
