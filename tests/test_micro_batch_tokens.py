"""`--micro-batch-tokens`: micro-batches cut by a token budget (rows x the longest row) instead of a row count:
the plan keeps every row once and each micro-batch within the budget, and an update's result does not depend on
how its step is cut."""

from __future__ import annotations

import copy
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oat_dppo.config import ConfigError, TrainConfig, validate
from oat_dppo.learner import Learner, LearnerConfig, plan_steps
from oat_dppo.trust_region import make_trust_region
from test_learner import policy, sampled_turns  # noqa: F401  (the module's tiny-qwen3 fixture)


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=30), budget=st.integers(1, 400),
       step_rows=st.integers(1, 12), grouped=st.booleans(), seed=st.integers(0, 99))
def test_every_row_once_and_each_micro_batch_within_the_budget(lengths, budget, step_rows, grouped, seed):
    n = len(lengths)
    groups = [i // 3 for i in range(n)] if grouped else None
    plan = plan_steps(n, epochs=1, step_rows=step_rows, micro_rows=1, permutation=lambda k: random.Random(seed).sample(
        range(k), k), sort_keys=lengths, groups=groups, lengths=lengths, micro_tokens=budget)
    rows = [r for step in plan for micro in step for r in micro]
    assert sorted(rows) == list(range(n))
    for step in plan:
        for micro in step:
            units = {groups[r] for r in micro} if grouped else set(micro)
            if len(units) > 1:  # more than one row (or group) shares it: the budget held
                assert len(micro) * max(lengths[r] for r in micro) <= budget


def test_short_rows_share_one_forward_and_long_ones_do_not():
    lengths = [10] * 8 + [300, 280]
    plan = plan_steps(10, epochs=1, step_rows=10, micro_rows=2, permutation=lambda k: list(range(k)),
                      sort_keys=lengths, lengths=lengths, micro_tokens=400)
    assert plan == [[list(range(8)), [9], [8]]]  # 8 x 10 in one; 2 x 300 > 400: the long rows alone
    with pytest.raises(ValueError, match="lengths"):
        plan_steps(3, epochs=1, step_rows=3, micro_rows=1, permutation=lambda k: list(range(k)), micro_tokens=10)


def test_the_update_does_not_depend_on_the_cut(policy):
    """The loss normalizers cover the optimizer step: micro-batches of 1 row or one budgeted micro-batch give the
    same loss and gradient (float32 summation order aside)."""
    turns = sampled_turns(policy, n=6)
    results = []
    for micro in (dict(micro_batch_size=1), dict(micro_batch_size=1, micro_batch_tokens=10_000)):
        learner = Learner(copy.deepcopy(policy[0]), make_trust_region("ppo_clip", anchor="recompute"),
                          LearnerConfig(learning_rate=1e-3, mini_batch_size=6, **micro), pad_id=0)
        _, plan = learner.prepare(turns, random.Random(0))
        results.append((plan, learner.update(turns, random.Random(0))))
    (cut_plan, cut), (budget_plan, budget) = results
    assert [len(step) for step in cut_plan] == [6] and [len(step) for step in budget_plan] == [1]
    assert budget["loss"] == pytest.approx(cut["loss"], abs=1e-6)
    assert budget["grad_norm"] == pytest.approx(cut["grad_norm"], rel=1e-5)


def test_a_negative_budget_is_refused_and_the_budget_lifts_the_divisibility_rule():
    with pytest.raises(ConfigError, match="--micro-batch-tokens"):
        validate(TrainConfig(micro_batch_tokens=-1))
    with pytest.raises(ConfigError, match="multiple of --micro-batch-size"):
        validate(TrainConfig(mini_batch_size=6, micro_batch_size=4))
    validate(TrainConfig(mini_batch_size=6, micro_batch_size=4, micro_batch_tokens=4096))
