"""What policies that ignore the environment earn: a run's own environment played with one fixed
response in every turn, and the success no feedback-blind policy can beat.

A policy that collapsed repeats one response whatever the environment answers (the report's "what
each run says at the end"). Its reward is then a property of the environment, not of the training:
on GuessTheNumber-easy, repeating `\\boxed{g}` earns 0.1 + sum_{t != g} (1 - |g - t| / 9) / 10 over a
uniform target t in 1..10 (0.722 for 5 or 6, 0.656 for 3 or 8), whatever the trust region. Reading
a run's final reward against this number tells "learned the game" from "settled on a number".

The episodes are the env's own, started from seeds 0..episodes-1 (`TextEnv.reset(seed=k)`): every
response and every run of one env configuration meets the same targets, so the difference between
two responses' rewards carries no sampling noise of its own.
"""

from __future__ import annotations

import json
import math

from oat_dppo.config import TrainConfig, env_options
from oat_dppo.envs import EnvError

EPISODES = 1000  # standard error of a mean reward ~0.25 / sqrt(1000) ~ 0.008 on GuessTheNumber

_cache: dict[tuple, float] = {}


def _env_key(cfg: TrainConfig) -> tuple:
    """What makes two runs' environments the same (the caches below are keyed by it)."""
    return (cfg.env, json.dumps(env_options(cfg), sort_keys=True, default=str), cfg.format_penalty, cfg.max_turns,
            cfg.math_data)


def constant_response_reward(cfg: TrainConfig, response: str, episodes: int = EPISODES) -> float:
    """The mean episode reward (the sum of its turns' rewards, as `rollout/reward_mean`) of saying
    `response` in every turn of `cfg`'s environment, over episode seeds 0..episodes-1. NaN when the
    environment cannot be built here (a dataset file this clone lacks) or raises while played."""
    from oat_dppo.components import build_envs  # GEM: only when a report asks

    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    key = (*_env_key(cfg), response, episodes)
    if key in _cache:
        return _cache[key]
    try:
        (env,) = build_envs(cfg, 1, split="train")
    except (EnvError, ValueError, OSError):
        return math.nan
    total = 0.0
    try:
        for seed in range(episodes):
            env.reset(seed=seed)
            done = False
            while not done:
                _, reward, terminated, truncated, _ = env.step(response)
                total += reward
                done = terminated or truncated
    except EnvError:
        return math.nan
    finally:
        env.close()
    _cache[key] = total / episodes
    return _cache[key]


def feedback_blind_success(cfg: TrainConfig) -> float:
    """The most success a policy that ignores every reply of `cfg`'s environment can reach
    (`TextEnv.feedback_blind_success`: 0.4 on GuessTheNumber-easy); NaN where the env declares no
    feedback probe or cannot be built here."""
    from oat_dppo.components import build_envs

    key = ("blind", *_env_key(cfg))
    if key not in _cache:
        try:
            (env,) = build_envs(cfg, 1, split="train")
        except (EnvError, ValueError, OSError):
            return math.nan
        try:
            _cache[key] = float(env.feedback_blind_success)
        finally:
            env.close()
    return _cache[key]
