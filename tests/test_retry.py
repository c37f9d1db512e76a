"""`--env-option attempts=N` (oat_dppo.envs.retry) on reasoning-gym's real ACRE and Arc1D: GEM's grader between
the attempts, the episode's end, and the reply effect, which a policy that ignores the grader's reply cannot pass."""

from __future__ import annotations

import numpy as np
import pytest

from oat_dppo.agent.demonstrations import DEMONSTRATORS, Demonstrator, ScriptedEngine
from oat_dppo.agent.loop import PromptFormat, play_episodes
from oat_dppo.agent.reply_effect import cases_from_episodes, reply_effect
from oat_dppo.envs import make_env
from oat_dppo.envs.retry import named_wrong, wrong_reply
from oat_dppo.models import load_tokenizer

LABELS = ("on", "off", "undetermined")


def truth(env) -> str:
    return env.unwrapped.data["answer"]  # GEM's reasoning-gym item: the label the grader pays


def boxed(label: str) -> str:
    return f"\\boxed{{{label}}}"


def test_a_wrong_answer_gets_the_graders_reply_and_the_same_question_again():
    env = make_env("rg:acre", seed=0, attempts=3, split="validation")
    question, _ = env.reset(seed=1)
    answer = truth(env)
    wrong = [label for label in LABELS if label != answer]
    obs, reward, terminated, truncated, _ = env.step(boxed(wrong[0]))
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert named_wrong(obs) == [wrong[0]] and "2 attempts left" in obs
    assert question.split("Question:")[-1].split("Please reason")[0].strip() in obs  # the question stays (concat)
    obs, reward, terminated, _, _ = env.step(boxed(answer))
    assert (reward, terminated) == (1.0, True)  # GEM's grader, at the second attempt
    env.close()


def test_the_episode_ends_at_the_last_attempt_or_at_a_reply_without_an_answer():
    env = make_env("rg:acre", seed=0, attempts=2)
    env.reset(seed=3)
    wrong = next(label for label in LABELS if label != truth(env))
    assert env.step(boxed(wrong))[2] is False
    _, reward, terminated, truncated, _ = env.step(boxed(wrong))
    assert reward == 0.0 and (terminated or truncated)
    env.reset(seed=3)
    _, reward, terminated, _, _ = env.step("no box at all")
    assert reward == 0.0 and terminated
    env.close()


def test_attempts_is_checked():
    with pytest.raises(ValueError, match="multi-turn already"):
        make_env("game:GuessTheNumber-v0-easy", seed=0, attempts=2)
    with pytest.raises(ValueError, match=">= 1"):
        make_env("rg:acre", seed=0, attempts=0)
    env = make_env("rg:acre", seed=0)  # 1 (the default): the environment as it is, one turn
    env.reset(seed=0)
    assert env.step("\\boxed{maybe}")[2] is True
    env.close()


def test_arc1d_retries_with_its_own_grader_and_declares_no_counterfactual():
    env = make_env("rg:arc_1d", seed=0, attempts=2)
    env.reset(seed=5)
    obs, reward, terminated, _, info = env.step(boxed("0 0 0"))
    assert reward < 1.0 and not terminated and named_wrong(obs) == ["0 0 0"]
    assert "counterfactual" not in info  # a grid is not one of a few labels
    obs, reward, terminated, _, _ = env.step(boxed(truth(env)))
    assert reward == 1.0 and terminated
    env.close()


class Reader:
    """Scores moves as a policy that reads the replies: never a label a reply named (one-hot on the first other)."""

    @staticmethod
    def choose(prompt: str) -> str:
        named = named_wrong(prompt)
        return next(label for label in LABELS if label not in named)

    def move_probs(self, prompts, moves):
        return np.array([[float(m == boxed(self.choose(p))) for m in moves] for p in prompts])


class Constant:
    def move_probs(self, prompts, moves):
        return np.array([[float(m == boxed("off")) for m in moves] for _ in prompts])


def play(demonstrator: Demonstrator, n: int = 24):
    prompt = PromptFormat(load_tokenizer("smollm2"), "chatml", None, "")
    envs = [make_env("rg:acre", seed=i, attempts=3, split="validation") for i in range(n)]
    player = ScriptedEngine(demonstrator, prompt, prompt.stop_token_ids()[:1], seed=0)
    episodes, _ = play_episodes(player, envs, list(range(n)), prompt, max_new_tokens=160)
    for env in envs:
        env.close()
    return episodes


def test_a_policy_that_ignores_the_reply_scores_zero_and_one_that_reads_it_does_not():
    """Through the agent loop, as evaluations score it. "on" answered first is wrong on the questions whose label
    is off or undetermined: those turns are the cases. The constant player's reply effect is 0; a reader that never
    answers a label the replies named moves with them (the changed reply names the next label)."""
    constant = play(Demonstrator(lambda text, rng: boxed("on"), "rg:acre", "constant_on"))
    cases = cases_from_episodes(constant)
    assert cases and all(len(c.moves) == 3 for c in cases)
    assert reply_effect(Constant(), cases) == 0.0
    assert reply_effect(Reader(), cases) > 0.3  # (X on -> changed off: 1; the reader's later turns score less)
    # the reader, playing: every episode with a wrong first answer is solved within three attempts
    reader = play(Demonstrator(lambda text, rng: boxed(Reader.choose(text)), "rg:acre", "reader"))
    assert all(sum(t.reward for t in e.turns) == 1.0 for e in reader)
    assert max(len(e.turns) for e in reader) > 1


