"""Episodes spread over learner ranks by tokens (`oat_dppo.learner.balance`): every episode placed once, each
rank keeping its count, the heaviest rank within one episode of the mean, and no episode moved for nothing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from oat_dppo.learner.balance import balance_by_tokens, loads

ranks = st.integers(1, 4).flatmap(lambda world: st.integers(1, 6).flatmap(
    lambda count: st.lists(st.lists(st.integers(0, 400), min_size=count, max_size=count),
                           min_size=world, max_size=world)))


@given(ranks)
def test_every_episode_is_placed_once_and_every_rank_keeps_its_count(tokens):
    dest = balance_by_tokens(tokens)
    assert [len(d) for d in dest] == [len(t) for t in tokens]
    placed = [q for d in dest for q in d]
    assert all(0 <= q < len(tokens) for q in placed)
    assert [placed.count(q) for q in range(len(tokens))] == [len(t) for t in tokens]
    assert sum(loads(tokens, dest)) == sum(map(sum, tokens))
    assert balance_by_tokens(tokens) == dest  # every rank computes the same answer


@given(ranks)
def test_the_heaviest_rank_is_within_one_episode_of_the_mean(tokens):
    dest = balance_by_tokens(tokens)
    load = loads(tokens, dest)
    longest = max(t for mine in tokens for t in mine)
    assert max(load) <= sum(load) / len(load) + longest


def test_the_case_it_is_for_and_equal_ranks_keep_their_episodes():
    short, long = [10, 10, 10, 10], [40, 40, 40, 40]  # one rank holds 4x the tokens of the other
    dest = balance_by_tokens([short, long])
    assert loads([short, long], dest) == [100, 100]
    same = [[5, 7, 9], [9, 7, 5]]
    assert balance_by_tokens(same) == [[0, 0, 0], [1, 1, 1]]  # already even: nothing travels


def test_plans_of_two_ranks_are_padded_to_the_same_steps_and_micro_batches():
    from oat_dppo.learner.loop import equalize_plan

    short = [[[0, 1]], [[2]]]  # 2 steps: 1 micro-batch each
    long = [[[0, 1], [2, 3], [4]], [[5, 6]], [[7]]]  # 3 steps: 3, 1 and 1 micro-batches
    plans = [short, long]

    def agree_max_for(rank):  # what the all-reduce MAX gives either rank, given both ranks' first calls
        calls = {0: 0}

        def agree(counts):
            other = plans[1 - rank]
            theirs = [len(other)] if calls[0] == 0 else [len(s) for s in other] + [0] * (len(counts) - len(other))
            calls[0] += 1
            return [max(a, b) for a, b in zip(counts, theirs)]
        return agree

    padded = [equalize_plan(plans[r], agree_max_for(r)) for r in (0, 1)]
    assert [len(s) for s in padded[0]] == [len(s) for s in padded[1]] == [3, 1, 1]
    assert padded[0] == [[[0, 1], [], []], [[2]], [[]]]  # empty micro-batches: passes that train nothing
    assert padded[1] == long
