"""Sequence-level strategies over the whole episode (issue 38, part 4).

TRM and sequence-level TIS/MIS decide per sequence. Their sources mean the model's whole response to a
task, which in a multi-turn episode is every turn's response: `sequence="trajectory"` (the default).
The learner then keeps an episode's turns in one micro-batch and tells the strategy which rows share
an episode. `sequence="turn"` keeps each turn its own sequence (what the project did before).
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from oat_dppo.learner import Learner, LearnerConfig, plan_steps
from oat_dppo.trust_region import TrustRegionInputs, make_trust_region, requirements
from test_learner import policy, sampled_turns  # noqa: F401  (the module's tiny-qwen3 fixture)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=12), step_rows=st.integers(1, 8),
       micro_rows=st.integers(1, 4), epochs=st.integers(1, 2), seed=st.integers(0, 99))
@example(sizes=[3, 1, 1, 5, 5, 5, 5, 5, 2, 5, 2], step_rows=3, micro_rows=1, epochs=2, seed=89)  # epochs of 9 and 7 steps
def test_grouped_plan_keeps_each_episode_in_one_micro_batch(sizes, step_rows, micro_rows, epochs, seed):
    groups = [g for g, n in enumerate(sizes) for _ in range(n)]
    rng = random.Random(seed)
    order = list(range(len(sizes)))

    def permutation(n):
        rng.shuffle(order)
        return list(order)

    plan = plan_steps(len(groups), epochs=epochs, step_rows=step_rows, micro_rows=micro_rows,
                      permutation=permutation, sort_keys=[rng.randint(1, 9) for _ in groups], groups=groups)
    seen = [r for step in plan for micro in step for r in micro]
    assert sorted(seen) == sorted(list(range(len(groups))) * epochs)  # every row once per epoch
    for step in plan:
        for micro in step:
            in_micro = {groups[r] for r in micro}
            assert all(sum(groups[r] == g for r in micro) == sizes[g] for g in in_micro)  # whole episodes
            assert len(micro) <= micro_rows or len(in_micro) == 1  # larger only for one big episode
    # Every step but an epoch's last holds at least step_rows rows. Epochs may pack into different step
    # counts (another shuffle, another packing): an epoch ends where the rows seen reach a multiple of all rows.
    rows_seen = 0
    for step in plan:
        rows_seen += sum(len(m) for m in step)
        if rows_seen % len(groups):
            assert sum(len(m) for m in step) >= step_rows
    assert rows_seen == len(groups) * epochs


def test_declared_by_the_sequence_strategies_only():
    assert requirements(make_trust_region("trm")).trajectory_sequences
    assert not requirements(make_trust_region("trm", sequence="turn")).trajectory_sequences
    assert requirements(make_trust_region("tis", level="sequence")).trajectory_sequences
    assert not requirements(make_trust_region("tis")).trajectory_sequences  # token level reduces nothing
    assert requirements(make_trust_region("mis", level="geometric")).trajectory_sequences
    assert requirements(make_trust_region("mis", veto=1e-4)).trajectory_sequences  # the veto spans the sequence
    for name in ("pg_is", "dppo_binary_tv", "ppo_clip", "cispo"):
        assert not requirements(make_trust_region(name)).trajectory_sequences
    with pytest.raises(ValueError, match="'trajectory'"):
        make_trust_region("trm", sequence="episode")


def test_trm_blocks_the_whole_episode_when_one_turn_leaves_the_region():
    """Two episodes of two one-token turns; turn 0 of episode 0 has KL(mu||pi) far above delta."""
    logp = torch.log(torch.tensor([[0.5], [0.5], [0.5], [0.5]]))  # [B=4 turns, T=1]
    mu = torch.log(torch.tensor([[0.95], [0.5], [0.5], [0.5]]))
    episode = torch.tensor([[0], [0], [1], [1]])  # [B, T]
    inputs = dict(logp=logp, behavior_logp=mu, advantages=torch.ones(4, 1), mask=torch.ones(4, 1, dtype=torch.bool))
    trajectory = make_trust_region("trm")(TrustRegionInputs(**inputs, sequence_ids=episode))
    turn = make_trust_region("trm", sequence="turn")(TrustRegionInputs(**inputs))
    assert trajectory.keep[:, 0].tolist() == [False, False, True, True]
    assert turn.keep[:, 0].tolist() == [False, True, True, True]


def _kept_after_update(policy, strategy, episode_ids, micro):  # noqa: F811
    turns = sampled_turns(policy, n=6)
    # mu far from pi on episode 0's first turn: mu = 0.999 where the random model's pi is ~1/vocab
    turns[0].behavior_logprobs = np.full_like(turns[0].behavior_logprobs, np.log(0.999))
    learner = Learner(copy.deepcopy(policy[0]), strategy, LearnerConfig(learning_rate=1e-3, mini_batch_size=6,
                                                                        micro_batch_size=micro), pad_id=0)
    tokens = [len(t.response_ids) for t in turns]
    out = learner.update(turns, random.Random(0), episode_ids)
    return out["kept_frac"], tokens


@pytest.mark.parametrize("micro", [1, 2, 6])
def test_through_the_learner_an_episode_is_masked_together_whatever_the_micro_batches(policy, micro):  # noqa: F811
    episodes = [0, 0, 0, 1, 1, 2]  # turns 0-2 are one episode
    kept, tokens = _kept_after_update(policy, make_trust_region("trm", delta=0.5), episodes, micro)
    assert kept == pytest.approx(sum(tokens[3:]) / sum(tokens))  # episode 0 (3 turns) blocked, the rest kept
    kept, _ = _kept_after_update(policy, make_trust_region("trm", delta=0.5, sequence="turn"), episodes, micro)
    assert kept == pytest.approx(sum(tokens[1:]) / sum(tokens))  # only the turn itself
    kept, _ = _kept_after_update(policy, make_trust_region("trm", delta=0.5), None, micro)
    assert kept == pytest.approx(sum(tokens[1:]) / sum(tokens))  # no episode ids: each turn alone
