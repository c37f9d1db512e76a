"""The counterfactual feedback measure (`oat_dppo.agent.reply_effect`): a blind policy scores 0.

Scripted policies play `smoke:hidden_digit` (and the project's HigherLower): a blind ascending sweep,
a binary search that reads the replies, a constant answer. The old `hint_direction_agreement` gives
the sweep 1.0, as it gives the reader; the reply effect gives the sweep 0, the reader 1, the constant 0.
One tiny local run shows `eval/reply_effect` in its metrics.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from oat_dppo.agent.reply_effect import Case, reply_effect, scored
from oat_dppo.envs import make_env
from oat_dppo.main import main

_REPLY = re.compile(r"(\d+): (?:the number is )?(higher|lower)\.")


class Scripted:
    """A deterministic policy: `choose(prompt) -> move index`; `move_probs` is its one-hot [P, M]."""

    def __init__(self, choose):
        self.choose = choose

    def move_probs(self, prompts, moves):
        out = np.zeros((len(prompts), len(moves)))
        for i, prompt in enumerate(prompts):
            out[i, self.choose(prompt, moves)] = 1.0
        return out


def sweep(prompt, moves):
    """Blind: the n-th turn says the n-th move, whatever the replies said."""
    return min(len(_REPLY.findall(prompt)), len(moves) - 1)


def constant(prompt, moves):
    return len(moves) // 2


def binary_search(prompt, moves):
    """Reads every reply: the middle of the numbers they leave open (the newest reply's side alone
    when the replies contradict each other, as a changed reply can)."""
    numbers = [int(re.search(r"\d+", m).group()) for m in moves]
    replies = [(int(n), d) for n, d in _REPLY.findall(prompt)]

    def open_after(rs):
        return [x for x in numbers if all((x > n) if d == "higher" else (x < n) for n, d in rs)]

    candidates = open_after(replies) or open_after(replies[-1:]) or [replies[-1][0]]
    return numbers.index(candidates[(len(candidates) - 1) // 2])


def play(env_id: str, policy: Scripted, episodes: int = 60, **options):
    """(cases for the reply effect, the old hint-direction agreement) of `policy` over `episodes` episodes."""
    env = make_env(env_id, seed=0, **options)
    moves = env.unwrapped.reply_moves("")  # the same moves after every reply
    cases, agree = [], []
    for seed in range(episodes):
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            obs_before = obs
            obs, _, terminated, truncated, info = env.step(moves[policy.choose(obs_before, moves)])
            done = terminated or truncated
            if "follows_feedback" in info:
                agree.append(info["follows_feedback"])
            cf = info.get("counterfactual")
            if cf and not done:
                cases.append(Case(obs, cf["changed_observation"], tuple(cf["moves"]), tuple(cf["favoured"])))
    return cases, float(np.mean(agree))


@pytest.mark.parametrize("env_id", ["smoke:hidden_digit", "oat_dppo_envs.custom_example:HigherLower"])
def test_a_blind_sweep_scores_zero_a_reader_one_a_constant_zero(env_id):
    scores = {}
    for name, choose in (("sweep", sweep), ("binary_search", binary_search), ("constant", constant)):
        policy = Scripted(choose)
        cases, agreement = play(env_id, policy, history="concat")
        assert cases, name
        scores[name] = (reply_effect(policy, cases), agreement)
    assert scores["sweep"][0] == 0.0
    assert scores["binary_search"][0] == 1.0
    assert scores["constant"][0] == 0.0
    # the old rate cannot tell them apart: the sweep agrees with every hint's direction, as the reader does
    assert scores["sweep"][1] == 1.0 == scores["binary_search"][1]


def test_the_effect_is_the_shift_of_the_favoured_moves_probability():
    """p(F | real) - p(F | changed), renormalised over the moves: 0.7 - 0.2 = 0.5 for one turn; weights
    need not sum to 1; a policy that moves against the replies scores below 0."""
    case = Case("real", "changed", ("0", "1", "2"), (False, True, True))

    class Fixed:
        def __init__(self, real, changed):
            self.w = {"real": real, "changed": changed}

        def move_probs(self, prompts, moves):
            return np.array([self.w[p] for p in prompts], dtype=float)

    assert reply_effect(Fixed([3, 4, 3], [8, 1, 1]), [case]) == pytest.approx(0.5)
    assert reply_effect(Fixed([1, 0, 0], [0, 1, 0]), [case]) == pytest.approx(-1.0)
    assert np.isnan(reply_effect(Fixed([1, 0, 0], [1, 0, 0]), []))


def test_at_most_max_turns_cases_are_scored_the_first_in_episode_order():
    """--reply-effect-turns N: the effect of the first N cases, scored alone (the scorer sees only their prompts);
    0 scores every case; no case, no scorer and no keys."""
    cases = [Case(f"real {i}", f"changed {i}", ("0", "1"), (True, False)) for i in range(5)]
    seen: list[str] = []

    class Reader:  # favours move 0 after case i's real reply with probability (i + 1) / 10
        def move_probs(self, prompts, moves):
            seen.extend(prompts)
            return np.array([[p, 1 - p] for p in ((int(q.split()[1]) + 1) / 10 if q.startswith("real") else 0.0
                                                   for q in prompts)])

    out = scored(cases, Reader, max_turns=2)
    assert out == {"reply_effect": pytest.approx((0.1 + 0.2) / 2), "reply_effect_turns": 2.0}
    assert sorted(seen) == ["changed 0", "changed 1", "real 0", "real 1"]
    assert scored(cases, Reader, max_turns=0) == {"reply_effect": pytest.approx(0.3), "reply_effect_turns": 5.0}
    assert scored(cases, Reader, max_turns=9)["reply_effect_turns"] == 5.0
    assert scored([], lambda: pytest.fail("no case: no scorer"), max_turns=2) == {}


@pytest.mark.parametrize("max_turns", [0, 3])
def test_a_tiny_local_run_reports_the_reply_effect_at_evaluation(tmp_path, max_turns):
    run_dir = tmp_path / "run"
    assert main(["--env", "smoke:hidden_digit", "--model", "tiny-qwen3", "--engine", "hf", "--threads", "1",
                 "--template", "none", "--max-new-tokens", "2", "--iterations", "1", "--episodes-per-iteration", "8",
                 "--mini-batch-size", "8", "--micro-batch-size", "8", "--eval-every", "1", "--eval-episodes", "16",
                 "--reply-effect-turns", str(max_turns),
                 "--env-option", "guess=any_char", "--log", "none", "--no-progress", "--run-dir", str(run_dir)]) == 0
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["eval/reply_effect_turns"] > 3 if max_turns == 0 else row["eval/reply_effect_turns"] == 3
    assert -1.0 <= row["eval/reply_effect"] <= 1.0
    assert abs(row["eval/reply_effect"]) < 0.2  # an untrained random model barely reads anything
    assert "rollout/hint_direction_agreement" in row and "rollout/feedback_follow_rate" not in row


@pytest.mark.parametrize("history", ["concat", "concat_with_action", "last", "chat"])
def test_a_blind_policy_scores_zero_under_every_history_mode(history):
    """Through the agent loop, as evaluations score it: the changed prompt is built as the real one was. Under
    `chat` the real prompt is the whole conversation; a changed prompt of the changed reply alone (the measure
    before the fix) shows the sweep fewer replies than the real one, and the sweep's move differs: not 0."""
    from oat_dppo.agent.demonstrations import Demonstrator, ScriptedEngine
    from oat_dppo.agent.loop import PromptFormat, play_episodes
    from oat_dppo.agent.reply_effect import cases_from_episodes
    from oat_dppo.models import load_tokenizer

    prompt = PromptFormat(load_tokenizer("smollm2"), "chatml", None, "")
    envs = [make_env("smoke:hidden_digit", seed=i, history=history, max_turns=4) for i in range(24)]
    moves = envs[0].unwrapped.reply_moves("")
    end = prompt.stop_token_ids()[:1]
    for name, choose, expected in (("sweep", sweep, 0.0), ("constant", constant, 0.0)):
        player = ScriptedEngine(Demonstrator(lambda text, rng: moves[choose(text, moves)], "smoke", name), prompt,
                                end, seed=0)
        episodes, _ = play_episodes(player, envs, list(range(24)), prompt, max_new_tokens=8)
        cases = cases_from_episodes(episodes)
        assert cases, (history, name)
        assert reply_effect(Scripted(choose), cases) == expected, (history, name)
    # the measure can pass: a reader that sees every reply (concat, chat) moves with them
    if history in ("concat", "chat"):
        player = ScriptedEngine(Demonstrator(lambda text, rng: moves[binary_search(text, moves)], "smoke", "reader"),
                                prompt, end, seed=0)
        episodes, _ = play_episodes(player, envs, list(range(24)), prompt, max_new_tokens=8)
        assert reply_effect(Scripted(binary_search), cases_from_episodes(episodes)) > 0.9
    for env in envs:
        env.close()
