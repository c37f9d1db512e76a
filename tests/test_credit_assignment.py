"""Multi-turn credit assignment, end to end: a tiny random model must read what the environment
said on one turn to score on the next (`smoke:hidden_digit`, reveal mode: the first reply names a
digit 0..3, the second turn must say it). A policy that cannot read the reply finds it 1 time in 4;
the loop has to carry the reply into the next prompt and give the second turn its own return.

The same run with the reply withheld (`feedback=false`: "ok." instead of the digit) is the
control: no learning can beat the blind bound there, so the first test could not pass by accident.

The run is deterministic on one stack, and when a random model starts learning depends on its seed:
with these settings seed 0 ends at 0.73 (held out), seeds 1 and 2 at 0.38 and 0.23 after 80 iterations
(no better than blind on their evaluation sets), seed 3 under pg_is at 0.46; with 128 episodes per
iteration seeds 0-3 reach 0.41-0.78. A change that alters what the run samples
can land it on a slower path: if the first test fails while the unit tests of test_feedback.py pass,
rerun with another --seed before suspecting the loop.
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
EVAL_EPISODES = 200
ENV_OPTIONS = dict(digits=4, reveal=True, guess="any_char", history="last")
# 60 iterations of 64 episodes: ~30 s on one core. lr 3e-3 and gamma 0.5 (the second turn's reward,
# halved for the first): what taught tiny-qwen3 this task in the runs of issue 28 (see its note).
RUN = ["--env", "smoke:hidden_digit", "--model", "tiny-qwen3", "--engine", "hf", "--threads", "1",
       "--template", "none", "--max-new-tokens", "1", "--max-turns", "2", "--iterations", "60",
       "--episodes-per-iteration", "64", "--mini-batch-size", "64", "--micro-batch-size", "64",
       "--advantage", "batch_norm", "--gamma", "0.5", "--learning-rate", "3e-3", "--trust-region",
       "dppo_binary_tv", "--eval-every", "60", "--eval-episodes", str(EVAL_EPISODES), "--seed", str(SEED),
       "--log", "none", "--no-progress",
       *[a for k, v in ENV_OPTIONS.items() for a in ("--env-option", f"{k}={str(v).lower()}")]]


def blind_success_on_eval_episodes() -> float:
    """The best a feedback-blind policy does on the evaluation's own episodes: it says one digit on
    the scoring turn whatever happened, so it scores on the most frequent target (the expectation is
    1/4; a finite set of 200 targets is not exactly uniform)."""
    env = make_env("smoke:hidden_digit", seed=SEED, for_eval=True, max_turns=2, **ENV_OPTIONS)
    targets = Counter()
    for s in eval_seeds(SEED, EVAL_EPISODES):
        env.reset(seed=s)
        targets[env.unwrapped.target] += 1
    return max(targets.values()) / EVAL_EPISODES


def final_eval_success(tmp_path, *extra: str) -> float:
    run_dir = tmp_path / "run"
    assert main([*RUN, "--run-dir", str(run_dir), *extra]) == 0
    assert json.loads((run_dir / "config.json").read_text())["_feedback_blind_success"] == 0.25
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    success = rows[-1]["eval/success_rate"]
    assert math.isfinite(success)
    return success


@pytest.mark.slow
def test_a_tiny_model_learns_to_use_what_the_environment_said(tmp_path):
    blind = blind_success_on_eval_episodes()
    assert blind < 0.35
    assert final_eval_success(tmp_path) >= blind + 0.25


@pytest.mark.slow
def test_with_the_feedback_withheld_the_same_run_stays_at_the_blind_bound(tmp_path):
    blind = blind_success_on_eval_episodes()
    assert final_eval_success(tmp_path, "--env-option", "feedback=false") <= blind + 0.05
