"""Feedback use: what an environment's replies say and whether the policy followed them.

The probes (`smoke:hidden_digit`'s own, GEM GuessTheNumber's in `oat_dppo_envs.games`), the
feedback-blind success bounds, the adapter's `follows_feedback` step info, the
`hint_direction_agreement` metric, and the agent loop carrying each reply into the next prompt with
each turn keeping its own reward and return.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from oat_dppo.agent import Episode, PromptFormat, Turn, assign_advantages, episode_metrics, play_episodes
from oat_dppo.agent.metrics import hint_direction_agreement
from oat_dppo.engine.hf import HFEngine
from oat_dppo.envs import make_env
from oat_dppo.models.tiny import tiny_model, tiny_tokenizer
from oat_dppo_envs.games import GUESS_THE_NUMBER
from oat_dppo_envs.smoke import first_char_digit, follows_hint


@pytest.mark.parametrize("observation, action, expected", [
    ("5: higher.", "7", True), ("5: higher.", "3", False), ("5: higher.", "5", False),
    ("5: lower.", "2", True), ("5: lower.", "9", False),
    ("5: lower.", "no idea", None),   # no guess
    ("Guess my digit (0-9).", "4", None), ("no digit.", "4", None), ("5: no.", "4", None),  # no direction
])
def test_hidden_digit_probe(observation, action, expected):
    assert follows_hint(observation, action) is expected


@pytest.mark.parametrize("observation, action, expected", [
    ("At turn 1, you guessed 5, and the target number is higher than 5.", "so \\boxed{8}", True),
    ("At turn 1, you guessed 5, and the target number is higher than 5.", "\\boxed{9} no, \\boxed{2}", False),  # GEM reads the last
    ("At turn 2, you guessed 10, and the target number is lower than 10.", "\\boxed{3}", True),
    ("At turn 2, you guessed 4, which has been already guessed before.", "\\boxed{3}", None),
    ("At turn 1, you guessed 5, and the target number is higher than 5.", "eight", None),
])
def test_guess_the_number_probe_reads_gems_own_replies(observation, action, expected):
    assert GUESS_THE_NUMBER.follows(observation, action) is expected


@pytest.mark.parametrize("env_id, options, bound", [
    ("game:GuessTheNumber-v0-easy", {}, 0.4),        # 4 distinct guesses of 1..10
    ("game:GuessTheNumber-v0-hard", {}, 7 / 50),
    ("game:GuessTheNumber-v0-easy", {"max_turns": 2}, 0.2),
    ("smoke:hidden_digit", {}, 0.4),
    ("smoke:hidden_digit", {"digits": 4, "reveal": True, "max_turns": 2}, 0.25),  # one scoring guess of 4
    ("smoke:digits", {}, math.nan),                   # no feedback to read
])
def test_feedback_blind_success(env_id, options, bound):
    env = make_env(env_id, seed=0, **options)
    assert env.feedback_blind_success == pytest.approx(bound, nan_ok=True)


def test_a_blind_policy_meets_the_bound_and_binary_search_beats_it():
    """Over 1000 targets: a fixed sequence of 4 distinct digits succeeds ~0.4; binary search on the
    replies succeeds always and follows every hint."""
    env = make_env("smoke:hidden_digit", seed=0)
    blind_hits, search_hits, follows = 0, 0, []
    for seed in range(1000):
        env.reset(seed=seed)
        for guess in "0123":
            _, reward, terminated, truncated, _ = env.step(guess)
            if terminated or truncated:
                blind_hits += reward == 1.0
                break
        env.reset(seed=seed)
        low, high = 0, 9
        while True:
            guess = (low + high) // 2
            obs, reward, terminated, truncated, info = env.step(str(guess))
            if "follows_feedback" in info:
                follows.append(info["follows_feedback"])
            if terminated or truncated:
                search_hits += reward == 1.0
                break
            low, high = (guess + 1, high) if obs.endswith("higher.\n") else (low, guess - 1)
    assert abs(blind_hits / 1000 - 0.4) < 0.05
    assert search_hits == 1000 and follows and all(follows)


def test_the_probe_reads_guesses_as_the_env_does():
    """With guess="any_char" a reply "A" is the guess (65 - 48) % 10 = 7: after "5: higher." it follows."""
    env = make_env("smoke:hidden_digit", seed=0, guess="any_char")
    env.reset(seed=1)
    assert env.unwrapped.follows_feedback("5: higher.", "A") is True
    assert make_env("smoke:hidden_digit", seed=0).unwrapped.follows_feedback("5: higher.", "A") is None


def test_any_char_guesses_name_every_digit_and_digits_name_themselves():
    assert [first_char_digit(str(d)) for d in range(10)] == list(range(10))
    assert {first_char_digit(chr(c)) for c in range(256)} == set(range(10))
    assert first_char_digit("7", digits=4) == 3 and first_char_digit("") is None


def turn(follows: bool | None) -> Turn:
    return Turn(prompt_ids=[0], response_ids=[1], behavior_logprobs=np.zeros(1, np.float32), reward=0.0, done=False,
                truncated=False, well_formed=True, finish_reason="stop", follows_feedback=follows)


def test_hint_direction_agreement_counts_only_turns_after_a_directed_reply():
    batch = [Episode(0, 0, [turn(None), turn(True), turn(False)]), Episode(1, 0, [turn(None), turn(True)]),
             Episode(2, 0, [turn(True)], error="boom")]
    assert hint_direction_agreement(batch[:2]) == pytest.approx(2 / 3)
    assert episode_metrics(batch)["hint_direction_agreement"] == pytest.approx(2 / 3)  # the failed episode is out
    assert "hint_direction_agreement" not in episode_metrics([Episode(0, 0, [turn(None), turn(None)])])


def test_the_loop_carries_each_reply_into_the_next_prompt_and_keeps_each_turns_reward():
    """Real tiny model, real env, 16 episodes of the 4-turn game: replaying every episode's responses
    on a fresh env gives, turn by turn, the prompt the policy saw and the reward its turn got; the
    returns are the discounted sums of that episode's own later rewards."""
    tok = tiny_tokenizer("qwen3")
    model = tiny_model(tok, seed=0)
    prompt = PromptFormat(tok, "none")
    envs = [make_env("smoke:hidden_digit", seed=i, guess="any_char") for i in range(16)]
    seeds = [100 + i // 2 for i in range(16)]
    with torch.no_grad():
        episodes, _ = play_episodes(HFEngine(model, tok), envs, seeds, prompt, max_new_tokens=1, generation_seed=3)
    assign_advantages(episodes, "group", gamma=0.5)
    replay = make_env("smoke:hidden_digit", seed=99, guess="any_char")
    for ep in episodes:
        obs, _ = replay.reset(seed=ep.seed)
        rewards = []
        for t in ep.turns:
            assert t.prompt_text == obs  # template "none": the prompt is the observation itself
            obs, reward, *_ = replay.step(t.response_text)
            assert t.reward == reward
            rewards.append(reward)
        later = [sum(r * 0.5 ** k for k, r in enumerate(rewards[i:])) for i in range(len(rewards))]
        assert [t.ret for t in ep.turns] == pytest.approx(later)
    assert any(len(e.turns) > 1 for e in episodes) and any(e.episode_return > 0 for e in episodes)
