"""Per-turn returns and advantages.

Every turn of a multi-turn episode is one transition (as in Oat and GEM's examples), whose
advantage is shared by all of its tokens.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal, Sequence

import numpy as np

from oat_dppo.agent.types import Episode

AdvantageMode = Literal["batch_norm", "group", "group_norm", "group_episode", "gigpo"]
ADVANTAGE_MODES: tuple[str, ...] = AdvantageMode.__args__  # type: ignore[attr-defined]


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_t = r_t + gamma * G_{t+1}, per turn."""
    out = [0.0] * len(rewards)
    g = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        g = float(rewards[t]) + gamma * g
        out[t] = g
    return out


def assign_advantages(episodes: Sequence[Episode], mode: AdvantageMode = "batch_norm", gamma: float = 1.0,
                      eps: float = 1e-6, episode_balance: bool = False,
                      shuffle_seed: int | None = None) -> None:
    """Set `turn.ret` and `turn.advantage` on the trainable turns of `episodes` (in place).

    batch_norm:    (G_t - mean G) / std G over every turn of the batch (GEM's Oat examples).
    group:         G_t - mean of the episode returns G_0 of the episodes that started from the same seed
                   (a GRPO baseline without std normalization, as the paper's eq. 23 runs use).
    group_norm:    the same, divided by the group's std of episode returns (GRPO proper); 0 for a group whose
                   episodes all got one return (no signal to normalize; G_t - G_0 / 0 would be unbounded).
    group_episode: G_0 - mean G_0 over the group, the same for every turn of an episode: the paper's
                   sequence-level advantage R(y) - mean R (under eq. 9; Shao et al.) with a whole trajectory as y.

    gigpo:         GiGPO (Feng et al. 2025, eq. 7-9): an episode-level term, (R - mean R) / std R over the group
                   with R the episode's total reward, undiscounted (the paper's R(tau) = sum_t r_t), plus a
                   step-level term: the turns of the group's episodes that were shown the same prompt (an anchor
                   state as the policy sees it under the history mode: the whole conversation under `chat`, the
                   whole history under `concat`, the newest observation under `last`) form a step group, and a
                   turn's discounted return-to-go is compared with the step group's, (G_t - mean G_t) / std G_t;
                   0 for a turn whose prompt no other turn of the group saw. Weight 1 on both terms (the paper's).

    In a single-turn group all three group modes agree up to the scale (G_t = G_0). Over several turns,
    `group` and `group_norm` compare a turn's return-to-go with the group's whole-episode return: both are
    unbiased (the baseline does not depend on the action), but G_t shrinks along an episode that collects
    reward as it goes, so the late turns of the group's best episodes get negative advantages whatever
    they did (docs/results/before_splits.md, "Why the format broke"). `group_episode` credits every turn with its
    episode's outcome relative to its group.
    Episodes with an env error carry no turns to train and are ignored.

    `episode_balance`: every advantage of an episode of n trained turns is multiplied by n_mean / n (n_mean: the
    batch's mean), so that each episode weighs the same in the loss, however many turns it played. Without it
    sum_turns A = sum_episodes n_e A_e, which is negative wherever the failures play longer than the
    successes (a game that ends at a win): the loss weighs the sampled moves down on balance
    (docs/warm_start.md measures both on GuessTheNumber).

    `shuffle_seed` (a control, not a method): the batch's advantages, once computed, are permuted at random over its
    trained turns (numpy's generator from this seed). The update keeps its size and its distribution of advantages
    and loses what they say about which moves won: what a run does without credit.
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage mode must be one of {ADVANTAGE_MODES}, got {mode!r}")
    live = [e for e in episodes if e.error is None and e.turns]
    _assign(live, mode, gamma, eps)
    if episode_balance:
        trained = [sum(1 for t in e.turns if t.response_ids) for e in live]
        n_mean = float(np.mean([n for n in trained if n])) if any(trained) else 0.0
        for e, n in zip(live, trained):
            for t in e.turns:
                t.advantage = float(t.advantage * n_mean / n) if n else t.advantage
    if shuffle_seed is not None:
        trained = [t for e in live for t in e.turns if t.response_ids]
        permute = np.random.default_rng(shuffle_seed).permutation
        for t, a in zip(trained, permute([t.advantage for t in trained])):
            t.advantage = float(a)


def _assign(live: Sequence[Episode], mode: AdvantageMode, gamma: float, eps: float) -> None:
    """`assign_advantages` without the balance."""
    for e in live:
        for t, g in zip(e.turns, discounted_returns([t.reward for t in e.turns], gamma)):
            t.ret = g
    if mode == "batch_norm":
        rets = np.array([t.ret for e in live for t in e.turns], dtype=np.float64)
        if rets.size == 0:
            return
        mean, std = rets.mean(), rets.std()
        for e in live:
            for t in e.turns:
                t.advantage = float((t.ret - mean) / (std + eps))
        return
    groups: dict[int, list[Episode]] = defaultdict(list)
    for e in live:
        groups[e.seed].append(e)
    for members in groups.values():
        returns = np.array([m.turns[0].ret for m in members], dtype=np.float64)  # G_0: episode returns
        baseline = returns.mean()
        scale = returns.std() + eps if mode == "group_norm" else 1.0
        if mode == "group_norm" and returns.std() <= eps:  # one return for all: no signal, and a turn's G_t - G_0
            for m in members:  # over a zero std would be unbounded (two wins at turn 3: 0.19 / 1e-6)
                for t in m.turns:
                    t.advantage = 0.0
            continue
        if mode == "gigpo":
            _assign_gigpo(members, eps)
            continue
        for m, episode_return in zip(members, returns):
            for t in m.turns:
                credited = episode_return if mode == "group_episode" else t.ret  # G_0 or the return-to-go G_t
                t.advantage = float((credited - baseline) / scale)


def _assign_gigpo(members: Sequence[Episode], eps: float) -> None:
    """GiGPO over one group (every turn's discounted `ret` is set)."""
    totals = np.array([sum(t.reward for t in m.turns) for m in members], dtype=np.float64)  # [members] R(tau)
    episode_term = (totals - totals.mean()) / (totals.std() + eps)  # [members]
    steps: dict[tuple[int, ...], list] = defaultdict(list)  # the prompt's ids -> the group's turns shown it
    for m in members:
        for t in m.turns:
            steps[tuple(t.prompt_ids)].append(t)
    step_term: dict[int, float] = {}
    for turns in steps.values():
        rets = np.array([t.ret for t in turns], dtype=np.float64)
        for t, g in zip(turns, rets):
            step_term[id(t)] = float((g - rets.mean()) / (rets.std() + eps)) if len(turns) > 1 else 0.0
    for m, a_episode in zip(members, episode_term):
        for t in m.turns:
            t.advantage = float(a_episode) + step_term[id(t)]


def uncredited_turn_rate(episodes: Sequence[Episode]) -> float:
    """The share of a batch's trained turns whose advantage is exactly 0: under a group baseline, the turns of
    groups whose episodes all returned alike (a policy that fails a hidden number in every episode of its group
    is never told so; `batch_norm` still is). Call after `assign_advantages`; NaN for a batch with no trained
    turn."""
    trained = [t.advantage for e in episodes if e.error is None for t in e.turns if t.response_ids]
    return float(np.mean([a == 0.0 for a in trained])) if trained else float("nan")
