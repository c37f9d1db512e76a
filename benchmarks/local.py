"""Benchmark: the local backend end to end (HF `generate` rollout + learner update) on real GEM envs.

    python -m benchmarks local [--model tiny-qwen3|smollm2|both] [--env ID[,ID...]] [--episodes 16]
        [--iterations 3] [--warmup 1] [--max-new-tokens 64] [--response-prefix '\\boxed{']
        [--compare-turns 16] [--reps 3] [--threads 1]

For each model x env it builds a `LocalTrainer` (no logging, no eval, no checkpoints), runs `warmup`
untimed iterations, then `iterations` timed ones, and reports three things. `max_new_tokens`
defaults to 64, not the local backend's 256: a SmolLM2 iteration then takes 2-3 minutes on 2 shared
cores (16 episodes; SmolLM2 with the `\\boxed{` prefix plays ~3 turns of GuessTheNumber).

1. Throughput: episodes/s over the iteration wall time, generated tokens/s over the time inside
   `engine.generate`, trained tokens/s (prompt + response tokens, as the trainer's own
   `perf/train_tokens_per_s`) over the learner's update time.
2. Where the iteration time goes, from the trainer's own timings (nothing is patched): its rows'
   `time/generate_s` (inside the engine's generate) and `time/env_s` (the envs' reset and step), and the
   learner's timing hook (`LocalTrainer(on_timing=...)`, `learner.timing`): the forward
   (`policy_logprobs`: model, log-softmax, gather, entropy; pi_old's too), backward, the optimizer (clipping
   + step) and, to explain the rest, collating and the trust region + `aggregate`. The share of the wall
   time outside generate + forward + backward + optimizer is compared with the 10% target.
3. The learner against a bare loop on the same collated micro-batches: the first `compare_turns`
   turns of the last iteration played (`trainer.last_turns`) give the learner's micro-batches and optimizer
   steps (`Learner.prepare`) and one untimed warm-up `update`, then `Learner.update` (seeded shuffle: the
   same batches) vs a minimal
   `forward -> log_softmax gather -> (-logp * adv).mean() -> backward -> optimizer.step()` with the
   same micro-batches per step and the same optimizer. Two bare loops: `bare` runs the LM head on the
   hidden states that predict response tokens only (what the learner does, the fair baseline, used for
   the 90% target) and `bare-full` calls `model(input_ids, attention_mask)` for all [B, T, V] logits.
   Round-robin repetitions, fastest of `reps`, in wall time and in process CPU time. With one thread
   the CPU time is the work itself and barely moves when other jobs take the core away (measured on
   one SmolLM2 micro-batch: wall 16-26 s, CPU 11.9-13.1 s), so its ratio is the steadier one.
   The turns come from the last iteration played (a warm-up one when `iterations` is 0, which skips
   the first two tables: a quick way to rerun only the comparison with more `reps`).

The machine is shared and noisy: compare only ratios measured in one run. One intra-op thread by
default, as in the trust-region benchmark: on a shared 2-core machine OpenMP threads that wait for a
busy core stall every op by a scheduler slice.
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import torch

from oat_dppo.backends.local import LocalTrainer
from oat_dppo.cli import fail, opt, parse
from oat_dppo.config import TrainConfig
from oat_dppo.rundir import RunDir

MODELS = ("tiny-qwen3", "smollm2")
DEFAULT_ENVS = "game:GuessTheNumber-v0-easy,rg:arc_1d"
TARGET_OUTSIDE_SHARE = 0.10  # at most this share of an iteration outside generate + fwd/bwd/optimizer
TARGET_LEARNER_VS_BARE = 0.90  # learner tokens/s at least this fraction of the bare loop's


@dataclass
class Config:
    model: str = opt("both", f"models to time: {', '.join(MODELS)}, a comma-separated list of them, or 'both'")
    env: str = opt(DEFAULT_ENVS, "GEM environment ids, comma-separated")
    episodes: int = opt(16, "episodes per iteration")
    iterations: int = opt(3, "timed iterations per (model, env)")
    warmup: int = opt(1, "untimed iterations first (model load, allocator and kernel warm-up)")
    max_new_tokens: int = opt(64, "response token cap per turn")
    response_prefix: str = opt("\\boxed{", "pre-filled start of every response (part of the prompt)")
    trust_region: str = opt("dppo_binary_tv", "trust region of the learner")
    mini_batch_size: int = opt(16, "turns per optimizer step")
    micro_batch_size: int = opt(4, "turns per forward/backward")
    compare_turns: int = opt(16, "turns in the learner-vs-bare-loop comparison (0: the whole last batch)")
    reps: int = opt(3, "round-robin repetitions of that comparison (the fastest counts; 0: skip it)")
    threads: int = opt(1, "torch intra-op threads (1 is fastest on a shared 2-core machine)")
    seed: int = opt(0, "run seed (episodes, sampling, initial weights of tiny models)")
    engine: Literal["hf", "vllm"] = opt("hf", "rollout engine of the trainer (vllm: where it runs)")
    engine_dtype: Literal["auto", "bfloat16", "float16", "float32"] = opt("auto", "the engine's dtype, as in main")

    def models(self) -> list[str]:
        return list(MODELS) if self.model == "both" else [m.strip() for m in self.model.split(",") if m.strip()]

    def envs(self) -> list[str]:
        return [e.strip() for e in self.env.split(",") if e.strip()]




# ---------------------------------------------------------------------------------------------
# timings reported by the trainer and its learner
# ---------------------------------------------------------------------------------------------

BUCKETS = ("generate", "forward", "backward", "optimizer", "env", "collate", "trust_region")


@dataclass
class Timers:
    """Seconds per bucket: the learner's pieces from its timing hook (`add`) while `active`, the rollout's
    from each iteration's row (`add_row`)."""

    seconds: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in BUCKETS})
    active: bool = False  # warm-up iterations and the learner comparison are not counted

    def add(self, name: str, seconds: float) -> None:
        if self.active:
            self.seconds[name] += seconds

    def add_row(self, row: dict) -> None:
        self.seconds["generate"] += row["time/generate_s"]
        self.seconds["env"] += row["time/env_s"]


