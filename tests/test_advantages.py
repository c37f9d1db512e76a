"""Per-turn returns and advantages (`oat_dppo.agent.advantages`): exact values for every mode, ties."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oat_dppo.agent import Episode, Turn, assign_advantages, discounted_returns, uncredited_turn_rate

EPS = 1e-6  # assign_advantages' default eps


def episode(seed: int, rewards: list[float], error: str | None = None) -> Episode:
    """An episode of one turn per reward (one response token each)."""
    turns = [
        Turn(prompt_ids=[0], response_ids=[1], behavior_logprobs=np.zeros(1, dtype=np.float32), reward=r,
             done=i == len(rewards) - 1, truncated=False, well_formed=True, finish_reason="stop")
        for i, r in enumerate(rewards)
    ]
    return Episode(env_index=0, seed=seed, turns=turns, error=error)


def advantages(episodes: list[Episode]) -> list[list[float]]:
    return [[t.advantage for t in e.turns] for e in episodes]


def test_discounted_returns():
    # G_t = r_t + gamma G_{t+1}: [0, 0, 1] at gamma 0.5 -> [0.25, 0.5, 1]
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([2.0, 1.0], 1.0) == [3.0, 1.0]
    assert discounted_returns([], 0.9) == []


def test_batch_norm_centres_and_scales_over_every_turn():
    """batch_norm: A = (G_t - mean G) / (std G + eps) over all turns of the batch. Turn returns
    [3 | 1 | 3, 1] (the last episode has two turns, gamma 1): mean 2, std 1 (np.std, ddof 0), so
    A = +-1 / (1 + eps). An episode with an env error is left out of the statistics and untouched."""
    batch = [episode(0, [3.0]), episode(1, [1.0]), episode(2, [2.0, 1.0]), episode(3, [100.0], error="boom")]
    assign_advantages(batch, "batch_norm", gamma=1.0)
    a = 1 / (1 + EPS)
    got = advantages(batch)
    assert got[:3] == [pytest.approx([a], rel=1e-12), pytest.approx([-a], rel=1e-12), pytest.approx([a, -a], rel=1e-12)]
    assert got[3] == [0.0]
    assert [t.ret for e in batch[:3] for t in e.turns] == [3.0, 1.0, 3.0, 1.0]
    assert sum(sum(x) for x in got[:3]) == pytest.approx(0.0, abs=1e-12)  # centred


def test_batch_norm_of_tied_returns_is_zero_not_nan():
    batch = [episode(0, [1.0]), episode(1, [1.0]), episode(2, [1.0])]
    assign_advantages(batch, "batch_norm")
    assert advantages(batch) == [[0.0], [0.0], [0.0]]


def grpo_batch() -> list[Episode]:
    """Seed 0: episode returns G_0 = [1, 0, 0, 0] (the first has two turns, rewards [0, 1], gamma 1, so
    both of its turns return 1): mean 0.25, std sqrt(3)/4 (ddof 0). Seed 1: three returns of 1, tied.
    Seed 2: a group of one episode."""
    return [episode(0, [0.0, 1.0]), episode(0, [0.0]), episode(1, [1.0]), episode(0, [0.0]), episode(0, [0.0]),
            episode(1, [1.0]), episode(2, [0.5]), episode(1, [1.0])]



def test_uncredited_turn_rate_counts_the_turns_a_group_baseline_leaves_at_zero():
    """grpo_batch's 9 trained turns: seed 1's tied group (3 turns) and seed 2's lone episode (1) get no advantage
    under group_norm (4 of 9); batch_norm compares every turn with the batch's mean return (5.5 / 9), which no
    turn returns (0 of 9). An episode with an env error and a turn without response tokens are not trained."""
    batch = grpo_batch() + [episode(3, [1.0], error="boom")]
    assign_advantages(batch, "group_norm")
    assert uncredited_turn_rate(batch) == pytest.approx(4 / 9)
    assign_advantages(batch, "batch_norm")
    assert uncredited_turn_rate(batch) == 0.0
    batch[2].turns[0].response_ids = []  # seed 1's first turn, now untrained
    assign_advantages(batch, "group_norm")
    assert uncredited_turn_rate(batch) == pytest.approx(3 / 8)
    assert math.isnan(uncredited_turn_rate([episode(0, [1.0], error="boom")]))

def test_group_subtracts_the_group_mean_without_scaling():
    """group: A = G_t - mean of the group's episode returns (the paper's eq. 23 runs); a tied group
    and a group of one get A = 0."""
    batch = grpo_batch()
    assign_advantages(batch, "group")
    assert advantages(batch) == [[0.75, 0.75], [-0.25], [0.0], [-0.25], [-0.25], [0.0], [0.0], [0.0]]


def test_group_norm_divides_by_the_group_std_plus_eps():
    """group_norm (GRPO): A = (G_t - mean) / (std + eps) per group. Seed 0: 0.75 / (sqrt(3)/4 + eps)
    ~ sqrt(3) and -0.25 / (sqrt(3)/4 + eps) ~ -1/sqrt(3). A tied group (std 0, as in a GRPO group
    where every sample failed) and a group of one are 0 / (0 + eps) = 0: finite, not 0/0 = NaN."""
    batch = grpo_batch()
    assign_advantages(batch, "group_norm")
    hi, lo = 0.75 / (math.sqrt(3) / 4 + EPS), -0.25 / (math.sqrt(3) / 4 + EPS)
    got = advantages(batch)
    assert [got[i] for i in (2, 5, 6, 7)] == [[0.0]] * 4  # seed 1 tied, seed 2 alone
    assert got[0] == pytest.approx([hi, hi], rel=1e-12)
    assert [got[i] for i in (1, 3, 4)] == [pytest.approx([lo], rel=1e-12)] * 3
    assert all(math.isfinite(x) for turns in got for x in turns), got


def test_group_norm_of_a_group_with_one_return_is_zero_on_every_turn():
    """Two episodes that both won at turn 3 under gamma 0.9: G_0 = 0.81 for both (std 0), and the last turn's
    G_2 = 1 would be (1 - 0.81) / (0 + eps) = 190,000 (what `benchmarks credit-signal` met with groups of 2);
    the group gives no signal: 0 on every turn. `group` keeps its bounded G_t - mean G_0."""
    batch = [episode(0, [0.0, 0.0, 1.0]), episode(0, [0.0, 0.0, 1.0])]
    assign_advantages(batch, "group_norm", gamma=0.9)
    assert advantages(batch) == [[0.0] * 3] * 2
    assign_advantages(batch, "group", gamma=0.9)
    assert advantages(batch)[0] == pytest.approx([0.0, 0.09, 0.19])


def test_group_episode_credits_every_turn_with_its_episode_return():
    """group_episode: A = G_0 - mean G_0 on every turn (the paper's R(y) - mean R with y a whole
    trajectory). Seed 0: [0, 1] at gamma 1 has G_0 = 1, so both of its turns get 0.75 as in `group`
    (its return-to-go is 1 at both turns); at gamma 0.5 G_0 = 0.5 and G_1 = 1: `group` gives the two
    turns 0.5 - 0.125 and 1 - 0.125, `group_episode` 0.375 on both."""
    batch = grpo_batch()
    assign_advantages(batch, "group_episode")
    assert advantages(batch) == [[0.75, 0.75], [-0.25], [0.0], [-0.25], [-0.25], [0.0], [0.0], [0.0]]
    batch = grpo_batch()
    assign_advantages(batch, "group_episode", gamma=0.5)
    assert advantages(batch)[:2] == [[0.375, 0.375], [-0.125]]
    assign_advantages(batch, "group", gamma=0.5)
    assert advantages(batch)[:2] == [[0.375, 0.875], [-0.125]]


def test_group_pushes_down_the_late_turns_of_the_best_episode_and_group_episode_does_not():
    """The bias behind Sudoku's format collapse (docs/results/before_splits.md): a good episode collects its reward
    early (correct placements) and then plays on without reward, so its return-to-go G_t falls to 0
    while `group`'s baseline is the group's mean G_0. The best episode's last 8 turns all get -baseline,
    and the group's advantages sum below zero over its turns though the episode returns are centred:
    most sampled moves, the best episode's included, are pushed down. `group_episode` gives every turn
    of the best episode the same positive advantage; the turn-weighted sum is positive (the long
    episodes are the good ones)."""
    def group() -> list[Episode]:
        return [episode(7, [0.1] * 4 + [0.0] * 8), episode(7, [0.1] * 2 + [0.0] * 6), episode(7, [-0.1]),
                episode(7, [0.1, -0.1])]

    batch = group()
    assign_advantages(batch, "group", gamma=0.9)
    best = advantages(batch)[0]
    baseline = sum(e.turns[0].ret for e in batch) / 4
    assert best[0] > 0 and best[4:] == [pytest.approx(-baseline, rel=1e-12)] * 8 and baseline > 0
    assert sum(sum(a) for a in advantages(batch)) < 0
    batch = group()
    assign_advantages(batch, "group_episode", gamma=0.9)
    best = advantages(batch)[0]
    assert best == [pytest.approx(best[0], rel=1e-12)] * 12 and best[0] > 0
    assert sum(sum(a) for a in advantages(batch)) > 0
    assert sum(e.turns[0].advantage for e in batch) == pytest.approx(0.0, abs=1e-12)  # centred per episode


def seen(seed: int, steps: list[tuple[str, float]]) -> Episode:
    """An episode of turns shown these states (the prompt the policy saw: one token id a state) with these rewards."""
    e = episode(seed, [r for _, r in steps])
    for t, (state, _) in zip(e.turns, steps):
        t.observation = state
        t.prompt_ids = [sum(map(ord, state)), len(state)]
    return e


def test_gigpo_compares_turns_that_saw_the_same_state_by_hand():
    """A group of three guessing games (gamma 1, reward 1 on the win). All start at the same state "s0";
    two then reach "low" (the same hint), one "high". By hand:
    G_0 = [1, 0, 1]: episode term (G_0 - 2/3) / std, std = sqrt(2)/3: [+1/sqrt(2), -sqrt(2), +1/sqrt(2)].
    Step group "s0" (every first turn): returns-to-go [1, 0, 1], the same numbers: the same term again.
    Step group "low" (turn 2 of episodes 0 and 1): returns-to-go [1, 0]: (+-0.5) / 0.5 = +-1.
    Step group "high" (episode 2's turn 2 alone): 0."""
    group = [seen(5, [("s0", 0.0), ("low", 1.0)]), seen(5, [("s0", 0.0), ("low", 0.0)]),
             seen(5, [("s0", 0.0), ("high", 1.0)])]
    assign_advantages(group, "gigpo", gamma=1.0)
    e = np.array([1.0, 0.0, 1.0])
    a_ep = (e - e.mean()) / (e.std() + EPS)
    expected = [[2 * a_ep[0], a_ep[0] + 0.5 / (0.5 + EPS)], [2 * a_ep[1], a_ep[1] - 0.5 / (0.5 + EPS)],
                [2 * a_ep[2], a_ep[2]]]
    assert np.allclose(advantages(group), expected, rtol=0, atol=1e-12)
    assert a_ep[0] == pytest.approx(1 / math.sqrt(2), rel=1e-5)


def test_gigpo_without_shared_states_is_its_episode_term_and_groups_do_not_mix():
    """No two turns of a group saw the same state: every turn gets the episode term and nothing else. The same
    state in another group (another seed) is another state."""
    group = [seen(1, [("a", 0.0), ("b", 1.0)]), seen(1, [("c", 0.0)]), seen(2, [("a", 1.0)]), seen(2, [("d", 0.0)])]
    assign_advantages(group, "gigpo", gamma=0.9)
    for members in (group[:2], group[2:]):
        totals = np.array([sum(t.reward for t in m.turns) for m in members])
        a_ep = (totals - totals.mean()) / (totals.std() + EPS)
        for m, a in zip(members, a_ep):
            assert [t.advantage for t in m.turns] == [pytest.approx(a, abs=1e-12)] * len(m.turns)


def test_gigpo_episode_term_is_the_undiscounted_total_by_hand():
    """gamma 0.9: two episodes of one group both win once, one at turn 2, one at turn 3. Their totals R are
    equal (1 and 1), so the episode term is 0 for both; the discounted G_0 (0.9 against 0.81) would have
    ranked the faster win above. States differ everywhere, so the step term is 0 too: every advantage is 0."""
    group = [seen(3, [("a", 0.0), ("b", 1.0)]), seen(3, [("c", 0.0), ("d", 0.0), ("e", 1.0)])]
    assign_advantages(group, "gigpo", gamma=0.9)
    assert advantages(group) == [[0.0, 0.0], [0.0, 0.0, 0.0]]
    assert [t.ret for t in group[1].turns] == pytest.approx([0.81, 0.9, 1.0])  # returns-to-go stay discounted


def test_gigpo_steps_group_by_the_whole_state_the_policy_sees():
    """Under history=chat the policy sees the whole conversation: two turns whose newest reply reads the same
    ("low") after different earlier turns were shown different prompts, and are not one step group. Turns
    shown one prompt are: returns-to-go [1, 0] (gamma 1) give the step term +-1 / (0.5 + eps) * 0.5."""
    same_reply_other_history = [seen(4, [("s0", 0.0), ("s0|3 low", 1.0)]), seen(4, [("s0", 0.0), ("s0|7 low", 0.0)])]
    for e in same_reply_other_history:
        e.turns[1].observation = "low"  # the newest observation alone: what the step key read before
    assign_advantages(same_reply_other_history, "gigpo", gamma=1.0)
    a_ep = 1 / (0.5 + EPS) * 0.5
    first = a_ep * 2  # the shared first state: step term equal to the episode term
    assert np.allclose(advantages(same_reply_other_history), [[first, a_ep], [-first, -a_ep]], atol=1e-9)
    same_state = [seen(4, [("s0", 0.0), ("s0|3 low", 1.0)]), seen(4, [("s0", 0.0), ("s0|3 low", 0.0)])]
    assign_advantages(same_state, "gigpo", gamma=1.0)
    assert np.allclose(advantages(same_state), [[first, 2 * a_ep], [-first, -2 * a_ep]], atol=1e-9)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="advantage mode must be one of"):
        assign_advantages([episode(0, [1.0])], "grpo")  # type: ignore[arg-type]


