"""Multi-turn credit assignment, end to end: a tiny random model must read what the environment
said on one turn to score on the next (`smoke:hidden_digit`, reveal mode: the first reply names a
digit 0..3, the second turn must say it). A policy that cannot read the reply finds it 1 time in 4;
the loop has to carry the reply into the next prompt and give the second turn its own return.

The same run with the reply withheld (`feedback=false`: "ok." instead of the digit) is the
control: no learning can beat the blind bound there, so the first test could not pass by accident.

When a random model starts learning depends on its seed and stack. Measured rollout success of the
last 10 iterations with these settings: seed 0 0.47 (torch 2.13) and 0.66 (torch 2.6, .venv-oat), seed
1 0.60, seed 2 0.76; with the feedback withheld 0.25. (With 64 episodes per iteration seeds 1 and 2 never
left the blind bound in 80 iterations: the settings here are the smallest that learned on every seed
tried.) If the first test fails while test_feedback.py passes, rerun with another --seed before
suspecting the loop.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from oat_dppo.envs import make_env
from oat_dppo.main import main
from oat_dppo.seeds import eval_seeds

SEED = 0
ITERATIONS = 80
EVAL_EPISODES = 400
ENV_OPTIONS = dict(digits=4, reveal=True, guess="any_char", history="last")
# 80 iterations of 128 episodes, ~100 s on one core. lr 3e-3 and gamma 0.5 (the second turn's reward,
# halved for the first): what taught tiny-qwen3 this task in the runs of issue 28 (see its note).
RUN = ["--env", "smoke:hidden_digit", "--model", "tiny-qwen3", "--engine", "hf", "--threads", "1",
       "--template", "none", "--max-new-tokens", "1", "--max-turns", "2", "--iterations", str(ITERATIONS),
       "--episodes-per-iteration", "128", "--mini-batch-size", "128", "--micro-batch-size", "128",
       "--advantage", "batch_norm", "--gamma", "0.5", "--learning-rate", "3e-3", "--trust-region",
       "dppo_binary_tv", "--eval-every", str(ITERATIONS), "--eval-episodes", str(EVAL_EPISODES), "--seed", str(SEED),
       "--log", "none", "--no-progress",
       *[a for k, v in ENV_OPTIONS.items() for a in ("--env-option", f"{k}={str(v).lower()}")]]
BLIND = 0.25  # one scoring guess of 4 equally likely digits
# Training targets are fresh every episode (nothing to memorize): the success of the last 10 iterations,
# 1280 episodes, is a low-noise measure (a blind policy's standard error there is ~0.012).
LEARNED = BLIND + 0.10


def blind_success_on_eval_episodes() -> float:
    """The best a feedback-blind policy does on the evaluation's own episodes: it says one digit on
    the scoring turn whatever happened, so it scores on the most frequent target (the expectation is
    1/4; a finite set of 400 targets is not exactly uniform: 0.3175 for seed 0)."""
    env = make_env("smoke:hidden_digit", seed=SEED, split="validation", max_turns=2, **ENV_OPTIONS)
    targets = Counter()
    for s in eval_seeds(SEED, EVAL_EPISODES):
        env.reset(seed=s)
        targets[env.unwrapped.target] += 1
    return max(targets.values()) / EVAL_EPISODES


def run_success(tmp_path, *extra: str) -> tuple[float, float]:
    """(mean rollout success of the last 10 iterations, held-out success at the end)."""
    run_dir = tmp_path / "run"
    assert main([*RUN, "--run-dir", str(run_dir), *extra]) == 0
    assert json.loads((run_dir / "config.json").read_text())["_feedback_blind_success"] == BLIND
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["iteration"] >= 0]  # -1: the evaluation before the first update
    assert len(rows) == ITERATIONS
    late = sum(r["rollout/success_rate"] for r in rows[-10:]) / 10
    held_out = rows[-1]["eval/success_rate"]
    assert math.isfinite(late) and math.isfinite(held_out)
    return late, held_out


@pytest.mark.slow
def test_a_tiny_model_learns_to_use_what_the_environment_said(tmp_path):
    late, held_out = run_success(tmp_path)
    assert late >= LEARNED, (late, held_out)
    assert held_out > blind_success_on_eval_episodes(), (late, held_out)


@pytest.mark.slow
def test_with_the_feedback_withheld_the_same_run_stays_at_the_blind_bound(tmp_path):
    late, held_out = run_success(tmp_path, "--env-option", "feedback=false")
    assert late <= BLIND + 0.05, (late, held_out)
    assert held_out <= blind_success_on_eval_episodes() + 0.05, (late, held_out)
