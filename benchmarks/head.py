"""Benchmark: the learner's LM head in one block vs in checkpointed blocks (`--logits-chunk-tokens`).

    python -m benchmarks head [--vocab 49152] [--hidden 576] [--tokens 2048] [--chunks 0,256,1024]

One training forward + backward of `trust_region_loss` (dppo_binary_tv) on a batch whose response
tokens dominate, with a one-layer Qwen3 of the given vocabulary and hidden size (defaults: SmolLM2's),
so that the head is most of the work. Reported as ratios to the one-block run (`0`) measured in the
same invocation: peak RSS above the inputs (each setting in a fresh process), the largest single
tensor allocated, and process CPU time (fastest of `reps` round-robin repetitions, one thread; the
machine is shared, CPU time is the steadier measure). Progress goes to stderr, the table to stdout.
Expected: memory falls about as chunk / tokens (the [tokens, V] float32 logits and log-softmax are
the largest tensors), time rises by about one extra head forward (the recompute in backward).
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from oat_dppo.agent import Turn
from benchmarks.memory import AllocationTracker, in_fresh_process, peak_rss_delta
from oat_dppo.cli import fail, opt, parse
from oat_dppo.learner import collate, trust_region_loss
from oat_dppo.trust_region import make_trust_region

TARGET_TIME = 1.35  # one extra head forward on top of forward + backward (~3 head matmuls)


@dataclass
class Config:
    vocab: int = opt(49152, "vocabulary size V (SmolLM2 49152, Qwen3 151936)")
    hidden: int = opt(576, "hidden size H (SmolLM2 576)")
    tokens: int = opt(2048, "response tokens in the micro-batch (N): the head computes [N, V] logits")
    sequences: int = opt(4, "sequences the response tokens are split over")
    prompt: int = opt(64, "prompt tokens per sequence")
    chunks: str = opt(
        "0,256,1024",
        "comma-separated --logits-chunk-tokens values to compare; 0 (one block) is the baseline",
    )
    reps: int = opt(3, "timed repetitions, round-robin across settings (best reported)")
    warmup: int = opt(1, "untimed repetitions first")
    threads: int = opt(1, "torch intra-op threads")
    seed: int = opt(0, "seed of the model and the batch")


def build(cfg: Config):
    """(model, batch, trust region): a one-layer Qwen3 and a batch of random prompts and responses."""
    torch.manual_seed(cfg.seed)
    config = Qwen3Config(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=2 * cfg.hidden,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=cfg.hidden // 4,
                         tie_word_embeddings=True, max_position_embeddings=cfg.prompt + cfg.tokens,
                         sliding_window=None)
    model = Qwen3ForCausalLM(config).float()
    rng = random.Random(cfg.seed)
    per_seq = cfg.tokens // cfg.sequences
    turns = [
        Turn(prompt_ids=[rng.randrange(cfg.vocab) for _ in range(cfg.prompt)],
             response_ids=[rng.randrange(cfg.vocab) for _ in range(per_seq)],
             behavior_logprobs=np.full(per_seq, -math.log(cfg.vocab), dtype=np.float32), reward=0.0, done=True,
             truncated=False, well_formed=True, finish_reason="length", advantage=rng.choice([-1.0, 1.0]))
        for _ in range(cfg.sequences)
    ]
    return model, collate(turns, pad_id=0), make_trust_region("dppo_binary_tv")


def step(model, batch, tr, chunk: int) -> None:
    model.zero_grad(set_to_none=True)
    loss, _ = trust_region_loss(model, batch, tr, logits_chunk_tokens=chunk)
    loss.backward()


def _peak_rss(cfg: Config, chunk: int) -> int | None:
    torch.set_num_threads(cfg.threads)
    model, batch, tr = build(cfg)
    step(model, batch, tr, chunk)  # gradients allocated: the peak then counts the step alone
    return peak_rss_delta(lambda: None, lambda _: step(model, batch, tr, chunk))


def parse_chunks(text: str) -> list[int]:
    try:
        chunks = sorted({int(c) for c in text.split(",") if c.strip()})
    except ValueError:
        raise ValueError(f"--chunks: comma-separated integers, got {text!r}") from None
    if not chunks or chunks[0] < 0:
        raise ValueError(f"--chunks: integers >= 0, got {text!r}")
    return chunks if chunks[0] == 0 else [0, *chunks]  # the one-block baseline always runs


def run(cfg: Config) -> list[dict]:
    chunks = parse_chunks(cfg.chunks)  # bad input fails before any work
    torch.set_num_threads(cfg.threads)
    model, batch, tr = build(cfg)
    cpu: dict[int, list[float]] = {c: [] for c in chunks}
    wall: dict[int, list[float]] = {c: [] for c in chunks}
    n_steps = (cfg.warmup + cfg.reps + 2) * len(chunks)  # + allocation tracking + fresh-process peak
    done = 0

    def progress(what: str, seconds: float) -> None:
        nonlocal done
        done += 1
        print(f"[{done}/{n_steps}] {what}: {seconds:.1f} s", file=sys.stderr, flush=True)

    for i in range(cfg.warmup):
        for c in chunks:
            t0 = time.perf_counter()
            step(model, batch, tr, c)
            progress(f"warm-up {i + 1}, chunk {c}", time.perf_counter() - t0)
    for i in range(cfg.reps):  # round-robin: load drifts hit every setting alike
        for c in chunks:
            t0, c0 = time.perf_counter(), time.process_time()
            step(model, batch, tr, c)
            cpu[c].append(time.process_time() - c0)
            wall[c].append(time.perf_counter() - t0)
            progress(f"rep {i + 1}, chunk {c}", wall[c][-1])
    rows = []
    for c in chunks:
        t0 = time.perf_counter()
        tracker = AllocationTracker()
        with tracker:
            step(model, batch, tr, c)
        progress(f"allocations, chunk {c}", time.perf_counter() - t0)
        t0 = time.perf_counter()
        peak = in_fresh_process(_peak_rss, cfg, c)
        progress(f"peak RSS in a fresh process, chunk {c}", time.perf_counter() - t0)
        rows.append(dict(chunk=c, cpu=min(cpu[c]), wall=min(wall[c]), largest=tracker.largest, peak=peak))
    base = rows[0]
    for r in rows:
        r["cpu_ratio"] = r["cpu"] / base["cpu"]
        r["peak_ratio"] = r["peak"] / base["peak"] if r["peak"] is not None and base["peak"] else math.nan
        r["largest_ratio"] = r["largest"] / base["largest"]
    return rows


def format_table(rows: list[dict], cfg: Config, n_tokens: int) -> str:
    mib = 1024 * 1024
    lines = [
        f"LM head forward+backward (dppo_binary_tv), N = {n_tokens} response tokens, V = {cfg.vocab}, "
        f"H = {cfg.hidden}, best of {cfg.reps}, torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
        f"one [N, V] float32 tensor = {n_tokens * cfg.vocab * 4 / mib:.0f} MiB",
        "",
        "| logits chunk | CPU (ms) | wall (ms) | CPU / one block | target | peak RSS (MiB) | peak / one block "
        "| largest tensor (MiB) | largest / one block |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = "one block (0)" if r["chunk"] == 0 else str(r["chunk"])
        verdict = "ok" if r["cpu_ratio"] <= TARGET_TIME else "MISSED"
        target = "" if r["chunk"] == 0 else f"<= {TARGET_TIME} ({verdict})"
        lines.append(
            f"| {name} | {r['cpu'] * 1e3:.0f} | {r['wall'] * 1e3:.0f} | {r['cpu_ratio']:.2f} | {target} | "
            f"{(r['peak'] or 0) / mib:.0f} | {r['peak_ratio']:.2f} | {r['largest'] / mib:.0f} | {r['largest_ratio']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv, prog="python -m benchmarks head", description=__doc__)
    try:
        parse_chunks(cfg.chunks)  # bad input fails before any work
    except ValueError as e:
        return fail(str(e))
    n_tokens = (cfg.tokens // cfg.sequences) * cfg.sequences
    print(format_table(run(cfg), cfg, n_tokens), flush=True)
    return 0
