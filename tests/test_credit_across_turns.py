"""Credit across turns, end to end (issue 38): the reward arrives on the last turn and depends on the first.

`smoke:ask_first`: turn 1 asks for a key or not, turn 2 answers; only a right answer pays, and only
after asking can it beat chance (4 keys: a policy that never asks succeeds 1 time in 4). Asking
earns nothing on turn 1 itself: a policy learns to ask only if turn 2's reward reaches turn 1's
tokens. (tests/test_credit_assignment.py, by contrast, forces the first turn's action: it proves that
a reply reaches the next prompt and that each turn gets its own return.)

Advantages are group baselines (`--advantage group`, groups of 4 episodes from one seed). At `--gamma 0` turn 1
earns nothing itself, so its return and its group's mean episode return are both 0 and its advantage is exactly 0:
the learner gets no gradient from turn 1's tokens. That exactness, and its absence at gamma 1, is what this module
asserts on the runs' logged episodes. (With `batch_norm`, gamma 0 would give every turn-1 token the same negative
advantage instead.)

The behaviour is not asserted, because it does not measure credit here: seeds 0-2, 40 iterations of 128 episodes,
gamma 1, success over the last 10 iterations 0.37, 0.72, 0.30 (since training draws only train-split tasks); and
without any turn-1 credit (gamma 0) the asking rate still rose in 3 seeds of 4 (2026-11-29), turn 2's training
reaching turn 1 through the shared weights (its answers are single characters, half of them the asking class). An
env whose asking and answering tokens are disjoint would make asking a measure (not built).
"""

from __future__ import annotations

import json

import pytest

from oat_dppo.main import main

ITERATIONS = 3  # exactness holds at any length; a few updates let the policy move first
RUN = ["--env", "smoke:ask_first", "--model", "tiny-qwen3", "--engine", "hf", "--threads", "1", "--template", "none",
       "--max-new-tokens", "1", "--max-turns", "2", "--iterations", str(ITERATIONS), "--episodes-per-iteration", "128",
       "--mini-batch-size", "128", "--micro-batch-size", "128", "--advantage", "group", "--group-size", "4",
       "--learning-rate", "3e-3", "--trust-region", "dppo_binary_tv", "--eval-every", "0", "--seed", "0",
       "--log", "none", "--no-progress", "--log-episodes", "128",
       "--env-option", "history=last", "--env-option", "keys=4", "--env-option", "ask_one_in=2"]


def first_turn_advantages(tmp_path, gamma: str) -> list[float]:
    """Every logged episode's turn-1 advantage, over the whole run."""
    run_dir = tmp_path / f"gamma{gamma}"
    assert main([*RUN, "--gamma", gamma, "--run-dir", str(run_dir)]) == 0
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    return [e["turns"][0]["advantage"] for e in episodes]


@pytest.mark.slow
def test_at_gamma_0_the_first_turn_gets_no_credit_and_at_gamma_1_it_does(tmp_path):
    """At gamma 0 every turn-1 advantage is exactly 0 (its return and its group's mean episode return are both 0);
    the same run at gamma 1 gives turn 1 its episode's credit (non-zero wherever a group's rewards differ), so the
    zeros are the discount's doing, not a logging default. The asking rate is not asserted (the module docstring)."""
    at_0 = first_turn_advantages(tmp_path, gamma="0")
    assert len(at_0) == 128 * ITERATIONS and set(at_0) == {0.0}
    at_1 = first_turn_advantages(tmp_path, gamma="1")
    assert len(at_1) == 128 * ITERATIONS and sum(a != 0.0 for a in at_1) > len(at_1) / 4
