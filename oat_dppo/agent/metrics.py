"""What a batch of episodes reports: reward, success, lengths (the `rollout/` and `eval/` metrics)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from oat_dppo.agent.types import Episode

SUCCESS_RETURN = 1.0 - 1e-6  # an episode "succeeds" when it collects the full reward of 1
# What an evaluation reports (fixed keys: the Oat learner broadcasts them to every rank).
EVAL_KEYS = ("episodes", "reward_mean", "success_rate", "turns_mean", "response_tokens_mean", "well_formed_rate",
             "length_truncated_rate", "hint_direction_agreement", "reply_effect", "reply_effect_turns")
# Averaged over the turns scored, not the episodes played.
_PER_SCORED_TURN = {"reply_effect": "reply_effect_turns"}


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Reward, success, length of a batch of episodes (episodes lost to env errors excluded)."""
    played = [e for e in episodes if e.error is None and e.turns]
    turns = [t for e in played for t in e.turns]
    if not played:
        return {"episodes": 0.0, "reward_mean": math.nan, "success_rate": math.nan}
    returns = np.array([e.episode_return for e in played])
    out = {
        "episodes": float(len(played)),
        "reward_mean": float(returns.mean()),  # an episode's reward: the sum of its turns' rewards
        "reward_std": float(returns.std()),
        "turn_reward_mean": float(np.mean([t.reward for t in turns])),
        "success_rate": float(np.mean(returns >= SUCCESS_RETURN)),
        "turns_mean": float(np.mean([len(e.turns) for e in played])),
        "response_tokens_mean": float(np.mean([t.num_tokens for t in turns])),
        "prompt_tokens_mean": float(np.mean([len(t.prompt_ids) for t in turns])),
        "well_formed_rate": float(np.mean([t.well_formed for t in turns])),
        "length_truncated_rate": float(np.mean([t.finish_reason == "length" for t in turns])),
    }
    rate = repeat_rate(played)
    if math.isfinite(rate):  # only where some episode had a second turn (never for single-turn envs)
        out["repeat_rate"] = rate
    rate = hint_direction_agreement(played)
    if math.isfinite(rate):  # only for envs that declare how to read their feedback
        out["hint_direction_agreement"] = rate
    out.update(outcomes_per_episode(played))
    return out


def outcomes_per_episode(episodes: Sequence[Episode]) -> dict[str, float]:
    """`outcome_<kind>`: the mean number of turns per episode whose reply was of that kind, for envs
    that classify their replies (Sudoku: `outcome_correct` is correct placements per episode,
    `outcome_filled` moves onto filled cells); every kind the env declares, zeros included; {} where
    none does."""
    kinds = sorted({t.outcome for e in episodes for t in e.turns if t.outcome is not None}
                   | {k for e in episodes for k in e.info.get("outcome_kinds", ())})
    return {f"outcome_{k}": float(np.mean([sum(t.outcome == k for t in e.turns) for e in episodes])) for k in kinds}


def hint_direction_agreement(episodes: Sequence[Episode]) -> float:
    """The share of responses that move the way the environment's previous reply said (after "5:
    higher", a guess above 5), over the turns that followed a reply with a direction (NaN when no turn
    did). Agreement, not feedback use: a policy that reads the replies sits near 1.0, but so does a
    blind ascending sweep (1, 2, 3, ... never meets a "lower"). How much the replies move the policy
    is `oat_dppo.agent.reply_effect` (`eval/reply_effect`). Was `feedback_follow_rate`."""
    follows = [t.follows_feedback for e in episodes for t in e.turns if t.follows_feedback is not None]
    return float(np.mean(follows)) if follows else math.nan


def repeat_rate(episodes: Sequence[Episode]) -> float:
    """The share of turns (after an episode's first) whose response is token for token the one of the
    turn before: 1.0 is a policy that says the same thing whatever the environment answered (NaN
    when no episode has two turns)."""
    same = [a.response_ids == b.response_ids for e in episodes for a, b in zip(e.turns, e.turns[1:])]
    return float(np.mean(same)) if same else math.nan


def combine_eval(results: Sequence[dict]) -> dict[str, float]:
    """Several evaluations' `EVAL_KEYS` as one (e.g. one per Oat actor): counts summed, rates weighted by
    episodes, the reply effect by the turns it scored."""
    total = sum(r.get("episodes", 0.0) for r in results)
    out = {k: math.nan for k in EVAL_KEYS}
    out["episodes"] = float(total)
    counts = {"episodes", *_PER_SCORED_TURN.values()}
    for k in counts - {"episodes"}:
        vals = [r[k] for r in results if not math.isnan(r.get(k, math.nan))]
        out[k] = float(sum(vals)) if vals else math.nan
    if total:
        for k in EVAL_KEYS:
            if k in counts:
                continue
            weight = _PER_SCORED_TURN.get(k, "episodes")
            vals = [(r[weight], r[k]) for r in results
                    if r.get(weight) and not math.isnan(r.get(k, math.nan)) and not math.isnan(r[weight])]
            w = sum(n for n, _ in vals)
            out[k] = sum(n * v for n, v in vals) / w if w else math.nan
    return out
