"""A decoder forward that computes the leading tokens rows share once: a group's prompt, a game's instructions.

Rows are clustered by the prefixes they share (`plan_prefixes`). Each cluster's prefix runs once, as one row of a
right-padded prefix batch, and its keys and values are selected for every row of the cluster; the rests of the
rows then run as one right-padded batch at their own positions, attending to their cluster's prefix (its padding
masked) and causally to themselves (`prefix_forward`). Exact: every real position sees the same keys at the same
positions as in the padded [R, T] forward.

Three users: the learner (`learner.logprobs`, with the graph: the backward sums each row's gradient into its
cluster's one prefix forward), the HF engine (`engine.hf`, which then decodes from the returned cache) and the
reply-effect scorer (`agent.reply_effect`, which scores the moves on it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

__all__ = ["MIN_SHARED", "PrefixForward", "PrefixPlan", "plan_prefixes", "prefix_forward"]

#: A cluster shares at least this many leading tokens (fewer would not pay for the extra forward).
MIN_SHARED = 16
#: A plan is kept when its two batches hold at most this share of the padded grid's positions (`plan_prefixes`).
#: On Oat's shuffled micro-batches of the peers job (8 rows, a pair of one prompt here and there) a plan computed
#: 1.14 positions a real token and took 1.21x the padded time: the prefix batch's extra call costs ~7%.
MAX_GRID_SHARE = 0.9


@dataclass(frozen=True)
class PrefixPlan:
    """Which rows share a prefix. `cluster[r]`: row r's cluster, -1 for a row computed whole; `lengths[c]`: the
    tokens every row of cluster c starts with and that are computed once (each >= the plan's minimum)."""

    cluster: tuple[int, ...]  # [R]
    lengths: tuple[int, ...]  # [C]

    @property
    def offsets(self) -> list[int]:
        """[R] tokens of each row computed in its cluster's prefix (0 outside a cluster)."""
        return [self.lengths[c] if c >= 0 else 0 for c in self.cluster]

    def grid(self, lengths: Sequence[int]) -> int:
        """Positions `prefix_forward` computes for rows of these real lengths, padding included: C x P + R x S (a row
        outside every cluster keeps the rests' batch S at its whole length)."""
        S = max((n - o for n, o in zip(lengths, self.offsets)), default=0)
        return len(self.lengths) * max(self.lengths, default=0) + len(lengths) * S

    @property
    def saved(self) -> int:
        """Token positions not computed against one forward per row: sum over clusters of (rows - 1) x length."""
        return sum(p * (self.cluster.count(c) - 1) for c, p in enumerate(self.lengths))


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def plan_prefixes(rows: Sequence[Sequence[int]], limits: Sequence[int], min_shared: int = MIN_SHARED,
                  max_grid_share: float = MAX_GRID_SHARE) -> PrefixPlan:
    """Cluster `rows` (token ids, real tokens only) so that the shared tokens computed once are the most; no
    cluster at all (the padded forward) unless the plan's `grid` is at most `max_grid_share` of the padded [R, T].

    A cluster's prefix is its rows' longest common prefix, capped by each member's `limits[r]` (the learner: the
    first position whose hidden state predicts a response token; the engine: a prompt's last token, whose logits
    start the sampling), and at least `min_shared` long. The rows, each cut at its limit, sorted lexicographically
    put the rows sharing a prefix next to each other; a dynamic program over contiguous runs of that order
    maximizes the tokens saved, sum (rows - 1) x prefix, over partitions into such runs (never less than the best
    single cluster; a short row sorted between two longer twins could pair with a row further on, which the runs
    miss: rare for prompts). O(R x cluster size) after the sort."""
    R = len(rows)
    if len(limits) != R:
        raise ValueError(f"{len(limits)} limits for {R} rows")
    offer = [list(row[: max(limit, 0)]) for row, limit in zip(rows, limits)]  # [R] what each row can share
    order = sorted(range(R), key=lambda r: offer[r])
    neighbour = [_common(offer[order[i]], offer[order[i + 1]]) for i in range(R - 1)]  # [R - 1]
    best, start, shared_of = [0] * (R + 1), list(range(R + 1)), [0] * (R + 1)
    for j in range(1, R + 1):  # best[j]: the most saved over the first j sorted rows; the last run starts at start[j]
        best[j], start[j], shared_of[j] = best[j - 1], j - 1, 0  # sorted row j - 1 alone
        shared = len(offer[order[j - 1]])
        for i in range(j - 2, -1, -1):  # the run of sorted rows i .. j - 1
            shared = min(shared, neighbour[i])
            if shared < min_shared:
                break
            if best[i] + (j - 1 - i) * shared > best[j]:
                best[j], start[j], shared_of[j] = best[i] + (j - 1 - i) * shared, i, shared
    cluster, lengths, j = [-1] * R, [], R
    while j > 0:
        i = start[j]
        if shared_of[j]:
            for k in range(i, j):
                cluster[order[k]] = len(lengths)
            lengths.append(shared_of[j])
        j = i
    plan = PrefixPlan(cluster=tuple(cluster), lengths=tuple(lengths))
    sizes = [len(row) for row in rows]
    if plan.grid(sizes) > max_grid_share * R * max(sizes, default=0):
        return PrefixPlan(cluster=(-1,) * R, lengths=())
    return plan


@dataclass
class PrefixForward:
    """`prefix_forward`'s result. Row r's hidden state at position t is `hidden[r, t - offsets[r]]` (t >= offsets[r])."""

    hidden: Tensor  # [R, S, H] last hidden states of the rests
    offsets: Tensor  # [R] long, each row's tokens computed in its cluster's prefix
    cache: object  # transformers DynamicCache: keys and values of [R, P + S] slots (prefixes padded to P)
    mask: Tensor  # [R, P + S] long, the slots each row attends to (extend it by a column per decoded token)
    computed: int  # token positions the decoder computed, padding included: C x P + R x S


def prefix_forward(decoder, ids: Tensor, attn: Tensor, plan: PrefixPlan) -> PrefixForward:
    """Run `decoder` (a transformers base model) over right-padded rows `ids` [R, T] (real where `attn`) with each
    cluster's prefix computed once (see the module docstring). With a plan of no clusters this is the padded
    forward, through the cache."""
    from transformers import DynamicCache

    R, T = ids.shape
    device = ids.device
    lengths = attn.sum(-1).long()  # [R]
    offsets = torch.tensor(plan.offsets, dtype=torch.long, device=device)  # [R]
    cache = DynamicCache()
    P = max(plan.lengths, default=0)
    prefix_mask = torch.zeros(R, P, dtype=torch.long, device=device)  # [R, P]
    if P:
        first = [plan.cluster.index(c) for c in range(len(plan.lengths))]  # a row of each cluster
        cluster_len = torch.tensor(plan.lengths, device=device)  # [C]
        own = (torch.arange(P, device=device)[None, :] < cluster_len[:, None]).long()  # [C, P]
        # (a shorter cluster's row continues past its prefix: those slots are masked, and causal keeps them unseen)
        decoder(input_ids=ids[first, :P], attention_mask=own, past_key_values=cache, use_cache=True)
        member = torch.tensor([max(c, 0) for c in plan.cluster], device=device)  # [R]
        cache.batch_select_indices(member)
        prefix_mask = own[member] * torch.tensor([c >= 0 for c in plan.cluster], device=device)[:, None].long()
    S = int((lengths - offsets).max())
    positions = offsets[:, None] + torch.arange(S, device=device)[None, :]  # [R, S] each rest's positions
    rest_mask = (positions < lengths[:, None]).long()  # [R, S]
    rest_ids = ids.gather(1, positions.clamp(max=T - 1))  # [R, S] (masked past each row's end)
    mask = torch.cat([prefix_mask, rest_mask], dim=1)  # [R, P + S]
    hidden = decoder(input_ids=rest_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                     use_cache=True).last_hidden_state  # [R, S, H]
    return PrefixForward(hidden=hidden, offsets=offsets, cache=cache, mask=mask, computed=len(plan.lengths) * P + R * S)
