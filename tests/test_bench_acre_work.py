"""`python -m benchmarks acre-work`: which step of a worked ACRE answer holds, on real test questions."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest

pytest.importorskip("gem")

from benchmarks.acre_work import check, label_of, main, tally  # noqa: E402
from oat_dppo.agent.demonstrations import ACRE_SAYS, DEMONSTRATORS  # noqa: E402
from oat_dppo.envs.registry import make_env  # noqa: E402


def questions(n: int) -> list[str]:
    env = make_env("rg:acre", seed=0, split="test")
    try:
        return [env.reset(seed=s)[0] for s in range(n)]
    finally:
        env.close()


def one_verdict_for_all(prompt: str, says: str = ACRE_SAYS["off"]) -> str:
    """Every test object "in an off trial", and the label that follows (a player that looks nothing up)."""
    test = prompt.split("New test case:", 1)[1].strip().splitlines()[0]
    objects = list(dict.fromkeys(o.strip() for o in test.split(",")))
    return " ".join(f"{o}: {says}." for o in objects) + " So off. \\boxed{off}"


def test_the_rules_answer_holds_at_every_step_and_a_player_that_looks_nothing_up_fails_where_it_should(tmp_path):
    worked, rng = DEMONSTRATORS["acre_worked"].act, random.Random(0)
    prompts = questions(40)
    episodes = [{"iteration": 0, "turns": [{"prompt": p, "response": worked(p, rng)}]} for p in prompts]
    objects, named, steps, answers = tally(episodes)
    assert answers == 40 and named == objects and set(objects) == {"off", "blicket", "unknown"}
    assert steps["form"] == steps["follows"] == 40 and steps["right"] >= 36  # the rules: 0.96 of the labels

    blind = [{"iteration": 0, "turns": [{"prompt": p, "response": one_verdict_for_all(p)}]} for p in prompts]
    objects, named, steps, _ = tally(blind)
    # its one verdict is right for the objects that are in an off trial, and for no other
    assert named["off"] == objects["off"] and named["blicket"] == named["unknown"] == 0
    assert steps["form"] == steps["follows"] == 40 and steps["right"] < 40 * 0.6

    log = tmp_path / "episodes.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in blind))
    assert main([str(tmp_path)]) == 0
    assert main([str(tmp_path / "missing")]) == 2


def test_a_label_that_does_not_follow_from_its_own_verdicts_is_caught():
    prompt = questions(1)[0]
    reply = one_verdict_for_all(prompt, ACRE_SAYS["blicket"])  # every object a blicket, then "So off"
    per_object, held = check(prompt, reply)
    assert held["form"] and not held["follows"]
    assert label_of(["off", "off"]) == "off" and label_of(["off", "unknown"]) == "undetermined"
    assert label_of(["unknown", "blicket"]) == "on" and label_of([]) == "undetermined"
    assert not check(prompt, re.sub(r"\\boxed\{\w+\}", "", reply))[1]["form"]


def test_quotes_are_checked_for_the_copy_and_for_the_verdict_that_follows_from_it():
    from benchmarks.acre_work import check_quotes
    from oat_dppo_envs.reasoning_gym import acre_trial, acre_trial_lines

    prompt = next(p for p in questions(40) if any(o == "off" for o in
                                                   (acre_trial(line)[1] for line in acre_trial_lines(p))))
    off_line = next(line for line in acre_trial_lines(prompt) if line.endswith("→ off"))
    obj = sorted(acre_trial(off_line)[0])[0]
    stranger = next(o for line in acre_trial_lines(prompt) for o in sorted(acre_trial(line)[0])
                    if o not in acre_trial(off_line)[0])
    right = steps(check_quotes(prompt, f"See: {off_line}. {obj}: in an off trial."))
    assert right == Counter(quotes=1, copied=1, agrees=1)
    # the right line, the wrong verdict for it
    assert steps(check_quotes(prompt, f"See: {off_line}. {obj}: no evidence.")) == Counter(quotes=1, copied=1)
    # a line that does not hold the object, or is not in the prompt
    assert check_quotes(prompt, f"See: {off_line}. {stranger}: in an off trial.")["copied"] == 0
    alone = f"{obj} → off"  # a quote of a line the prompt may not have
    copied = check_quotes(prompt, f"See: {alone}. {obj}: in an off trial.")["copied"]
    assert copied == (alone in acre_trial_lines(prompt))
    assert steps(check_quotes(prompt, f"See: no trial. {obj}: no evidence.")) == Counter(quotes=1, agrees=1)
    assert check_quotes(prompt, one_verdict_for_all(prompt)) == Counter()  # acre_worked's format quotes nothing


def steps(quotes: Counter) -> Counter:
    """check_quotes' counts without the blind share (a float that depends on the prompt)."""
    return Counter({k: v for k, v in quotes.items() if k != "chance"})


def test_the_blind_share_is_what_quoting_a_random_line_copies_rightly():
    from benchmarks.acre_work import check_quotes
    from oat_dppo_envs.reasoning_gym import acre_trial, acre_trial_lines

    prompt = questions(1)[0]
    lines = acre_trial_lines(prompt)
    obj = sorted(acre_trial(lines[0])[0])[0]
    copied = [check_quotes(prompt, f"See: {line}. {obj}: no evidence.")["copied"] for line in lines]
    assert check_quotes(prompt, f"See: {lines[0]}. {obj}: no evidence.")["chance"] == sum(copied) / len(lines)