def test_the_command_line_offers_every_mode():
    """config.py names the modes for --advantage without importing the agent: the two lists agree."""
    from oat_dppo.agent import ADVANTAGE_MODES
    from oat_dppo.config import AdvantageMode

    assert AdvantageMode.__args__ == ADVANTAGE_MODES


def test_episode_balance_weighs_every_episode_the_same_by_hand():
    """A group of one win at the first turn and one loss after four: the group's advantages +-1 (group_norm)
    sum to 1 - 4 = -3 over the turns; balanced, each turn of an episode of n turns carries n_mean / n = 2.5 / n of
    its advantage, and the turns sum to 0."""
    def game():
        return [episode(0, [1.0]), episode(0, [0.0, 0.0, 0.0, 0.0])]

    plain, balanced = game(), game()
    assign_advantages(plain, "group_norm", gamma=1.0)
    assign_advantages(balanced, "group_norm", gamma=1.0, episode_balance=True)
    assert sum(advantages(plain), []) == pytest.approx([1.0] + [-1.0] * 4, abs=1e-5)
    assert sum(map(sum, advantages(plain))) == pytest.approx(-3.0, abs=1e-4)
    assert sum(advantages(balanced), []) == pytest.approx([2.5] + [-2.5 / 4] * 4, abs=1e-5)
    assert sum(map(sum, advantages(balanced))) == pytest.approx(0.0, abs=1e-4)


