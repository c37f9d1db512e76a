"""Credit across turns, end to end (issue 38): the reward arrives on the last turn and depends on the first.

`smoke:ask_first`: turn 1 asks for a key or not, turn 2 answers; only a right answer pays, and only
after asking can it beat chance (4 keys: a policy that never asks succeeds 1 time in 4). Asking
earns nothing on turn 1 itself: a policy learns to ask only if turn 2's reward reaches turn 1's
tokens. (tests/test_credit_assignment.py, by contrast, forces the first turn's action: it proves that
a reply reaches the next prompt and that each turn gets its own return.)

Advantages are group baselines (`--advantage group`, groups of 4 episodes from one seed). The control is
the same run at `--gamma 0`, a command line anyone can run: turn 1 earns nothing itself, so its return and
its group's mean episode return are both 0 and its advantage is exactly 0 (asserted on the run's logged
episodes): the learner gets no gradient from turn 1's tokens. It reads the key when it happens to ask, but
never learns to ask. (With `batch_norm`, gamma 0 is no control: normalising gives every turn-1 token the same
negative advantage, which at seed 0 raised the asking rate 0.26 -> 0.85 in 20 iterations with no credit.)

Measured, seed 0, 40 iterations of 128 episodes, 2-6 s an iteration on a busy core: success over the last 10
iterations 0.61 (asks in 0.99 of them) at gamma 1, against 0.27 (asks 0.08; every turn-1 advantage 0) at gamma 0.

Not robust (2026-11-29): after the learner's shared prefixes changed its float summation order (log-probs and
gradients equal within 1e-6, checked on this env's batch), seed 0 at gamma 0 asked 0.74 of the time. Seeds 0-3,
last 10 iterations, gamma 0 / gamma 1: success 0.43 / 0.75, 0.52 / 0.27, 0.50 / 0.68, 0.77 / 0.77; asked 0.74 /
1.0, 0.40 / 0.22, 1.0 / 1.0, 1.0 / 1.0. Without any turn-1 credit the asking rate still moved up in 3 seeds of 4:
turn 2's training reaches turn 1 through the shared weights (its answers are single characters, half of them the
asking class). So the behaviour is no control here, and the first test alone is no evidence of credit across
turns; what gamma 0 guarantees exactly, and the second test asserts, is that turn 1's advantages are 0. An env
whose asking and answering tokens are disjoint is the fix (not built yet).
"""

from __future__ import annotations

import json

import pytest

from oat_dppo.main import main

ITERATIONS = 40
RUN = ["--env", "smoke:ask_first", "--model", "tiny-qwen3", "--engine", "hf", "--threads", "1", "--template", "none",
       "--max-new-tokens", "1", "--max-turns", "2", "--iterations", str(ITERATIONS), "--episodes-per-iteration", "128",
       "--mini-batch-size", "128", "--micro-batch-size", "128", "--advantage", "group", "--group-size", "4",
       "--learning-rate", "3e-3", "--trust-region", "dppo_binary_tv", "--eval-every", "0", "--seed", "0",
       "--log", "none", "--no-progress", "--log-episodes", "128",
       "--env-option", "history=last", "--env-option", "keys=4", "--env-option", "ask_one_in=2"]
BLIND = 0.25  # never asking: one of 4 equally likely keys
# Asking at the untrained rate (~0.25) and reading every key perfectly: 0.25 + 0.75 / 4 = 0.44.
LEARNED = 0.5


def run(tmp_path, gamma: str) -> tuple[float, float, list[float]]:
    """(rollout success, share of episodes that asked, turn 1's logged advantages), over the last 10 iterations."""
    run_dir = tmp_path / "run"
    assert main([*RUN, "--gamma", gamma, "--run-dir", str(run_dir)]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == ITERATIONS
    success = sum(r["rollout/success_rate"] for r in rows[-10:]) / 10
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    first = [e["turns"][0] for e in episodes if e["iteration"] >= ITERATIONS - 10]
    asked = sum(bool(t["response"]) and ord(t["response"][0]) % 2 == 0 for t in first) / len(first)  # ask_one_in=2
    return success, asked, [t["advantage"] for t in first]


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason=(
    "seed-fragile, see the module docstring: since training draws only train-split tasks (2026-12-05) seeds 0-2 "
    "give success 0.37, 0.72, 0.30 at gamma 1 (before: 0.75, 0.27, 0.68, 0.77 for seeds 0-3); the fix is an env "
    "whose asking and answering tokens are disjoint"))
def test_a_tiny_model_learns_to_ask_when_the_reward_reaches_the_first_turn(tmp_path):
    success, asked, _ = run(tmp_path, gamma="1")
    assert success >= LEARNED, (success, asked)
    assert asked >= 0.8, (success, asked)


@pytest.mark.slow
def test_at_gamma_0_the_first_turn_gets_no_credit(tmp_path):
    """Every logged turn-1 advantage is exactly 0 (its return and its group's mean episode return are both 0);
    the asking rate is not asserted (the module docstring: it drifts without credit)."""
    _, _, first_advantages = run(tmp_path, gamma="0")
    assert first_advantages and set(first_advantages) == {0.0}