# ---------------------------------------------------------------------------------------------
# learner vs a bare loop on the same micro-batches
# ---------------------------------------------------------------------------------------------


def bare_update(model, optimizer, steps: list[list], *, full_logits: bool, device) -> None:
    """The minimal policy-gradient loop the learner is measured against."""
    model.train()
    head = model.get_output_embeddings()
    decoder = model.get_decoder()
    for micro_batches in steps:
        optimizer.zero_grad(set_to_none=True)
        for batch in micro_batches:
            batch = batch.to(device)
            ids, attn, resp = batch.input_ids, batch.attention_mask.long(), batch.response_mask
            b_idx, t_idx = resp.nonzero(as_tuple=True)
            if full_logits:
                logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[b_idx, t_idx - 1]
            else:
                hidden = decoder(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
                logits = head(hidden[b_idx, t_idx - 1])
            logp = logits.float().log_softmax(-1).gather(-1, ids[b_idx, t_idx][:, None])[:, 0]
            (-logp * batch.advantages[b_idx, 0]).mean().backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()


def compare_learner(trainer, turns: list, *, reps: int, seed: int, compare_turns: int = 0) -> dict:
    """Tokens/s of `Learner.update` and of the bare loops on the same micro-batches, fastest of `reps`.

    `Learner.prepare` gives the learner's micro-batches and optimizer steps (its shuffle is seeded, so every
    timed `update` repeats exactly those); one untimed `update` warms up. On CUDA every timed run ends
    with a device synchronization, so that queued kernels count where they were launched."""
    learner = trainer.learner
    if compare_turns:
        turns = turns[:compare_turns]
    batch, plan = learner.prepare(turns, random.Random(seed))
    steps = [[batch.rows(micro) for micro in step] for step in plan]
    learner.update(turns, random.Random(seed))  # warm-up, untimed
    batches = [b for step in steps for b in step]
    processed = sum(int(b.attention_mask.sum()) for b in batches)
    trained = sum(int(b.response_mask.sum()) for b in batches)
    runs: dict[str, Callable[[], Any]] = {
        "learner": lambda: learner.update(turns, random.Random(seed)),
        "bare": lambda: bare_update(trainer.model, learner.optimizer, steps, full_logits=False, device=trainer.device),
        "bare_full": lambda: bare_update(trainer.model, learner.optimizer, steps, full_logits=True, device=trainer.device),
    }
    wall: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    on_cuda = trainer.device.type == "cuda"
    for _ in range(reps):  # round-robin, so load drifts hit every variant alike
        for k, fn in runs.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            if on_cuda:
                torch.cuda.synchronize()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    out = dict(cmp_turns=len(turns), cmp_micro_batches=len(batches), cmp_steps=len(steps),
               cmp_processed_tokens=processed, cmp_trained_tokens=trained)
    for k in runs:
        out[f"cmp_{k}_s"] = min(wall[k])
        out[f"cmp_{k}_median_s"] = statistics.median(wall[k])
        out[f"cmp_{k}_cpu_s"] = min(cpu[k])
        out[f"cmp_{k}_tok_s"] = processed / min(wall[k])
    for k in ("bare", "bare_full"):
        out[f"learner_vs_{k}"] = out[f"cmp_{k}_s"] / out["cmp_learner_s"]
        out[f"learner_vs_{k}_cpu"] = out[f"cmp_{k}_cpu_s"] / out["cmp_learner_cpu_s"]
    return out


# ---------------------------------------------------------------------------------------------
# one model x env
# ---------------------------------------------------------------------------------------------


def make_trainer(model: str, env: str, cfg: Config, run_dir: str, on_timing=None):
    tc = TrainConfig(
        model=model, env=env, response_prefix=cfg.response_prefix, episodes_per_iteration=cfg.episodes,
        iterations=cfg.warmup + cfg.iterations, max_new_tokens=cfg.max_new_tokens, trust_region=cfg.trust_region,
        mini_batch_size=cfg.mini_batch_size, micro_batch_size=cfg.micro_batch_size, seed=cfg.seed,
        threads=cfg.threads, device="cpu", log="none", progress=False, eval_every=0, log_episodes=0,
        engine=cfg.engine, engine_dtype=cfg.engine_dtype,
    )
    return LocalTrainer(tc, RunDir(run_dir), on_timing=on_timing)


def run_one(model: str, env: str, cfg: Config) -> dict:
    timers = Timers()
    with tempfile.TemporaryDirectory(prefix="oat_dppo_bench_local_") as run_dir:
        trainer = make_trainer(model, env, cfg, run_dir, on_timing=timers.add)
        try:
            totals = dict(wall=0.0, episodes=0.0, turns=0.0, gen_tokens=0.0, prompt_tokens=0.0, train_s=0.0, env_s=0.0)
            for it in range(cfg.warmup):
                trainer.train_iteration(it)
            timers.active = True
            for it in range(cfg.warmup, cfg.warmup + cfg.iterations):
                t0 = time.perf_counter()
                row = trainer.train_iteration(it)
                totals["wall"] += time.perf_counter() - t0
                timers.add_row(row)
                turns = trainer.last_turns
                totals["episodes"] += row.get("rollout/episodes", 0.0)
                totals["turns"] += len(turns)
                totals["gen_tokens"] += sum(t.num_tokens for t in turns)
                totals["prompt_tokens"] += sum(len(t.prompt_ids) for t in turns)
                totals["train_s"] += row["time/train_s"]
                totals["env_s"] += row["time/env_s"]
            timers.active = False
            sec = dict(timers.seconds)
            last_turns = trainer.last_turns
            cmp = compare_learner(trainer, last_turns, reps=cfg.reps, seed=cfg.seed,
                                  compare_turns=cfg.compare_turns) if last_turns and cfg.reps > 0 else {}
        finally:
            trainer.close()
    wall = totals["wall"]
    core = sec["generate"] + sec["forward"] + sec["backward"] + sec["optimizer"]
    outside = wall - core
    rest = outside - sec["env"] - sec["collate"] - sec["trust_region"]
    out = dict(
        model=model, env=env, iterations=cfg.iterations, wall=wall, **{f"{k}_s": v for k, v in sec.items()},
        episodes=totals["episodes"], turns=totals["turns"], gen_tokens=totals["gen_tokens"],
        prompt_tokens=totals["prompt_tokens"], train_s=totals["train_s"],
        episodes_per_s=totals["episodes"] / wall if wall else math.nan,
        generated_tok_s=totals["gen_tokens"] / sec["generate"] if sec["generate"] else math.nan,
        trained_tok_s=(totals["gen_tokens"] + totals["prompt_tokens"]) / totals["train_s"] if totals["train_s"] else math.nan,
        outside_s=outside, outside_share=outside / wall if wall else math.nan, rest_s=rest,
    )
    out.update(cmp)
    return out


def run(cfg: Config, progress: Callable[[str], None] | None = None) -> list[dict]:
    torch.set_num_threads(cfg.threads)
    rows = []
    for model in cfg.models():
        for env in cfg.envs():
            if progress:
                progress(f"{model} on {env} ...")
            rows.append(run_one(model, env, cfg))
            gc.collect()  # free one model (and its optimizer state) before the next loads
    return rows


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------


def _ok(good: bool) -> str:
    return "ok" if good else "MISSED"


def format_table(rows: list[dict], cfg: Config) -> str:
    lines = [
        f"local backend, {cfg.episodes} episodes/iteration, {cfg.iterations} timed iterations after {cfg.warmup} warm-up, "
        f"max_new_tokens {cfg.max_new_tokens}, response prefix {cfg.response_prefix!r}, trust region {cfg.trust_region}, "
        f"mini/micro batch {cfg.mini_batch_size}/{cfg.micro_batch_size}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s)",
        "",
        "Throughput (totals over the timed iterations)",
        "",
        "| model | env | turns/episode | response tok/turn | prompt tok/turn | s/iteration | episodes/s | generated tok/s | trained tok/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    timed = [r for r in rows if r["iterations"] > 0]
    for r in timed:
        turns = max(r["turns"], 1)
        lines.append(
            f"| {r['model']} | {r['env']} | {r['turns'] / max(r['episodes'], 1):.2f} | {r['gen_tokens'] / turns:.1f} | "
            f"{r['prompt_tokens'] / turns:.1f} | {r['wall'] / r['iterations']:.2f} | {r['episodes_per_s']:.3f} | "
            f"{r['generated_tok_s']:.1f} | {r['trained_tok_s']:.1f} |"
        )
    lines += [
        "",
        "Share of the iteration wall time (outside = not in generate, forward, backward, optimizer; "
        "env, collate, trust region and rest are its parts)",
        "",
        "| model | env | generate | forward | backward | optimizer | outside | target | env | collate | trust region | rest |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in timed:
        w = r["wall"] or math.nan
        pct = lambda k: f"{100 * r[k] / w:.1f}%"  # noqa: E731
        lines.append(
            f"| {r['model']} | {r['env']} | {pct('generate_s')} | {pct('forward_s')} | {pct('backward_s')} | "
            f"{pct('optimizer_s')} | **{pct('outside_s')}** | <= {100 * TARGET_OUTSIDE_SHARE:.0f}% "
            f"({_ok(r['outside_share'] <= TARGET_OUTSIDE_SHARE)}) | {pct('env_s')} | {pct('collate_s')} | "
            f"{pct('trust_region_s')} | {pct('rest_s')} |"
        )
    cmp_rows = [r for r in rows if "learner_vs_bare" in r]
    if cmp_rows:
        lines += [
            "",
            f"Learner vs bare loop on the same micro-batches (processed = prompt + response tokens; fastest of {cfg.reps} "
            "round-robin repetitions; ratios in wall time, and in process CPU time, the steadier one on a shared machine)",
            "",
            "| model | env | turns | micro-batches | steps | processed tok | learner tok/s | bare tok/s | "
            "learner / bare (wall) | learner / bare (CPU) | target | bare-full tok/s | learner / bare-full (wall) | (CPU) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in cmp_rows:
            ok = _ok(min(r["learner_vs_bare"], r["learner_vs_bare_cpu"]) >= TARGET_LEARNER_VS_BARE)
            lines.append(
                f"| {r['model']} | {r['env']} | {r['cmp_turns']} | {r['cmp_micro_batches']} | {r['cmp_steps']} | "
                f"{r['cmp_processed_tokens']} | {r['cmp_learner_tok_s']:.1f} | {r['cmp_bare_tok_s']:.1f} | "
                f"**{r['learner_vs_bare']:.3f}** | **{r['learner_vs_bare_cpu']:.3f}** | >= {TARGET_LEARNER_VS_BARE} ({ok}) | "
                f"{r['cmp_bare_full_tok_s']:.1f} | {r['learner_vs_bare_full']:.3f} | {r['learner_vs_bare_full_cpu']:.3f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv, prog="python -m benchmarks local", description=__doc__)
    for m in cfg.models():
        if m not in MODELS:
            return fail(f"--model {m!r}: expected one of {', '.join(MODELS)} or both")
    rows = run(cfg, progress=lambda s: print(s, file=sys.stderr, flush=True))
    print(format_table(rows, cfg), flush=True)
    return 0
