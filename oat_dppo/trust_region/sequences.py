"""Sequence-level reductions for strategies that decide per sequence (sequence IS, TRM, geometric masks).

A token's sequence is its row, unless `TrustRegionInputs.sequence_ids` says otherwise (a learner that
packs several sequences into one row). Both backends put one turn per row and pass no ids.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Reduce = Literal["sum", "mean", "max"]


def per_sequence(values: Tensor, valid: Tensor, sequence_ids: Tensor | None, reduce: Reduce) -> Tensor:
    """[B, T]: at each token, `reduce` of `values` over the valid tokens of its sequence (0 where the
    sequence has no valid token; every token of a sequence gets the same value).

    values: [B, T] float32 (0 where not valid); valid: [B, T] bool; sequence_ids: [B, T] int64 or None.
    """
    if reduce not in ("sum", "mean", "max"):
        raise ValueError(f"reduce must be 'sum', 'mean' or 'max', got {reduce!r}")
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    if sequence_ids is None:  # one sequence per row
        if reduce == "max":
            masked = torch.where(valid, values, torch.full((), -torch.inf, device=values.device))
            out = masked.amax(dim=1, keepdim=True)  # [B, 1]
            out = torch.where(torch.isfinite(out), out, zero)
        else:
            out = torch.where(valid, values, zero).sum(dim=1, keepdim=True)  # [B, 1]
            if reduce == "mean":
                out = out / valid.sum(dim=1, keepdim=True).clamp(min=1)
        return out.expand_as(values)
    # Packed rows: scatter over the sequence ids of the valid tokens, then gather back.
    ids = sequence_ids.reshape(-1)  # [B*T]
    flat_valid = valid.reshape(-1)
    n = int(ids.max()) + 1 if ids.numel() else 0
    idx = ids[flat_valid]
    vals = values.reshape(-1)[flat_valid]
    if reduce == "max":
        acc = torch.full((n,), -torch.inf, dtype=values.dtype, device=values.device)
        acc = acc.scatter_reduce(0, idx, vals, reduce="amax", include_self=True)
        acc = torch.where(torch.isfinite(acc), acc, zero)
    else:
        acc = torch.zeros(n, dtype=values.dtype, device=values.device).index_add(0, idx, vals)
        if reduce == "mean":
            counts = torch.zeros(n, dtype=values.dtype, device=values.device).index_add(0, idx, torch.ones_like(vals))
            acc = acc / counts.clamp(min=1)
    return acc[ids.clamp(min=0)].reshape(values.shape)