def test_the_worked_demonstrator_answers_another_label_after_the_graders_reply():
    import random

    worked = DEMONSTRATORS["acre_worked"]
    env = make_env("rg:acre", seed=0, attempts=3, split="validation")
    question, _ = env.reset(seed=1)
    label = worked.act(question, random.Random(0)).rsplit("\\boxed{", 1)[1].rstrip("}")
    # the prompt of a second attempt had the grader refused the rules' own label (a 2% case; built, not drawn)
    refused = question.replace("Please reason", wrong_reply(label, 2) + "\nPlease reason", 1)
    again = worked.act(refused, random.Random(0))
    assert boxed(label) not in again and again.rsplit("\\boxed{", 1)[1].rstrip("}") in LABELS
    env.close()
    # played: the rules' label first, another after a refusal, so nearly every question is solved
    rewards = [sum(t.reward for t in e.turns) for e in play(worked)]
    assert np.mean(rewards) >= 0.95


EQUATIONS = dict(tasks="simple_equations", max_value=10, size=4000)
ANSWERS = "|".join(str(n) for n in range(1, 11))


def test_answer_labels_is_checked_and_makes_a_math_reply_declare_its_counterfactual():
    with pytest.raises(ValueError, match="attempts >= 2"):
        make_env("math:procedural", seed=0, answer_labels=ANSWERS, **EQUATIONS)
    with pytest.raises(ValueError, match="2 or more distinct"):
        make_env("math:procedural", seed=0, attempts=2, answer_labels="3|3", **EQUATIONS)
    env = make_env("math:procedural", seed=0, attempts=3, answer_labels=ANSWERS, split="train", **EQUATIONS)
    env.reset(seed=2)
    wrong = next(n for n in range(1, 11) if str(n) != str(env.unwrapped.inner.answer))
    obs, reward, terminated, _, _ = env.step(boxed(str(wrong)))
    assert (reward, terminated) == (0.0, False) and named_wrong(obs) == [str(wrong)]
    changed = env.unwrapped.changed_reply(obs)
    assert named_wrong(changed) == [str(wrong % 10 + 1)]  # the same reply naming the next label
    assert env.unwrapped.reply_moves(obs) == [boxed(str(n)) for n in range(1, 11)]
    env.close()


def test_the_equation_sweep_is_blind_to_the_question_and_never_repeats_a_refused_answer():
    """The retry task's blind bound: its answers depend on the replies alone (the same three for every question it
    misses), none repeated, so with 3 attempts it solves about the share of questions whose answer is one of its
    first three (~3/10: the answers 1..10 are near uniform)."""
    from oat_dppo.agent.demonstrations import EQUATION_ANSWERS_BY_COUNT

    assert sorted(EQUATION_ANSWERS_BY_COUNT) == list(range(1, 11))
    sweep = DEMONSTRATORS["equation_sweep"]
    prompt = PromptFormat(load_tokenizer("smollm2"), "chatml", None, "")
    n = 64
    # the training split: its pool is 16 times smaller to build than a held-out one (`oat_dppo.envs.splits`)
    envs = [make_env("math:procedural", seed=i, attempts=3, answer_labels=ANSWERS, split="train", **EQUATIONS)
            for i in range(n)]
    player = ScriptedEngine(sweep, prompt, prompt.stop_token_ids()[:1], seed=0)
    episodes, _ = play_episodes(player, envs, list(range(n)), prompt, max_new_tokens=16)
    truths = [str(env.unwrapped.inner.answer) for env in envs]
    for env in envs:
        env.close()
    first_three = [boxed(str(a)) for a in EQUATION_ANSWERS_BY_COUNT[:3]]
    for episode, answer in zip(episodes, truths):
        actions = [t.response_text.strip() for t in episode.turns]
        assert actions == first_three[: len(actions)]  # whatever the question: the replies alone move it
        assert sum(t.reward for t in episode.turns) == float(answer in {a.strip("\\boxed{}") for a in actions})
    solved = np.mean([sum(t.reward for t in e.turns) for e in episodes])
    assert 0.15 <= solved <= 0.5, solved
    # and its reply effect is not 0: it reads the replies (which answers are refused), not the question
    assert reply_effect(Reader10(), cases_from_episodes(episodes)) > 0


class Reader10:
    """The sweep's own move probabilities: one-hot on its next answer given the prompt's replies."""

    def move_probs(self, prompts, moves):
        import random

        act = DEMONSTRATORS["equation_sweep"].act
        return np.array([[float(m == act(p, random.Random(0))) for m in moves] for p in prompts])
