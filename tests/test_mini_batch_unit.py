"""`--mini-batch-unit episodes`: an optimizer step takes whole episodes, so a multi-turn iteration gives the
same number of steps however long its episodes are (counting turns, a Sudoku iteration of 16 episodes
gave 3 steps when they ended after 3 turns and 15 when they played 15). `groups`: whole groups of episodes
(one start state each), so that a group's prompt is computed once in its micro-batch."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oat_dppo.agent.types import Turn
from oat_dppo.config import ConfigError, TrainConfig, validate
from oat_dppo.engine.hf import HFEngine
from oat_dppo.learner import Learner, LearnerConfig, plan_steps
from oat_dppo.learner.loop import plan_update
from oat_dppo.main import main
from oat_dppo.trust_region import make_trust_region
from test_learner import policy, sampled_turns  # noqa: F401  (the module's tiny-qwen3 fixture)


def _shuffler(seed: int, n: int):
    rng = random.Random(seed)
    order = list(range(n))

    def permutation(k):
        assert k == n
        rng.shuffle(order)
        return list(order)

    return permutation


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12), step_episodes=st.integers(1, 5),
       micro_rows=st.integers(1, 4), epochs=st.integers(1, 2), whole=st.booleans(), seed=st.integers(0, 99))
def test_a_step_takes_step_episodes_whole_episodes(sizes, step_episodes, micro_rows, epochs, whole, seed):
    groups = [g for g, n in enumerate(sizes) for _ in range(n)]
    lengths = [random.Random(seed + r).randint(1, 9) for r in range(len(groups))]
    plan = plan_steps(len(groups), epochs=epochs, step_rows=step_episodes, micro_rows=micro_rows,
                      permutation=_shuffler(seed, len(sizes)), sort_keys=lengths, groups=groups,
                      step_counts="groups", split_groups=not whole)
    # The step count depends on the episode count only, never on the episodes' lengths.
    assert len(plan) == epochs * math.ceil(len(sizes) / step_episodes)
    seen = [r for step in plan for micro in step for r in micro]
    assert sorted(seen) == sorted(list(range(len(groups))) * epochs)  # every turn once per epoch
    for i, step in enumerate(plan):
        in_step = [groups[r] for micro in step for r in micro]
        episodes = set(in_step)
        assert all(in_step.count(g) == sizes[g] for g in episodes)  # whole episodes in a step
        last_of_epoch = (i + 1) % math.ceil(len(sizes) / step_episodes) == 0
        assert len(episodes) == step_episodes or (last_of_epoch and len(episodes) < step_episodes)
        for micro in step:
            if whole:  # an episode in one micro-batch (sequence-level strategies)
                assert all(sum(groups[r] == g for r in micro) == sizes[g] for g in {groups[r] for r in micro})
            else:
                assert len(micro) <= micro_rows


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), step_rows=st.integers(1, 9), micro_rows=st.integers(1, 4), epochs=st.integers(1, 3),
       seed=st.integers(0, 99))
def test_one_turn_episodes_give_the_plan_of_turns(n, step_rows, micro_rows, epochs, seed):
    """Single-turn envs: counting episodes is counting turns, the same plan from the same shuffles."""
    lengths = [random.Random(seed * 7 + r).randint(1, 9) for r in range(n)]
    common = dict(epochs=epochs, step_rows=step_rows, micro_rows=micro_rows, sort_keys=lengths)
    by_turn = plan_steps(n, permutation=_shuffler(seed, n), **common)
    by_episode = plan_steps(n, permutation=_shuffler(seed, n), groups=list(range(n)), step_counts="groups",
                            split_groups=True, **common)
    assert by_episode == by_turn


@pytest.mark.parametrize("unit, steps", [("turns", 2 * 3), ("episodes", 2 * 2)])  # epochs x ceil(6 or 3 / 2)
def test_the_learner_steps_once_per_mini_batch_of_its_unit(policy, unit, steps):
    """Six real turns of three episodes (1, 2 and 3 turns), a mini-batch of 2 turns or 2 episodes, 2 epochs."""
    model, tok = policy
    learner = Learner(model, make_trust_region("dppo_binary_tv"), LearnerConfig(
        learning_rate=1e-4, mini_batch_size=2, micro_batch_size=1, num_ppo_epochs=2, mini_batch_unit=unit),
        pad_id=tok.pad_token_id)
    out = learner.update(sampled_turns(policy, n=6), random.Random(0), episode_ids=[0, 1, 1, 2, 2, 2])
    assert out["optimizer_steps"] == steps


def test_counting_episodes_needs_the_episodes(policy):
    model, tok = policy
    learner = Learner(model, make_trust_region("dppo_binary_tv"), LearnerConfig(mini_batch_unit="episodes"),
                      pad_id=tok.pad_token_id)
    with pytest.raises(ValueError, match="episode_ids"):
        learner.update(sampled_turns(policy, n=2), random.Random(0))


def test_the_micro_batch_need_not_divide_an_episode_count():
    validate(TrainConfig(mini_batch_unit="episodes", mini_batch_size=3, micro_batch_size=2))  # turns vs episodes
    with pytest.raises(ConfigError, match="multiple of --micro-batch-size"):
        validate(TrainConfig(mini_batch_unit="turns", mini_batch_size=3, micro_batch_size=2))


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12), step_groups=st.integers(1, 5),
       micro_rows=st.integers(1, 4), epochs=st.integers(1, 2), seed=st.integers(0, 99))
def test_a_step_takes_whole_groups(sizes, step_groups, micro_rows, epochs, seed):
    """`groups`: the turns of a group (its episodes, played from one start state) are never split across steps;
    every turn trains once an epoch; micro-batches keep their size."""
    group_ids = [100 + g for g, n in enumerate(sizes) for _ in range(n)]  # ids need not be 0..G-1 (they are seeds)
    lengths = [random.Random(seed + r).randint(1, 9) for r in range(len(group_ids))]
    plan, sequence_ids = plan_update(lengths, list(range(len(group_ids))), trajectory_sequences=False,
                                     mini_batch_unit="groups", epochs=epochs, step_rows=step_groups,
                                     micro_rows=micro_rows, permutation=_shuffler(seed, len(sizes)),
                                     group_ids=group_ids)
    assert sequence_ids is None
    assert len(plan) == epochs * math.ceil(len(sizes) / step_groups)
    assert sorted(r for step in plan for micro in step for r in micro) == sorted(list(range(len(group_ids))) * epochs)
    for step in plan:
        in_step = [group_ids[r] for micro in step for r in micro]
        assert all(in_step.count(g) == sizes[g - 100] for g in set(in_step))  # whole groups
        assert len(set(in_step)) <= step_groups
        assert all(len(micro) <= micro_rows for micro in step)


def test_groups_need_their_ids_and_leave_episodes_to_the_other_units():
    common = dict(trajectory_sequences=False, mini_batch_unit="groups", epochs=1, step_rows=1, micro_rows=2,
                  permutation=lambda n: list(range(n)))
    with pytest.raises(ValueError, match="group_ids"):
        plan_update([3, 4], [0, 1], **common)
    with pytest.raises(ValueError, match="episodes, whole"):  # an episode's turns packed into one row (chat)
        plan_update([3, 4, 5], [0, 0, 1], chain_of=[0, 0, 1], group_ids=[7, 7, 7], **common)
    with pytest.raises(ConfigError, match="multiple of --group-size 4"):
        validate(TrainConfig(mini_batch_unit="groups", group_size=4, mini_batch_size=6, micro_batch_size=2,
                             advantage="group_norm", episodes_per_iteration=8))


def _grouped_turns(policy, groups=4, size=4, new_tokens=6) -> tuple[list[Turn], list[int]]:
    """Real turns in groups: `size` samples of each of `groups` prompts (24+ tokens, so a group shares a prefix the
    prefix layout computes once), the groups interleaved as a rollout batch's turns need not be."""
    model, tok = policy
    engine = HFEngine(model, tok)
    turns, ids = [], []
    for g in range(groups):
        prompt = tok(f"question {g}: " + " ".join(["word"] * (24 + 3 * g)), add_special_tokens=False)["input_ids"]
        for k, gen in enumerate(engine.generate([prompt] * size, new_tokens, 0, seed=10 * g)):
            turns.append(Turn(prompt_ids=prompt, response_ids=gen.response_ids, behavior_logprobs=gen.logprobs,
                              reward=0.0, done=True, truncated=False, well_formed=True,
                              finish_reason=gen.finish_reason, advantage=(-1.0) ** (g + k)))
            ids.append(1000 + g)
    order = random.Random(1).sample(range(len(turns)), len(turns))
    return [turns[i] for i in order], [ids[i] for i in order]


