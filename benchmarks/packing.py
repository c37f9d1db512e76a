"""Benchmark: one learner row per episode (`history=chat`) against one row per turn.

    python -m benchmarks packing [--envs game:GuessTheNumber-v0-easy,game:Sudoku-v0-easy] [--episodes 8]

Per environment: SmolLM2 plays `episodes` episodes with chat history through the HF engine (its own sampled
ids, so every turn's prompt extends the turn before), then the local learner takes the same update on those
turns twice from the same weights: with the episodes (`Learner.update(..., episode_ids)`: an episode's turns
are one row) and without (a row per turn). Reported: attended tokens the learner computes per trained
(response) token in each layout, and the learner's seconds per update (`train_seconds`, fastest of `reps`
round-robin repetitions, one thread). Padding is not in the token counts (it is in the times). Progress goes to
stderr, the table to stdout.
"""

from __future__ import annotations

import copy
import random
import sys
from dataclasses import dataclass

import torch

from oat_dppo.agent import PromptFormat, play_episodes
from oat_dppo.cli import opt, parse
from oat_dppo.components import resolve_template
from oat_dppo.config import TrainConfig
from oat_dppo.engine.base import stop_token_ids
from oat_dppo.learner import Learner, LearnerConfig, collate
from oat_dppo.learner.batch import chains
from oat_dppo.trust_region import make_trust_region


@dataclass
class Config:
    envs: str = opt("game:GuessTheNumber-v0-easy,game:Sudoku-v0-easy", "comma-separated environment ids")
    model: str = opt("smollm2", "policy (its chat template must be a chat template: history=chat)")
    episodes: int = opt(8, "episodes played per environment")
    max_new_tokens: int = opt(12, "response budget per turn")
    response_prefix: str = opt("\\boxed{", "pre-filled start of every response")
    trainable_layers: int = opt(6, "top layers trained (as the project's CPU runs)")
    micro_batch_size: int = opt(4, "turns per micro-batch (a packed episode is one row, however many turns)")
    reps: int = opt(3, "timed updates per layout, round-robin (fastest reported)")
    threads: int = opt(1, "torch intra-op threads")
    seed: int = opt(0, "episode seeds and sampling")


def play(cfg, env_id: str, model, tok, group_size: int = 1, **env_options) -> list:
    """`cfg.episodes` episodes of `env_id` played by `model` through the HF engine (`cfg`: model, episodes,
    max_new_tokens, response_prefix, seed), with the env's `env_options` (e.g. history="chat"), `group_size`
    episodes from each start seed (a group's samples of one prompt)."""
    from oat_dppo.engine.hf import HFEngine
    from oat_dppo.envs import make_env

    tc = TrainConfig(env=env_id, model=cfg.model, env_option=tuple(f"{k}={v}" for k, v in env_options.items()))
    fmt = PromptFormat(tok, resolve_template(tc, tok), None, cfg.response_prefix)
    engine = HFEngine(model, tok, stop_token_ids=stop_token_ids(tok, None, fmt.stop_token_ids()))
    envs = [make_env(env_id, seed=i, **env_options) for i in range(cfg.episodes)]
    print(f"{env_id}: playing {cfg.episodes} episodes", file=sys.stderr, flush=True)
    seeds = [cfg.seed * 1000 + i // group_size for i in range(cfg.episodes)]
    episodes, _ = play_episodes(engine, envs, seeds, fmt, max_new_tokens=cfg.max_new_tokens, generation_seed=cfg.seed)
    for env in envs:
        env.close()
    return episodes


def measure(cfg: Config, env_id: str, model, tok) -> dict:
    episodes = play(cfg, env_id, model, tok, history="chat")
    turns = [t for e in episodes if e.error is None for t in e.turns if t.response_ids]
    episode_ids = [i for i, e in enumerate(episodes) if e.error is None for t in e.turns if t.response_ids]
    for i, t in enumerate(turns):
        t.advantage = 1.0 if i % 2 else -1.0
    trained = sum(len(t.response_ids) for t in turns)
    per_turn = collate(turns, 0)
    packed = collate(turns, 0, rows=chains(turns, episode_ids))
    seconds = {"per turn": [], "packed": []}
    lcfg = LearnerConfig(learning_rate=1e-5, mini_batch_size=len(turns), micro_batch_size=cfg.micro_batch_size)
    for rep in range(cfg.reps):
        for layout, ids in (("per turn", None), ("packed", episode_ids)):
            m = copy.deepcopy(model)
            learner = Learner(m, make_trust_region("dppo_binary_tv"), lcfg, pad_id=tok.pad_token_id)
            seconds[layout].append(learner.update(turns, random.Random(rep), ids)["train_seconds"])
            print(f"  {layout}: {seconds[layout][-1]:.1f} s", file=sys.stderr, flush=True)
    return {"env": env_id, "episodes": len(set(episode_ids)), "turns": len(turns), "trained": trained,
            "rows": (per_turn.num_rows, packed.num_rows),
            "computed": (int(per_turn.attention_mask.sum()) / trained, int(packed.attention_mask.sum()) / trained),
            "seconds": (min(seconds["per turn"]), min(seconds["packed"]))}


def main(argv: list[str]) -> int:
    cfg = parse(Config, argv, prog="python -m benchmarks packing", description=__doc__)
    torch.set_num_threads(cfg.threads)
    from oat_dppo.models import freeze_all_but_top_layers, load_policy

    model, tok = load_policy(cfg.model, seed=cfg.seed)
    if cfg.trainable_layers:
        freeze_all_but_top_layers(model, cfg.trainable_layers)
    model.eval()
    rows = [measure(cfg, env, model, tok) for env in cfg.envs.split(",")]
    print(f"{cfg.model}, history=chat, {cfg.episodes} episodes per env, top {cfg.trainable_layers} layers trained, "
          f"micro-batches of {cfg.micro_batch_size} rows, {cfg.threads} thread(s), fastest of {cfg.reps}\n")
    print("| env | episodes | turns | trained tokens | rows: per turn / packed | computed per trained token: per "
          "turn / packed | learner s per update: per turn / packed | time ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['env']} | {r['episodes']} | {r['turns']} | {r['trained']} | {r['rows'][0]} / {r['rows'][1]} | "
              f"{r['computed'][0]:.1f} / {r['computed'][1]:.1f} | {r['seconds'][0]:.2f} / {r['seconds'][1]:.2f} | "
              f"{r['seconds'][1] / r['seconds'][0]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