def test_episode_balance_counts_only_trained_turns_and_keeps_equal_lengths_as_they_are():
    even = [episode(0, [1.0, 0.0]), episode(0, [0.0, 0.0])]
    ref = [episode(0, [1.0, 0.0]), episode(0, [0.0, 0.0])]
    assign_advantages(even, "gigpo", gamma=0.9, episode_balance=True)
    assign_advantages(ref, "gigpo", gamma=0.9)
    assert sum(advantages(even), []) == pytest.approx(sum(advantages(ref), []))
    untrained = [episode(0, [1.0, 0.0]), episode(0, [0.0, 0.0])]
    untrained[0].turns[1].response_ids = []  # a turn the engine gave no token (not trained)
    assign_advantages(untrained, "group_norm", gamma=1.0, episode_balance=True)
    # n = 1 and 2, mean 1.5: the first episode's trained turn carries 1.5x its advantage, the second 0.75x
    assert advantages(untrained)[0][0] == pytest.approx(1.5 * 1.0, abs=1e-5)
    assert advantages(untrained)[1] == pytest.approx([0.75 * -1.0] * 2, abs=1e-5)


def test_shuffled_advantages_keep_their_values_and_lose_their_turns():
    """The control (`--shuffle-advantages`): the same values over the trained turns, in an order the generator
    draws (so winners no longer carry the positive ones); untrained turns keep theirs; one generator, one order."""
    def batch():
        return [episode(s, r) for s in range(4) for r in ([1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0])]

    plain, shuffled, again = batch(), batch(), batch()
    for b in (shuffled, again):
        b[0].turns[0].response_ids = []  # not trained: not shuffled
    assign_advantages(plain, "batch_norm", gamma=0.9)
    assign_advantages(shuffled, "batch_norm", gamma=0.9, shuffle_seed=0)
    assign_advantages(again, "batch_norm", gamma=0.9, shuffle_seed=0)
    flat = lambda eps: [a for e in eps for a in [t.advantage for t in e.turns]]  # noqa: E731
    assert shuffled[0].turns[0].advantage == plain[0].turns[0].advantage
    assert sorted(flat(shuffled)[1:]) == pytest.approx(sorted(flat(plain)[1:]))
    assert flat(shuffled)[1:] != pytest.approx(flat(plain)[1:])
    assert flat(again) == flat(shuffled)
