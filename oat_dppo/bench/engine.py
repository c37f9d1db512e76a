"""Throughput of HFEngine.generate: new tokens per second for one batched call.

    python -m oat_dppo.bench engine                          # tiny-qwen3 and smollm2, bs 8, 32 new tokens
    python -m oat_dppo.bench engine --models tiny-qwen3 --batch 32 --topk 20

Rows never stop early (stop tokens disabled), so every call produces batch x new_tokens tokens
and numbers are comparable across models. Reported: best and median of `--reps` timed calls after
one warm-up call.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from oat_dppo.cli import opt, parse
from oat_dppo.engine.hf import HFEngine
from oat_dppo.models import load_policy

OBS = (
    "You are playing Guess The Number. I have chosen a number between 1 and 10. After each guess I "
    "will tell you whether the target is higher or lower. Previous guesses: 5 (higher), 8 (lower). "
    "Reply with your next guess in the form \\boxed{N}."
)


def bench(name: str, batch: int, new_tokens: int, topk: int, reps: int) -> dict:
    t0 = time.perf_counter()
    model, tok = load_policy(name)
    load_s = time.perf_counter() - t0
    text = tok.apply_chat_template([{"role": "user", "content": OBS}], tokenize=False, add_generation_prompt=True)
    base = tok(text, add_special_tokens=False).input_ids  # the template already has any BOS
    # slightly different prompt lengths per row, as in a real batch of episodes
    prompts = [base[: len(base) - (i % 4)] for i in range(batch)]
    engine = HFEngine(model, tok, stop_token_ids=[])
    engine.generate(prompts, max_new_tokens=4, topk=topk, seed=0)  # warm-up
    times = []
    for r in range(reps):
        t0 = time.perf_counter()
        gens = engine.generate(prompts, max_new_tokens=new_tokens, topk=topk, seed=r)
        times.append(time.perf_counter() - t0)
        assert sum(len(g.response_ids) for g in gens) == batch * new_tokens
    n = batch * new_tokens
    return dict(
        model=name,
        params_m=sum(p.numel() for p in model.parameters()) / 1e6,
        prompt_len=len(base),
        load_s=load_s,
        best_tok_s=n / min(times),
        median_tok_s=n / statistics.median(times),
        best_s=min(times),
    )


@dataclass
class Config:
    models: tuple[str, ...] = opt(("tiny-qwen3", "smollm2"), "models to time (`--model` names of the main job)")
    batch: int = opt(8, "prompts per generate call")
    new_tokens: int = opt(32, "tokens sampled per prompt (stop tokens disabled: every row runs to the budget)")
    topk: int = opt(0, "K of mu's top-K log-probs recorded per token (0: the sampled token's only)")
    reps: int = opt(3, "timed calls after one warm-up call (best and median reported)")
    threads: int = opt(0, "torch intra-op threads (0: torch's default)")


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv, prog="python -m oat_dppo.bench engine", description=__doc__)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {cfg.batch}, "
          f"{cfg.new_tokens} new tokens, topk {cfg.topk}")
    head = ("model", "params M", "prompt", "load s", "best tok/s", "median tok/s", "call s")
    print("{:<12} {:>8} {:>6} {:>7} {:>10} {:>12} {:>7}".format(*head))
    for name in cfg.models:
        r = bench(name, cfg.batch, cfg.new_tokens, cfg.topk, cfg.reps)
        print(f"{r['model']:<12} {r['params_m']:>8.2f} {r['prompt_len']:>6} {r['load_s']:>7.2f} "
              f"{r['best_tok_s']:>10.0f} {r['median_tok_s']:>12.0f} {r['best_s']:>7.2f}", flush=True)
    return 0