def _update(policy, turns, group_ids, unit, mini_batch_size, state):
    model, tok = policy
    model.load_state_dict(state)
    learner = Learner(model, make_trust_region("dppo_binary_tv"), LearnerConfig(
        learning_rate=1e-3, mini_batch_size=mini_batch_size, micro_batch_size=4, mini_batch_unit=unit, group_size=4),
        pad_id=tok.pad_token_id)
    out = learner.update(turns, random.Random(0), episode_ids=list(range(len(turns))), group_ids=group_ids)
    return out, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_whole_groups_compute_each_prompt_once_and_train_the_same(policy):
    """Four groups of four samples. Steps of 8 turns: by groups, each micro-batch holds one group and its prompt
    runs once; by turns, the shuffled steps split groups and prompts run again. One step of all 16: the same
    gradient either way (only the micro-batches' order of summation differs)."""
    model, _ = policy
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    turns, group_ids = _grouped_turns(policy)
    try:
        by_turn, _ = _update(policy, turns, group_ids, "turns", 8, state)
        by_group, _ = _update(policy, turns, group_ids, "groups", 8, state)
        assert by_group["optimizer_steps"] == by_turn["optimizer_steps"] == 2
        assert by_group["decoder_tokens_per_token"] < 0.8 * by_turn["decoder_tokens_per_token"]
        _, after_turns = _update(policy, turns, group_ids, "turns", 16, state)
        _, after_groups = _update(policy, turns, group_ids, "groups", 16, state)
        moved = max(float((after_turns[k] - state[k]).abs().max()) for k in state)
        assert moved > 5e-4  # AdamW's first step moves a weight by ~lr (1e-3): the comparison below can fail
        for k in state:  # (a sum in another order: Adam's first step amplifies float rounding, ~1% of a step)
            torch.testing.assert_close(after_groups[k], after_turns[k], rtol=0, atol=1e-5)
    finally:
        model.load_state_dict(state)


