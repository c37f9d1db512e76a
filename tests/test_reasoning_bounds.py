"""Arc1D and ACRE bounds: the scripted policies answer GEM's real reasoning-gym questions through the
project's `make_env`, and each bound says what it must (blind labels at their class shares, a reader of
the experiments near the oracle, the oracle at 1)."""

from __future__ import annotations

import random

import pytest

from benchmarks.reasoning_bounds import POLICIES, acre_trials, arc_rows, blicket_reader, main, play

QUESTION = """Previous experimental results:
gray metal cube → on
yellow rubber cylinder → off
red rubber sphere, yellow rubber cylinder → on
blue metal cylinder, green metal sphere → on

New test case:
{test}

What is the detector light status?"""


@pytest.mark.parametrize("test, label", [
    ("yellow rubber cylinder, gray metal cube", "on"),     # holds a blicket seen alone
    ("red rubber sphere", "on"),                          # the only candidate of an "on" trial with a non-blicket
    ("yellow rubber cylinder", "off"),                     # every object ruled out
    ("blue metal cylinder", "undetermined"),               # one of two candidates, neither ruled out
])
def test_the_blicket_reader_infers_what_the_trials_allow(test, label):
    trials, objects = acre_trials(QUESTION.format(test=test))
    assert len(trials) == 4 and objects == [o.strip() for o in test.split(",")]
    assert blicket_reader(QUESTION.format(test=test), random.Random(0), None) == label


def test_acre_bounds_blind_labels_score_their_shares_and_reading_the_trials_nearly_all():
    scores = {name: play("rg:acre", policy, episodes=60)["reward"] for name, policy in POLICIES["rg:acre"].items()}
    assert scores["oracle"] == 1.0  # the scorer takes the stored answer
    shares = [scores["always_on"], scores["always_off"], scores["always_undetermined"]]
    assert sum(shares) == pytest.approx(1.0)  # every question has exactly one of the three labels
    assert max(shares) < 0.6 and scores["random_label"] < 0.6
    assert scores["blicket_reader"] > 0.9 > max(shares)
    # reasoning-gym's partial credit: an answer containing the label earns len(label) / len(answer)
    assert scores["hedge_on_off"] == pytest.approx((2 * scores["always_on"] + 3 * scores["always_off"]) / 5)
    assert scores["hedge_on_off"] < max(shares)


def test_arc_1d_bounds_copying_scores_little_and_the_oracle_all():
    scores = {name: play("rg:arc_1d", policy, episodes=40)["reward"] for name, policy in POLICIES["rg:arc_1d"].items()}
    assert scores["oracle"] == 1.0
    assert scores["zeros"] == 0.0
    assert scores["copy_input"] < 0.2 and scores["last_example_output"] < 0.2


def test_arc_rows_reads_examples_and_the_test_input():
    question = "Example 1:\nInput:  1 0 0\nOutput: 0 0 1\n\nBelow is a test input grid.\n\nInput:\n2 0 0\n\nPlease"
    assert arc_rows(question) == ([(["1", "0", "0"], ["0", "0", "1"])], ["2", "0", "0"])


def test_cli_rejects_a_policy_of_the_other_env(capsys):
    with pytest.raises(SystemExit):
        main(["--env", "rg:arc_1d", "--policies", "always_on"])
    assert "unknown policy ['always_on'] for rg:arc_1d" in capsys.readouterr().err
