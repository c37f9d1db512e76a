"""Rollout throughput of the engines: new tokens per second for one batched call.

    python -m benchmarks engine                          # tiny-qwen3 and smollm2, bs 8, 32 new tokens
    python -m benchmarks engine --models smollm2 --batch 16 64 --engines hf vllm:bfloat16 vllm:float32
    python -m benchmarks engine --models tiny-qwen3 --batch 32 --topk 20

An engine is `hf` (transformers generate on the float32 learner, what `--engine hf` samples with) or
`vllm:DTYPE` (a colocated vLLM in DTYPE, as `--engine vllm --engine-dtype DTYPE`; rows run where vLLM
does). No stop tokens are set; vLLM still stops at the model's EOS, so tokens are counted, not assumed.
Reported: best and median of `--reps` timed calls after one warm-up call, and for vLLM the time of a
full weight sync (every weight, then the prefix-cache reset: what the trainer does after an update).
"""

from __future__ import annotations

import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

import torch

from benchmarks.memory import in_fresh_process
from oat_dppo.cli import fail, opt, parse
from oat_dppo.engine.hf import HFEngine
from oat_dppo.models import load_policy

OBS = (
    "You are playing Guess The Number. I have chosen a number between 1 and 10. After each guess I "
    "will tell you whether the target is higher or lower. Previous guesses: 5 (higher), 8 (lower). "
    "Reply with your next guess in the form \\boxed{N}."
)


def make_engine(spec: str, model, tok, scratch: str, name: str):
    """(engine, seconds to build it, sync seconds or None) for `hf` or `vllm:DTYPE`."""
    if spec == "hf":
        return HFEngine(model, tok, stop_token_ids=[]), 0.0, None
    from oat_dppo.engine.vllm import ColocatedVLLM, VLLMSettings  # noqa: PLC0415 (vLLM rows only)
    from oat_dppo.models import engine_model_source, policy_weights  # noqa: PLC0415

    t0 = time.perf_counter()
    source = engine_model_source(name, model, tok, scratch)
    engine = ColocatedVLLM.launch(source, VLLMSettings(dtype=spec.split(":", 1)[1], sequences=64,
                                                      tokens_per_sequence=512), stop_token_ids=[])
    start_s = time.perf_counter() - t0
    syncs = [engine.sync_weights(policy_weights(model)) for _ in range(3)]
    return engine, start_s, min(syncs)


def bench(name: str, spec: str, batch: int, new_tokens: int, topk: int, reps: int) -> dict:
    model, tok = load_policy(name)
    text = tok.apply_chat_template([{"role": "user", "content": OBS}], tokenize=False, add_generation_prompt=True)
    base = tok(text, add_special_tokens=False).input_ids  # the template already has any BOS
    # slightly different prompt lengths per row, as in a real batch of episodes
    prompts = [base[: len(base) - (i % 4)] for i in range(batch)]
    with tempfile.TemporaryDirectory(prefix="oat_dppo_bench_engine_") as scratch:
        engine, start_s, sync_s = make_engine(spec, model, tok, scratch, name)
        engine.generate(prompts, max_new_tokens=4, topk=topk, seed=0)  # warm-up
        times, tokens = [], []
        for r in range(reps):
            t0 = time.perf_counter()
            gens = engine.generate(prompts, max_new_tokens=new_tokens, topk=topk, seed=r)
            times.append(time.perf_counter() - t0)
            tokens.append(sum(len(g.response_ids) for g in gens))
    rates = [n / t for n, t in zip(tokens, times)]
    return dict(
        model=name,
        engine=spec,
        batch=batch,
        prompt_len=len(base),
        start_s=start_s,
        best_tok_s=max(rates),
        median_tok_s=statistics.median(rates),
        sync_s=sync_s,
    )


ENGINE_SPECS = ("hf", "vllm:bfloat16", "vllm:float32", "vllm:float16")


def default_engines() -> tuple[str, ...]:
    from oat_dppo.engine.vllm import vllm_unavailable  # noqa: PLC0415

    return ("hf",) if vllm_unavailable() else ("hf", "vllm:bfloat16", "vllm:float32")


@dataclass
class Config:
    models: tuple[str, ...] = opt(("tiny-qwen3", "smollm2"), "models to time (`--model` names of the main job)")
    batch: tuple[int, ...] = opt((8,), "prompts per generate call (several: one row each)")
    new_tokens: int = opt(32, "tokens sampled per prompt (no stop tokens; vLLM still stops at EOS)")
    topk: int = opt(0, "K of mu's top-K log-probs recorded per token (0: the sampled token's only)")
    reps: int = opt(3, "timed calls after one warm-up call (best and median reported)")
    threads: int = opt(0, "torch intra-op threads (0: torch's default)")
    engines: Optional[tuple[str, ...]] = opt(
        None, f"engines to time, of {', '.join(ENGINE_SPECS)} (default: hf, and vllm in bf16 and fp32 where it runs)")


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv, prog="python -m benchmarks engine", description=__doc__)
    engines = cfg.engines or default_engines()
    bad = [e for e in engines if e not in ENGINE_SPECS]
    if bad:
        return fail(f"unknown engine {bad[0]!r}; choose from {', '.join(ENGINE_SPECS)}")
    if any(e.startswith("vllm") for e in engines):
        from oat_dppo.engine.vllm import vllm_unavailable  # noqa: PLC0415

        if vllm_unavailable():
            return fail(f"vllm rows need {vllm_unavailable()}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cfg.new_tokens} new tokens, "
          f"topk {cfg.topk}, {platform.processor() or platform.machine()}")
    head = ("model", "engine", "batch", "prompt", "start s", "best tok/s", "median tok/s", "sync s")
    print("{:<12} {:<14} {:>5} {:>6} {:>7} {:>10} {:>12} {:>7}".format(*head))
    for name in cfg.models:
        for spec in engines:
            for batch in cfg.batch:
                args = (name, spec, batch, cfg.new_tokens, cfg.topk, cfg.reps)
                # vLLM rows in a fresh process each: vLLM 0.32 tears down its process groups with an engine,
                # and a third engine in one process failed ("tensor model parallel group is not initialized")
                r = in_fresh_process(bench, *args, timeout=3600) if spec.startswith("vllm") else bench(*args)
                sync = "-" if r["sync_s"] is None else f"{r['sync_s']:.3f}"
                print(f"{r['model']:<12} {r['engine']:<14} {r['batch']:>5} {r['prompt_len']:>6} {r['start_s']:>7.1f} "
                      f"{r['best_tok_s']:>10.0f} {r['median_tok_s']:>12.0f} {sync:>7}", flush=True)
    return 0
