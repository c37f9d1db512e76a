"""Episodes spread over data-parallel learner ranks by tokens, each rank keeping its count of episodes.

Episodes differ in length: on a multi-turn game one rank's share of a round can hold four times the
turns of another's, and every rank waits for the slowest at each optimizer step. verl balances
sequence lengths across its data-parallel ranks before an update (`get_seqlen_balanced_partitions`);
this is the same idea for whole episodes: the longest-processing-time rule with equal counts.

    sort every rank's episodes by tokens, longest first (ties: rank, then position)
    give each to the least loaded rank that still has room (room: the count it started with)

A rank keeps its episode count (a step that counts episodes, `--mini-batch-unit episodes`, then
gives every rank the same number of steps), and no rank ends above the best load by more than the
longest episode (the rule's bound). `exchange_by_tokens` moves the episodes between the ranks of a
torch.distributed group (the Oat learners').
"""

from __future__ import annotations

from typing import Any, Callable, Sequence


def balance_by_tokens(tokens: Sequence[Sequence[int]]) -> list[list[int]]:
    """`tokens[r][i]`: the tokens of rank r's episode i. Returns `dest[r][i]`: the rank that trains it.

    Every rank ends with as many episodes as it holds, and the same input gives the same answer on
    every rank (a deterministic order), so each rank can compute the whole assignment itself."""
    world = len(tokens)
    room = [len(mine) for mine in tokens]
    load = [0] * world
    dest = [[-1] * len(mine) for mine in tokens]
    order = sorted(((t, r, i) for r, mine in enumerate(tokens) for i, t in enumerate(mine)),
                   key=lambda item: (-item[0], item[1], item[2]))
    for t, r, i in order:
        # least loaded rank with room; a tie keeps the episode where it is, then the lowest rank
        to = min((q for q in range(world) if room[q]), key=lambda q: (load[q], q != r, q))
        dest[r][i] = to
        room[to] -= 1
        load[to] += t
    return dest


def loads(tokens: Sequence[Sequence[int]], dest: Sequence[Sequence[int]]) -> list[int]:
    """Tokens each rank trains under `dest`."""
    out = [0] * len(tokens)
    for mine, where in zip(tokens, dest):
        for t, q in zip(mine, where):
            out[q] += t
    return out


def exchange_by_tokens(mine: list, tokens_of: Callable[[Any], int]) -> list:
    """This rank's items after every rank's items are spread over the ranks of the default torch.distributed
    group by `balance_by_tokens`: each rank computes the same assignment from everyone's token counts, and the
    items that change rank travel in one all-gather. One rank (or none initialized): `mine` as it is."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    world, rank = dist.get_world_size(), dist.get_rank()
    tokens: list = [None] * world
    dist.all_gather_object(tokens, [tokens_of(item) for item in mine])
    dest = balance_by_tokens(tokens)
    moving: list = [None] * world
    dist.all_gather_object(moving, [(to, item) for to, item in zip(dest[rank], mine) if to != rank])
    kept = [item for to, item in zip(dest[rank], mine) if to == rank]
    return kept + [item for r in range(world) if r != rank for to, item in moving[r] if to == rank]


__all__ = ["balance_by_tokens", "exchange_by_tokens", "loads"]
