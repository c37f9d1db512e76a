"""A warm start before RL: supervised steps on demonstrated episodes (`--warm-start`).

Small models rarely learn a multi-turn game from RL alone; the recipes that work start from demonstrations
(docs/warm_start.md). Here a warm start is two steps, both through the run's own parts:

1. `collect`: the demonstrations, as episodes of the run's env, template and history
   (`agent.demonstrations`: a scripted player shown only the prompts, the model's own successful episodes,
   or a JSONL file);
2. `supervise`: `--warm-start-steps` optimizer steps of `--warm-start-batch` demonstrated turns each, on the
   agent's tokens only, with the RL learner's packing and micro-batches and the objective
   `learner.supervised.NegativeLogLikelihood` (its own AdamW at `--warm-start-lr`).

The trainer then saves a checkpoint (an interruption after it keeps the warm start), evaluates once before
the first RL update, and RL continues from there in the same run.
"""

from __future__ import annotations

import math
import random
from typing import Callable, Sequence

from oat_dppo.agent import Episode, PromptFormat, play_episodes
from oat_dppo.agent.demonstrations import DEMONSTRATORS, ScriptedEngine, read_episodes, successful
from oat_dppo.agent.metrics import episode_metrics
from oat_dppo.config import ConfigError, TrainConfig
from oat_dppo.learner import Learner, LearnerConfig
from oat_dppo.learner.supervised import NegativeLogLikelihood
from oat_dppo.seeds import derive_seed, episode_seeds


def end_of_turn_ids(prompt: PromptFormat) -> list[int]:
    """What ends a demonstrated response, as it ends a sampled one: the template's end-of-turn token, else EOS."""
    ids = prompt.stop_token_ids()
    eos = getattr(prompt.tokenizer, "eos_token_id", None)
    return ids[:1] or ([int(eos)] if eos is not None else [])


def collect(cfg: TrainConfig, *, engine, envs: Sequence, prompt: PromptFormat, max_new_tokens: int
            ) -> tuple[list[Episode], dict[str, float]]:
    """The demonstrations `cfg.warm_start` names, and what they scored (`episode_metrics` of every episode
    played, before `self` keeps the successful ones). `engine` samples the model (for `self`); `envs`: the
    run's training envs, played in rounds of len(envs) episodes."""
    source = cfg.warm_start
    if source not in ("self",) and not source.startswith("demo:"):
        episodes = read_episodes(source, prompt, end_of_turn_ids(prompt))
        return episodes, {"episodes": float(len(episodes))}
    player = engine
    if source.startswith("demo:"):
        player = ScriptedEngine(DEMONSTRATORS[source[len("demo:"):]], prompt, end_of_turn_ids(prompt),
                                seed=derive_seed(cfg.seed, "warm-start-demo"))
    played: list[Episode] = []
    round_index = 0
    while len(played) < cfg.warm_start_episodes:
        n = min(len(envs), cfg.warm_start_episodes - len(played))
        seeds = episode_seeds(derive_seed(cfg.seed, "warm-start"), round_index, n, 1)
        episodes, _ = play_episodes(player, list(envs)[:n], seeds, prompt, max_new_tokens=max_new_tokens,
                                    generation_seed=derive_seed(cfg.seed, "warm-start-gen", round_index))
        played += episodes
        round_index += 1
    scored = episode_metrics(played)
    return (successful(played) if source == "self" else [e for e in played if e.error is None]), scored


def supervise(model, episodes: Sequence[Episode], cfg: TrainConfig, *, pad_id: int, device,
              on_step: Callable[[dict], None] = lambda row: None) -> dict[str, float]:
    """`cfg.warm_start_steps` supervised steps on the turns of `episodes` (shuffled, an epoch at a time);
    `on_step(row)` after each. Returns the summary the run logs."""
    turns = [(i, t) for i, e in enumerate(episodes) for t in e.turns if t.response_ids]
    if not turns:
        hint = (f"the model succeeded in none of the {cfg.warm_start_episodes} episodes it played; use demo:NAME or a "
                "file, or raise --warm-start-episodes" if cfg.warm_start == "self" else f"{len(episodes)} episodes")
        raise ConfigError(f"--warm-start {cfg.warm_start}: no demonstrated turn to learn from ({hint})")
    learner = Learner(model, NegativeLogLikelihood(), LearnerConfig(
        learning_rate=cfg.warm_start_lr, mini_batch_size=cfg.warm_start_batch, micro_batch_size=cfg.micro_batch_size,
        logits_chunk_tokens=cfg.logits_chunk_tokens, max_grad_norm=cfg.max_grad_norm, aggregation="token_mean"),
        pad_id=pad_id, device=device)
    rng = random.Random(derive_seed(cfg.seed, "warm-start-shuffle"))
    order: list[int] = []
    nll = []
    for step in range(cfg.warm_start_steps):
        while len(order) < cfg.warm_start_batch:
            epoch = list(range(len(turns)))
            rng.shuffle(epoch)
            order += epoch
        pick, order = order[: cfg.warm_start_batch], order[cfg.warm_start_batch:]
        out = learner.update([turns[i][1] for i in pick], rng, [turns[i][0] for i in pick])
        nll.append(out.get("nll", math.nan))
        on_step({"step": step, "nll": nll[-1], "grad_norm": out.get("grad_norm", math.nan),
                 "tokens": out.get("train_tokens", 0.0), "seconds": out.get("train_seconds", 0.0)})
    first, last = nll[: max(1, len(nll) // 10)], nll[-max(1, len(nll) // 10):]
    return {"episodes": float(len(episodes)), "turns": float(len(turns)), "steps": float(len(nll)),
            "nll_first": sum(first) / len(first), "nll_last": sum(last) / len(last)}
