"""Benchmark: the learner's update with steps of shuffled turns against steps of whole groups (`--mini-batch-unit`).

    python -m benchmarks mini-batch-unit [--env math:procedural] [--env-option tasks=simple_equations ...]
        [--episodes 64] [--group-size 8] [--mini-batch-size 32] [--micro-batch-size 8]

SmolLM2 plays `episodes` episodes through the HF engine, `group_size` from each start seed (a group's samples of
one prompt), as a rollout of `--group-size` does; then the local learner takes the same update on those turns from
the same weights with each unit: `turns` (each step a seeded shuffle of single turns: a group is split across steps
and its prompt runs once per part) and `groups` (each step whole groups: a micro-batch of `group_size` rows sorted
by tokens is one group, whose prompt the prefix layout computes once). Reported: decoder positions computed per
trained token (`train/decoder_tokens_per_token`, the mean over the reps' shuffles) and the update's seconds, wall and process CPU (one thread: the
CPU time is the work and barely moves when other jobs take the core), fastest of `reps` round-robin
repetitions. Progress on stderr, the table on stdout.
"""

from __future__ import annotations

import copy
import random
import sys
import time
from dataclasses import dataclass
from typing import Annotated

import torch
import tyro

from benchmarks.packing import play
from oat_dppo.cli import opt, parse
from oat_dppo.config import ConfigError, assignments
from oat_dppo.learner import Learner, LearnerConfig
from oat_dppo.trust_region import make_trust_region

UNITS = ("turns", "groups")
DEFAULT_ENV_OPTIONS = ("tasks=simple_equations", "max_value=10")


@dataclass
class Config:
    env: str = opt("math:procedural", "environment id")
    env_option: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = opt(
        (), "an environment option NAME=VALUE (repeatable), as main's; none given: "
        + " ".join(DEFAULT_ENV_OPTIONS) + " (math:procedural's small equations)")
    model: str = opt("smollm2", "policy")
    episodes: int = opt(64, "episodes played (a multiple of group_size)")
    group_size: int = opt(8, "episodes from each start seed")
    max_new_tokens: int = opt(64, "response budget")
    response_prefix: str = opt("", "pre-filled start of every response")
    trainable_layers: int = opt(6, "top layers trained (as the project's CPU runs)")
    mini_batch_size: int = opt(32, "episodes per optimizer step (a multiple of group_size)")
    micro_batch_size: int = opt(8, "rows per micro-batch")
    reps: int = opt(2, "timed updates per unit, round-robin (fastest reported)")
    threads: int = opt(1, "torch intra-op threads")
    seed: int = opt(0, "episode seeds, sampling and the steps' shuffle")


def measure(cfg: Config, model, tok) -> dict:
    options = assignments(cfg.env_option or DEFAULT_ENV_OPTIONS, "--env-option", example="max_value=10")
    episodes = [e for e in play(cfg, cfg.env, model, tok, group_size=cfg.group_size, **options) if e.error is None]
    turns = [t for e in episodes for t in e.turns if t.response_ids]
    episode_ids = [i for i, e in enumerate(episodes) for t in e.turns if t.response_ids]
    group_ids = [e.seed for e in episodes for t in e.turns if t.response_ids]
    for i, t in enumerate(turns):
        t.advantage = 1.0 if i % 2 else -1.0  # any signs: the work does not depend on them
    out = {unit: {"wall": [], "cpu": [], "tokens": []} for unit in UNITS}
    for rep in range(cfg.reps):
        for unit in UNITS:
            lcfg = LearnerConfig(learning_rate=1e-5, mini_batch_size=cfg.mini_batch_size, mini_batch_unit=unit,
                                 group_size=cfg.group_size, micro_batch_size=cfg.micro_batch_size)
            learner = Learner(copy.deepcopy(model), make_trust_region("dppo_binary_tv"), lcfg, pad_id=tok.pad_token_id)
            wall, cpu = time.perf_counter(), time.process_time()
            metrics = learner.update(turns, random.Random(cfg.seed + rep), episode_ids, group_ids)
            out[unit]["wall"].append(time.perf_counter() - wall)
            out[unit]["cpu"].append(time.process_time() - cpu)
            out[unit]["tokens"].append(metrics["decoder_tokens_per_token"])  # (each rep its own shuffle)
            out[unit]["steps"] = metrics["optimizer_steps"]
            print(f"  {unit}: {out[unit]['wall'][-1]:.1f} s wall, {out[unit]['cpu'][-1]:.1f} s CPU, "
                  f"{metrics['decoder_tokens_per_token']:.2f} decoder tokens per trained token", file=sys.stderr,
                  flush=True)
    return {"turns": len(turns), "trained": sum(len(t.response_ids) for t in turns),
            "prompt": sum(len(t.prompt_ids) for t in turns) / len(turns), "units": out}


def main(argv: list[str]) -> int:
    cfg = parse(Config, argv, prog="python -m benchmarks mini-batch-unit", description=__doc__)
    if cfg.episodes % cfg.group_size or cfg.mini_batch_size % cfg.group_size:
        print(f"--episodes {cfg.episodes} and --mini-batch-size {cfg.mini_batch_size} must be multiples of "
              f"--group-size {cfg.group_size}", file=sys.stderr)
        return 2
    torch.set_num_threads(cfg.threads)
    from oat_dppo.models import freeze_all_but_top_layers, load_policy

    try:
        model, tok = load_policy(cfg.model, seed=cfg.seed)
        if cfg.trainable_layers:
            freeze_all_but_top_layers(model, cfg.trainable_layers)
        model.eval()
        r = measure(cfg, model, tok)
    except (ConfigError, ValueError) as e:  # bad options: the env's, the model's layer count
        print(f"error: {e}", file=sys.stderr)
        return 2
    u = r["units"]
    print(f"{cfg.model} on {cfg.env} {' '.join(cfg.env_option or DEFAULT_ENV_OPTIONS)}: {cfg.episodes} episodes in groups of "
          f"{cfg.group_size}, {r['turns']} turns ({r['prompt']:.0f} prompt tokens a turn, {r['trained']} trained "
          f"tokens), steps of {cfg.mini_batch_size} episodes in micro-batches of {cfg.micro_batch_size}, top "
          f"{cfg.trainable_layers} layers trained, {cfg.threads} thread(s), fastest of {cfg.reps}\n")
    print("| unit | optimizer steps | decoder tokens per trained token (mean over reps) | update s (wall) | "
          "update s (CPU) | CPU time vs turns |")
    print("|---|---|---|---|---|---|")
    base = min(u["turns"]["cpu"])
    for unit in UNITS:
        tokens = sum(u[unit]["tokens"]) / len(u[unit]["tokens"])
        print(f"| {unit} | {u[unit]['steps']:.0f} | {tokens:.2f} | {min(u[unit]['wall']):.1f} | "
              f"{min(u[unit]['cpu']):.1f} | {min(u[unit]['cpu']) / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