TINY = ["--model", "tiny-qwen3", "--engine", "hf", "--max-new-tokens", "8", "--threads", "1", "--no-progress",
        "--log", "none"]


@pytest.mark.parametrize("unit, max_turns, steps", [("turns", 3, 6), ("episodes", 3, 2), ("episodes", 2, 2),
                                                    ("turns", 2, 4), ("groups", 3, 2)])
def test_sudoku_steps_per_iteration(tmp_path, unit, max_turns, steps):
    """Real GEM Sudoku; a pre-filled well-formed move keeps a random tiny model in the game to --max-turns:
    4 episodes of 2 or 3 turns, a mini-batch of 2 (turns, episodes, or groups of one episode each)."""
    run_dir = tmp_path / "run"
    code = main([*TINY, "--run-dir", str(run_dir), "--env", "game:Sudoku-v0-easy", "--response-prefix",
                 "\\boxed{1 1 1} ", "--max-turns", str(max_turns), "--iterations", "1", "--episodes-per-iteration",
                 "4", "--mini-batch-size", "2", "--micro-batch-size", "2", "--mini-batch-unit", unit,
                 "--eval-every", "0"])
    assert code == 0
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert row["rollout/turns_mean"] == max_turns
    assert row["train/optimizer_steps"] == steps


@pytest.mark.parametrize("extra, match", [
    (["--env-option", "history=chat", "--template", "chatml"], "history=chat"),
    (["--trust-region", "trm"], "decides per episode"),
])
def test_groups_that_cannot_stay_whole_are_refused_before_the_model_loads(tmp_path, capsys, extra, match):
    """Real GEM Sudoku (multi-turn): an episode that must train in one micro-batch (one chat row, a per-episode
    strategy) is refused at the start with the unit that serves, not after the first rollout."""
    code = main([*TINY, "--run-dir", str(tmp_path / "run"), "--env", "game:Sudoku-v0-easy", "--iterations", "1",
                 "--episodes-per-iteration", "4", "--group-size", "2", "--advantage", "group_norm",
                 "--mini-batch-size", "2", "--micro-batch-size", "2", "--mini-batch-unit", "groups", *extra])
    assert code != 0
    err = capsys.readouterr().err
    assert match in err and "use --mini-batch-unit episodes" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
