"""A warm start before RL: supervised steps on demonstrated episodes (`--warm-start`).

Small models rarely learn a multi-turn game from RL alone; the recipes that work start from demonstrations
(docs/warm_start.md). Here a warm start is two steps, both through the run's own parts:

1. `collect`: the demonstrations, as episodes of the run's env, template and history
   (`agent.demonstrations`: a scripted player shown only the prompts, the model's own successful episodes,
   or a JSONL file);
2. `supervise`: `--warm-start-steps` optimizer steps of `--warm-start-batch` demonstrated turns each, on the
   agent's tokens only, with the RL learner's packing and micro-batches and the objective
   `learner.supervised.NegativeLogLikelihood` (its own AdamW at `--warm-start-lr`).

The trainer saves a checkpoint every `WARM_START_SAVE_EVERY` steps (iteration `IN_PROGRESS`, with the `Progress`:
a stopped warm start resumes at its last saved step), and one when the warm start is done (an interruption after
it keeps the warm start), evaluates once before the first RL update, and RL continues from there in the same run.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
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


#: The checkpoint iteration of a warm start in progress (-1 is the finished warm start / the policy before RL).
IN_PROGRESS = -2


@dataclass
class Progress:
    """Where a warm start stands after `step` supervised steps: saved with its checkpoint, so a stopped warm
    start goes on where it was (the same turns next, the same shuffle) rather than from its first step."""

    step: int = 0
    order: list[int] = field(default_factory=list)  # indices of the turns drawn next
    rng: list | None = None  # the shuffling random.Random's getstate(), as JSON
    nll: list[float] = field(default_factory=list)  # every step's NLL so far (the summary's first and last)


def warm_learner(model, cfg: TrainConfig, *, pad_id: int, device) -> Learner:
    """The supervised learner: the RL learner's packing and micro-batches, `NegativeLogLikelihood`, its own AdamW."""
    return Learner(model, NegativeLogLikelihood(), LearnerConfig(
        learning_rate=cfg.warm_start_lr, mini_batch_size=cfg.warm_start_batch, micro_batch_size=cfg.micro_batch_size,
        logits_chunk_tokens=cfg.logits_chunk_tokens, max_grad_norm=cfg.max_grad_norm, aggregation="token_mean"),
        pad_id=pad_id, device=device)


def supervise(learner: Learner, episodes: Sequence[Episode], cfg: TrainConfig, *,
              on_step: Callable[[dict, Progress], None] = lambda row, progress: None,
              progress: Progress | None = None) -> dict[str, float]:
    """`cfg.warm_start_steps` supervised steps on the turns of `episodes` (shuffled, an epoch at a time), from
    `progress` (a resumed warm start) or the first; `on_step(row, progress)` after each. Returns the summary."""
    turns = [(i, t) for i, e in enumerate(episodes) for t in e.turns if t.response_ids]
    if not turns:
        hint = (f"the model succeeded in none of the {cfg.warm_start_episodes} episodes it played; use demo:NAME or a "
                "file, or raise --warm-start-episodes" if cfg.warm_start == "self" else f"{len(episodes)} episodes")
        raise ConfigError(f"--warm-start {cfg.warm_start}: no demonstrated turn to learn from ({hint})")
    rng = random.Random(derive_seed(cfg.seed, "warm-start-shuffle"))
    state = progress or Progress()
    if state.rng is not None:
        rng.setstate((state.rng[0], tuple(state.rng[1]), state.rng[2]))
    for step in range(state.step, cfg.warm_start_steps):
        while len(state.order) < cfg.warm_start_batch:
            epoch = list(range(len(turns)))
            rng.shuffle(epoch)
            state.order += epoch
        pick, state.order = state.order[: cfg.warm_start_batch], state.order[cfg.warm_start_batch:]
        out = learner.update([turns[i][1] for i in pick], rng, [turns[i][0] for i in pick])
        version, internal, gauss = rng.getstate()
        state.step, state.rng = step + 1, [version, list(internal), gauss]
        state.nll.append(out.get("nll", math.nan))
        on_step({"step": step, "nll": state.nll[-1], "grad_norm": out.get("grad_norm", math.nan),
                 "tokens": out.get("train_tokens", 0.0), "seconds": out.get("train_seconds", 0.0)}, state)
    nll = state.nll
    first, last = nll[: max(1, len(nll) // 10)], nll[-max(1, len(nll) // 10):]
    return {"episodes": float(len(episodes)), "turns": float(len(turns)), "steps": float(len(nll)),
            "nll_first": sum(first) / len(first), "nll_last": sum(last) / len(last)}
