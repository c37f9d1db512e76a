"""Demonstrators for the reasoning-gym mission envs (oat_dppo.agent.demonstrations), graded by the env itself:
each reply is stepped through the real env on real test-split questions."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from oat_dppo.agent.demonstrations import DEMONSTRATORS
from oat_dppo.envs import make_env


def graded(env_id: str, name: str, episodes: int, **options) -> list[tuple[str, str, float]]:
    """(question, reply, reward) of `name` on the first `episodes` test questions (`options`: the env's)."""
    env = make_env(env_id, seed=0, split="test", **options)
    act, rng, out = DEMONSTRATORS[name].act, random.Random(0), []
    try:
        for seed in range(episodes):
            question, _ = env.reset(seed=seed)
            reply = act(question, rng)
            _, reward, *_ = env.step(reply)
            out.append((question, reply, float(reward)))
    finally:
        env.close()
    return out


def test_acre_worked_names_each_test_object_then_the_label_the_grader_accepts():
    played = graded("rg:acre", "acre_worked", 60)
    assert sum(r for _, _, r in played) / len(played) > 0.9  # the rules fit reasoning-gym's labels
    for question, reply, _ in played:
        test = question.split("New test case:", 1)[1].strip().splitlines()[0]
        for obj in (o.strip() for o in test.split(",")):
            assert reply.count(f"{obj}: ") >= 1, (obj, reply)  # the work: every test object, its evidence
        label = re.search(r"So (on|off|undetermined)\. \\boxed\{(\w+)\}$", reply)
        assert label and label.group(1) == label.group(2)


def test_acre_cited_quotes_the_deciding_trial_line_before_each_verdict_and_the_work_reads_right():
    from benchmarks.acre_work import check, check_quotes

    played = graded("rg:acre", "acre_cited", 60)
    assert sum(r for _, _, r in played) / len(played) > 0.9
    for question, reply, _ in played:
        per_object, held = check(question, reply)  # the same verdicts and label as acre_worked's format
        assert held == {"form": True, "follows": True, "right": held["right"]} and all(ok for _, ok in per_object)
        # one quote before each test object's verdict: a trial line that holds it, whose outcome gives the verdict
        n = len(per_object)
        assert steps(check_quotes(question, reply)) == Counter(quotes=n, copied=n, agrees=n), reply


def test_the_acre_prior_reads_nothing():
    played = graded("rg:acre", "acre_prior", 60)
    assert {reply for _, reply, _ in played} == {"\\boxed{off}"}
    assert 0.2 < sum(r for _, _, r in played) / len(played) < 0.6


def test_linear_equation_steps_by_hand():
    from oat_dppo_envs.math import linear_equation_steps

    assert linear_equation_steps("Determine the value of c that satisfies: 25*c + 19 = 144") == (
        "25*c = 144 - 19 = 125. c = 125 / 25 = 5.", "5")
    assert linear_equation_steps("Find the value of k in the equation: 11 - 45*k = -934") == (
        "-45*k = -934 - 11 = -945. k = -945 / -45 = 21.", "21")
    assert linear_equation_steps("Solve for x: x + 5 = 3") == ("x = 3 - 5 = -2.", "-2")
    assert linear_equation_steps("What is 2 + 2?") is None


@pytest.mark.parametrize("max_value", [100, 10])
def test_equation_worked_solves_what_the_grader_grades_and_the_blind_bounds_do_not(max_value):
    env_id = "math:procedural"
    options = {"tasks": "simple_equations", "max_value": max_value}
    # a copied question never passes; at values to 10 (answers 1..10) a constant answer passes about one in ten
    prior = (0.0, 0.1) if max_value == 100 else (0.025, 0.25)
    for name, (low, high) in (("equation_worked", (0.95, 1.0)), ("copy_question", (0.0, 0.0)),
                              ("equation_prior", prior)):
        played = graded(env_id, name, 40, **options)
        if name == "equation_worked":  # steps, then the answer
            assert all(re.fullmatch(r".+ = .+\. \\boxed\{-?[\d/]+\}", reply) for _, reply, _ in played), played
        rewards = [r for _, _, r in played]
        assert low <= sum(rewards) / len(rewards) <= high, (name, rewards)


def test_column_addition_steps_by_hand():
    from oat_dppo_envs.math import column_addition_steps

    assert column_addition_steps("Calculate 4179 + 1931.") == (
        "9 + 1 = 10: 0. 7 + 3 + 1 = 11: 10. 1 + 9 + 1 = 11: 110. 4 + 1 + 1 = 6: 6110.", "6110")
    # a shorter number adds 0 in its missing columns; the last column writes its whole sum
    assert column_addition_steps("Calculate 8684 + 475.") == (
        "4 + 5 = 9: 9. 8 + 7 = 15: 59. 6 + 4 + 1 = 11: 159. 8 + 0 + 1 = 9: 9159.", "9159")
    assert column_addition_steps("Calculate 95 + 7.") == ("5 + 7 = 12: 2. 9 + 0 + 1 = 10: 102.", "102")
    for no_sum in ("Calculate 4 - 5.", "Calculate 1.5 + 2.", "Calculate 1 + 2 + 3.", "What is 2?"):
        assert column_addition_steps(no_sum) is None, no_sum
    # named places: each number by its places first (the shorter one padded with 0), each column named
    assert column_addition_steps("Calculate 8684 + 475.", named_places=True) == (
        "8684 is 8 thousands, 6 hundreds, 8 tens, 4 ones. 475 is 0 thousands, 4 hundreds, 7 tens, 5 ones. "
        "ones: 4 + 5 = 9: 9. tens: 8 + 7 = 15: 59. hundreds: 6 + 4 + 1 = 11: 159. thousands: 8 + 0 + 1 = 9: 9159.",
        "9159")
    assert column_addition_steps("Calculate 95 + 7.", named_places=True)[0].startswith("95 is 9 tens, 5 ones. 7 is 0 tens")
    assert column_addition_steps("Calculate 12345678 + 1.", named_places=True)[0].startswith("12345678 is 1 10^7, 2 millions")


def test_addition_worked_solves_what_the_grader_grades_and_a_copied_question_does_not():
    options = {"tasks": "basic_arithmetic", "min_digits": 4, "max_digits": 4, "min_terms": 2, "max_terms": 2,
               "operators": "+", "allow_parentheses": False, "allow_negation": False, "answer": "number"}
    column = r"\d \+ \d( \+ 1)? = \d+: \d+\. "
    places = r"\d+ is \d [a-z]+(, \d [a-z-]+)*\. "
    shapes = {"addition_worked": rf"({column})+\\boxed\{{\d+\}}",  # column sums, ones first, then the answer
              "addition_places": rf"{places}{places}([a-z-]+: {column})+\\boxed\{{\d+\}}"}
    for name, expected in (("addition_worked", 1.0), ("addition_places", 1.0), ("copy_question", 0.0)):
        played = graded("math:procedural", name, 40, **options)
        if name in shapes:
            assert all(re.fullmatch(shapes[name], reply) for _, reply, _ in played), played
        assert [r for _, _, r in played] == [expected] * 40, name


def test_arc_rule_finds_the_family_that_fits_every_example():
    from oat_dppo_envs.reasoning_gym import arc_rule

    def ex(*pairs):
        return [(i.split(), o.split()) for i, o in pairs]

    name, rule = arc_rule(ex(("0 3 3 0 0 0", "0 0 0 3 3 0"), ("4 0 0 0 0 0", "0 0 4 0 0 0")))
    assert name == "shift right by 2" and rule([0, 0, 7, 0, 0, 0]) == [0, 0, 0, 0, 7, 0]
    name, rule = arc_rule(ex(("0 3 0 5 0", "0 0 0 3 5"), ("2 0 2 0 0", "0 0 0 2 2")))
    assert name == "colors fall to the start, mirrored" and rule([1, 0, 0, 0, 0]) == [0, 0, 0, 0, 1]
    assert arc_rule(ex(("1 2 3", "3 1 1"))) is None  # no known rule: the demonstrator says so


def test_arc_worked_names_its_rule_and_the_grader_scores_what_it_solves():
    played = graded("rg:arc_1d", "arc_worked", 60)
    assert all(re.match(r"Rule: [^.]+\. \\boxed\{[\d ]*\}$", reply) for _, reply, _ in played)
    solved = [r for _, reply, r in played if not reply.startswith("Rule: unknown")]
    assert solved and sum(solved) / len(solved) > 0.95  # a rule that fits every example is the task's rule
    copied = graded("rg:arc_1d", "arc_copy_input", 60)
    assert sum(r for *_, r in played) > sum(r for *_, r in copied)


def steps(quotes: Counter) -> Counter:
    """check_quotes' counts without the blind share (a float that depends on the prompt)."""
    return Counter({k: v for k, v in quotes.items() if k != "chance"})
