"""Benchmark: forward + backward of every trust-region strategy on one large batch.

    python -m benchmarks trust-region [--batch 64] [--seq 4096] [--topk 20] [--reps 10] [--threads 1]
                                          [--topk-other 1]

Time and memory are reported as ratios to `pg_is` measured in the same run (the machine is shared and
noisy; only ratios compare). Time is the fastest of `reps` round-robin repetitions, the least
disturbed by other load; one intra-op thread by default, because on a shared 2-core machine OpenMP
threads that wait for a busy core stall every op by a scheduler slice (measured: median 30x the
minimum with 2 threads). Memory: peak RSS above the inputs (each strategy in a fresh process) and the
largest single tensor a strategy allocates, against the [B, T, K+1] top-K input. Top-K inputs carry
pi's mass outside the slots (`topk_other_logp`), as the learner passes them; `--topk-other 0` times
top-K KL from the slot log-probs alone.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch

from benchmarks.memory import AllocationTracker, in_fresh_process, peak_rss_delta
from oat_dppo.cli import opt, parse
from oat_dppo.trust_region import TrustRegionInputs, aggregate, available, make_trust_region

TARGET_BINARY = 1.3
TARGET_TOPK = 3.0


@dataclass
class Config:
    batch: int = opt(64, "sequences (B)")
    seq: int = opt(4096, "tokens per sequence (T)")
    topk: int = opt(20, "K of the top-K strategies (K + 1 slots with the sampled token)")
    reps: int = opt(10, "timed repetitions, round-robin across strategies (best and median reported)")
    warmup: int = opt(3, "untimed repetitions first")
    threads: int = opt(1, "torch intra-op threads")
    seed: int = opt(0, "seed of the synthetic inputs")
    topk_other: int = opt(
        1,
        "1: the inputs carry pi's mass outside the K + 1 slots (topk_other_logp), as the learner's do; 0: the slots alone",
    )


def make_inputs(cfg: Config, with_topk: bool) -> TrustRegionInputs:
    """Synthetic but realistic: mu long-tailed, pi a perturbed mu, top-K slots sorted, sampled token
    outside the top-K in about 10% of positions. Built in place to keep memory transients small."""
    g = torch.Generator().manual_seed(cfg.seed)
    B, T, S = cfg.batch, cfg.seq, cfg.topk + 1
    behavior = torch.empty(B, T).exponential_(1.0, generator=g).neg_()  # log mu, mostly near 0..-3
    logp = (behavior + torch.randn(B, T, generator=g) * 0.05).clamp_(max=0.0).requires_grad_()
    adv = torch.randn(B, 1, generator=g)
    mask = torch.rand(B, T, generator=g) > 0.1
    inputs = TrustRegionInputs(logp=logp, behavior_logp=behavior, advantages=adv, mask=mask)
    if with_topk:
        tb = torch.empty(B, T, S).exponential_(0.5, generator=g).neg_()
        tb, _ = tb.sort(-1, descending=True)
        tb -= tb.logsumexp(-1, keepdim=True)
        tb[..., 0] += -0.1  # leave some tail mass for the "other" bucket
        tl = tb + torch.randn(B, T, S, generator=g) * 0.05
        tl.clamp_(max=0.0)
        valid = torch.ones(B, T, S, dtype=torch.bool)
        valid[..., -1] = torch.rand(B, T, generator=g) < 0.1
        inputs.topk_behavior_logp, inputs.topk_logp, inputs.topk_valid = tb, tl, valid
        if cfg.topk_other:  # pi's tail: 1e-9..1e-2, as the learner computes it from the full row
            inputs.topk_other_logp = torch.empty(B, T).uniform_(math.log(1e-9), math.log(1e-2), generator=g)
    return inputs


def step(tr, inputs: TrustRegionInputs) -> None:
    inputs.logp.grad = None
    out = tr(inputs)
    aggregate(out.loss_terms, inputs.mask).backward()


# Sequence-level variants of the peers' strategies, timed beside every registered name at its defaults.
SEQUENCE_VARIANTS = {"tis:sequence": ("tis", {"level": "sequence"}), "mis:sequence": ("mis", {"level": "sequence"}),
                     "mis:geometric": ("mis", {"level": "geometric"}), "trm:mean": ("trm", {"reduce": "mean"})}
SEQUENCE_LEVEL = ("trm", *SEQUENCE_VARIANTS)  # one decision per sequence: no target, their cost is reported


def build(label: str, cfg: Config):
    name, params = SEQUENCE_VARIANTS.get(label, (label, {}))
    return make_trust_region(name, topk=cfg.topk, **params) if "topk" in name else make_trust_region(name, **params)


def labels() -> list[str]:
    """Every registered strategy (user registrations excluded: names starting with "_"), then the
    sequence-level variants."""
    return [n for n in available() if not n.startswith("_")] + list(SEQUENCE_VARIANTS)


def _peak_rss(name: str, cfg: Config) -> int | None:
    torch.set_num_threads(cfg.threads)
    tr = build(name, cfg)
    return peak_rss_delta(lambda: make_inputs(cfg, tr.needs_topk), lambda x: step(tr, x))


def run(cfg: Config) -> list[dict]:
    torch.set_num_threads(cfg.threads)
    names = labels()
    trs = {n: build(n, cfg) for n in names}
    inputs = {n: make_inputs(cfg, trs[n].needs_topk) for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(cfg.warmup):
        for n in names:
            step(trs[n], inputs[n])
    for _ in range(cfg.reps):  # round-robin, so drifts in machine load hit every strategy alike
        for n in names:
            t0 = time.perf_counter()
            step(trs[n], inputs[n])
            times[n].append(time.perf_counter() - t0)
    rows = []
    for n in names:
        tracker = AllocationTracker()
        with tracker:
            step(trs[n], inputs[n])
        rows.append(dict(name=n, time=min(times[n]), median=statistics.median(times[n]), largest=tracker.largest, allocated=tracker.total,
                         peak=in_fresh_process(_peak_rss, n, cfg)))
    base = next(r for r in rows if r["name"] == "pg_is")
    topk_input = cfg.batch * cfg.seq * (cfg.topk + 1) * 4
    for r in rows:
        r["time_ratio"] = r["time"] / base["time"]
        r["peak_ratio"] = r["peak"] / base["peak"] if r["peak"] is not None and base["peak"] else math.nan
        r["target"] = None if r["name"] in SEQUENCE_LEVEL else TARGET_TOPK if "topk" in r["name"] else TARGET_BINARY
        r["largest_vs_topk_input"] = r["largest"] / topk_input
    return rows


def format_table(rows: list[dict], cfg: Config) -> str:
    mib = 1024 * 1024
    lines = [
        f"trust-region forward+backward, B x T = {cfg.batch} x {cfg.seq}, K = {cfg.topk}, "
        f"best of {cfg.reps}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"top-K {'with' if cfg.topk_other else 'without'} topk_other_logp",
        "",
        "| strategy | time (ms) | median (ms) | time / pg_is | target | peak RSS (MiB) | peak / pg_is | largest tensor (MiB) | largest / [B,T,K+1] input |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["target"] is None:
            target = "none (sequence-level)"
        else:
            target = f"<= {r['target']} ({'ok' if r['time_ratio'] <= r['target'] else 'MISSED'})"
        lines.append(
            f"| {r['name']} | {r['time'] * 1e3:.1f} | {r['median'] * 1e3:.1f} | {r['time_ratio']:.2f} | {target} | "
            f"{(r['peak'] or 0) / mib:.1f} | {r['peak_ratio']:.2f} | {r['largest'] / mib:.1f} | {r['largest_vs_topk_input']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv, prog="python -m benchmarks trust-region", description=__doc__)
    print(format_table(run(cfg), cfg), flush=True)
    return 0
