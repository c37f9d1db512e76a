"""Benchmark: the learner's decoder layouts on real turns (`learner.logprobs.sequence_layout`).

    python -m benchmarks layouts [--envs game:Sudoku-v0-easy,game:GuessTheNumber-v0-easy] [--episodes 8]
        [--order sorted|shuffled] [--group-size 1] [--env-option NAME=VALUE ...]

Per environment: SmolLM2 plays `episodes` episodes through the HF engine (GEM's own history: a row per turn);
the turns are cut into micro-batches of `micro_batch_size` as the local learner cuts them for each layout (sorted
by length; for "prefix" by their tokens, which puts turns sharing a prompt together), and every micro-batch runs
through `trust_region_loss` (DPPO binary-TV) with each layout: "padded" (the [B, T] grid with its mask), "rows"
(a forward per row at its own length), "packed" (one sequence, positions restarting per row) and "prefix" (each
prefix a cluster of rows shares once, then their rests). `--order shuffled` cuts every layout's micro-batches from
one seeded random order instead, as stock Oat's plan does (its shuffle, no sort): what the layouts save on rows
that arrive unsorted. `--group-size N` plays N episodes from each seed (a group's samples share their prompt).
Reported: the padded share of the grid's tokens, the tokens "prefix" computes per real token, and seconds per
pass over all micro-batches for forward + backward (training) and for the forward alone (pi_old recompute,
evaluation), the fastest of `reps` round-robin repetitions, one thread. Progress on stderr, the table on stdout.
"""

from __future__ import annotations

import sys
import time
import random
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
import tyro

from benchmarks import packing
from benchmarks.packing import play
from oat_dppo.cli import opt, parse
from oat_dppo.config import assignments
from oat_dppo.learner import collate, trust_region_loss
from oat_dppo.learner.logprobs import LAYOUTS, policy_logprobs
from oat_dppo.trust_region import make_trust_region


@dataclass
class Config(packing.Config):
    """packing's options (model, episodes, budget, prefix, layers, threads, seed) with this benchmark's defaults."""

    envs: str = opt("game:Sudoku-v0-easy,game:GuessTheNumber-v0-easy", "comma-separated environment ids")
    micro_batch_size: int = opt(8, "turns per micro-batch")
    reps: int = opt(2, "timed passes per layout, round-robin (fastest reported)")
    order: Literal["sorted", "shuffled"] = opt(
        "sorted", "micro-batches cut from the turns sorted (by length; for prefix by tokens, as the local learner) "
        "or from one seeded random order for every layout (as stock Oat's plan)")
    group_size: int = opt(1, "episodes played from each start seed (a group's samples of one prompt)")
    env_option: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = opt(
        (), "an environment option NAME=VALUE for every env (repeatable), as main's --env-option")


def measure(cfg: Config, env_id: str, model, tok) -> dict:
    options = assignments(cfg.env_option, "--env-option", example="max_number=50")
    episodes = play(cfg, env_id, model, tok, group_size=cfg.group_size, **options)
    turns = [t for e in episodes if e.error is None for t in e.turns if t.response_ids]
    for i, t in enumerate(turns):
        t.advantage = 1.0 if i % 2 else -1.0
    shuffled = random.Random(cfg.seed).sample(turns, len(turns))

    def cut(key) -> list:
        ordered = sorted(turns, key=key) if cfg.order == "sorted" else shuffled
        return [collate(ordered[i: i + cfg.micro_batch_size], 0) for i in range(0, len(turns), cfg.micro_batch_size)]

    by_length = cut(lambda t: len(t.prompt_ids) + len(t.response_ids))
    by_tokens = cut(lambda t: t.prompt_ids + t.response_ids)
    grid = sum(b.input_ids.numel() for b in by_length)
    real = sum(int(b.attention_mask.sum()) for b in by_length)
    with torch.no_grad():  # what "prefix" computes: each cluster's prefix once, the rests padded to the longest
        prefix_computed = sum(policy_logprobs(model, b, layout="prefix").computed_tokens for b in by_tokens)
    tr = make_trust_region("dppo_binary_tv")
    seconds = {(layout, grad): [] for layout in LAYOUTS for grad in (True, False)}
    for _ in range(cfg.reps):
        for layout in LAYOUTS:
            for grad in (True, False):
                t0 = time.perf_counter()
                for b in by_tokens if layout == "prefix" else by_length:
                    with torch.set_grad_enabled(grad):
                        loss, _ = trust_region_loss(model, b, tr, num_tokens=float(b.num_tokens), layout=layout)
                    if grad:
                        loss.backward()
                model.zero_grad(set_to_none=True)
                seconds[layout, grad].append(time.perf_counter() - t0)
                print(f"  {layout} {'fwd+bwd' if grad else 'fwd'}: {seconds[layout, grad][-1]:.1f} s", file=sys.stderr,
                      flush=True)
    return {"env": env_id, "turns": len(turns), "batches": len(by_length), "padded_share": 1 - real / grid,
            "prefix_tokens": prefix_computed / real,
            "seconds": {k: min(v) for k, v in seconds.items()}}


def main(argv: list[str]) -> int:
    cfg = parse(Config, argv, prog="python -m benchmarks layouts", description=__doc__)
    torch.set_num_threads(cfg.threads)
    from oat_dppo.models import freeze_all_but_top_layers, load_policy

    model, tok = load_policy(cfg.model, seed=cfg.seed)
    if cfg.trainable_layers:
        freeze_all_but_top_layers(model, cfg.trainable_layers)
    model.eval()
    rows = [measure(cfg, env, model, tok) for env in cfg.envs.split(",")]
    order = "sorted by length (prefix: by tokens)" if cfg.order == "sorted" else "in one seeded random order"
    print(f"{cfg.model}, {cfg.episodes} episodes per env ({cfg.group_size} a seed), turns {order} in micro-batches of "
          f"{cfg.micro_batch_size}, top {cfg.trainable_layers} layers trained, {cfg.threads} thread(s), fastest of "
          f"{cfg.reps}\n")
    names = " / ".join(LAYOUTS)
    print(f"| env | turns | micro-batches | padded share | prefix: tokens computed per real token | fwd+bwd s: {names} "
          f"| fwd s: {names} | fwd+bwd, fwd vs padded: {' / '.join(LAYOUTS[1:])} |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["seconds"]
        print(f"| {r['env']} | {r['turns']} | {r['batches']} | {r['padded_share']:.2f} | {r['prefix_tokens']:.2f} | "
              + " / ".join(f"{s[k, True]:.2f}" for k in LAYOUTS) + " | " + " / ".join(f"{s[k, False]:.2f}" for k in LAYOUTS)
              + " | " + " / ".join(f"{s[k, True] / s['padded', True]:.2f}, {s[k, False] / s['padded', False]:.2f}"
                                   for k in LAYOUTS[1:]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
