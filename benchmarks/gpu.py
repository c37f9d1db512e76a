"""The single-GPU path measured: rollout, weight sync, learner, and the training-inference mismatch.

    python -m benchmarks gpu                               # SmolLM2, prints Markdown tables
    python -m benchmarks gpu --out docs/benchmarks_gpu.md  # and writes them, device named

1. Rollout tokens/s at each `--prompts` x `--new-tokens`: the colocated vLLM engine (`--engine
   vllm`: requests built, mu and the top-K extracted into arrays), bare `vllm.LLM.generate` on the
   very same requests (same seeds, so the same tokens), and the HF engine (transformers `generate`
   on the learner's fp32 model). Targets: >= 0.9x bare vLLM; >= 5x the HF engine at 512 prompts.
2. Weight sync: load every learner weight into vLLM and reset its prefix cache (best and median of
   `--reps`), as a share of a measured training iteration. Target: < 2%.
3. Learner: `LocalTrainer` iterations with `--engine vllm` on `--env` (the issue's probe setting by
   default) at each `--micro-batches` size: seconds per iteration split into generate / update /
   sync, and the learner's tokens/s against a bare forward + backward + optimizer loop on the same
   micro-batches (`bench local`'s comparison). Target: >= 0.9x.
4. Mismatch on the same sampled tokens (`bench mismatch`'s table, each row in a fresh process, one
   vLLM per process): vLLM bf16 / fp32 -> learner fp32 / bf16, and HF engine copies in bf16 / fp16 /
   fp32: mean, p99 and max |pi - mu|, the share of tokens above 0.05, and the top-K (K = `--topk`) TV.

Sections 1-2 share one process (one vLLM + the learner's model), section 3 runs in another, each
mismatch row in its own: vLLM keeps GPU memory and global state for the life of a process.
"""

from __future__ import annotations

import math
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

import torch

from oat_dppo.backends.local import LocalTrainer
from benchmarks import mismatch
from benchmarks.local import compare_learner
from benchmarks.memory import in_fresh_process
from benchmarks.mismatch import colocated_vllm, device_name, sample_prompts
from oat_dppo.cli import fail, parse
from oat_dppo.config import TrainConfig
from oat_dppo.engine import vllm as vllm_engine
from oat_dppo.engine.hf import HFEngine
from oat_dppo.models import load_policy, policy_weights
from oat_dppo.rundir import RunDir

TARGET_VS_BARE = 0.9
TARGET_VS_HF = 5.0
TARGET_SYNC_SHARE = 0.02
TARGET_LEARNER_VS_BARE = 0.9


@dataclass
class Config:
    """python -m benchmarks gpu: rollout, weight sync, learner and mismatch on one GPU."""

    model: str = "smollm2"
    """Policy (any `--model` of the main job)."""
    prompts: tuple[int, ...] = (64, 512)
    """Rollout batch sizes (prompts per generate call)."""
    new_tokens: int = 128
    """Tokens sampled per prompt in the rollout and mismatch sections (stop tokens still end a response)."""
    topk: int = 20
    """K of the top-K log-probs the engine records (rollout with top-K, and the top-K TV of the mismatch table)."""
    mismatch_prompts: int = 64
    """Prompts in each mismatch row."""
    env: str = "game:GuessTheNumber-v0-easy"
    """Environment of the learner section."""
    episodes: int = 64
    """Episodes per iteration in the learner section."""
    learner_new_tokens: int = 6
    """Response budget per turn in the learner section (with the `\\boxed{` prefix every turn is a guess)."""
    micro_batches: tuple[int, ...] = (4, 16, 64)
    """Micro-batch sizes of the learner section (mini-batch: --episodes, one optimizer step per iteration)."""
    iterations: int = 3
    """Timed iterations per micro-batch size (after one warm-up iteration)."""
    reps: int = 3
    """Repetitions of each timed call (the best counts; median shown too)."""
    gpu_memory_utilization: float = 0.3
    """vLLM's share of the GPU in every section."""
    enforce_eager: bool = False
    """vLLM without CUDA graphs (as `--vllm-enforce-eager`): faster start, slower decoding."""
    device: str = "cuda"
    """Torch device of the learner (the CPU test of this benchmark uses cpu with a stand-in vLLM)."""
    fresh_processes: bool = True
    """Run each section (and each mismatch row) in its own process (off: in this one; tests)."""
    sections: tuple[str, ...] = ("rollout", "learner", "mismatch")
    """Which sections to run."""
    out: str | None = None
    """Also write the tables to this Markdown file (with the device and versions)."""


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[int], Any], reps: int, device: torch.device) -> tuple[list[float], Any]:
    """Seconds of `fn(rep)` for each rep (after one untimed warm-up call), and the last result."""
    out = fn(-1)
    times = []
    for r in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        out = fn(r)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times, out


def _learner(cfg: Config, dtype: torch.dtype = torch.float32):
    model, tok = load_policy(cfg.model, dtype=dtype)
    return model.to(torch.device(cfg.device)).eval(), tok


def _colocated(cfg: Config, model, tok, scratch: str):
    return colocated_vllm(cfg.model, model, tok, scratch, dtype="bfloat16",
                          gpu_memory_utilization=cfg.gpu_memory_utilization, enforce_eager=cfg.enforce_eager,
                          topk=cfg.topk)


# ---------------------------------------------------------------------------------------------
# 1-2: rollout throughput and weight sync
# ---------------------------------------------------------------------------------------------


def rollout_section(cfg: Config) -> dict:
    device = torch.device(cfg.device)
    model, tok = _learner(cfg)
    with tempfile.TemporaryDirectory(prefix="oat_dppo_bench_gpu_") as scratch:
        t0 = time.perf_counter()
        engine = _colocated(cfg, model, tok, scratch)
        start_s = time.perf_counter() - t0
        hf = HFEngine(model, tok)
        rows = []
        for n in cfg.prompts:
            for topk in dict.fromkeys((0, cfg.topk)):
                prompts = sample_prompts(tok, n)

                def ours(rep, prompts=prompts, topk=topk):
                    return engine.generate(prompts, cfg.new_tokens, topk, seed=rep + 1)

                def bare(rep, prompts=prompts, topk=topk):
                    requests, params = engine.engine.requests(prompts, cfg.new_tokens, topk, seed=rep + 1)
                    return engine.llm.generate(requests, sampling_params=params, use_tqdm=False)

                def hf_engine(rep, prompts=prompts, topk=topk):
                    return hf.generate(prompts, cfg.new_tokens, topk, seed=rep + 1)

                t_ours, g_ours = _timed(ours, cfg.reps, device)
                t_bare, g_bare = _timed(bare, cfg.reps, device)
                tokens = sum(len(g.response_ids) for g in g_ours)
                bare_tokens = sum(len(o.outputs[0].token_ids) for o in g_bare)
                row = dict(prompts=n, topk=topk, tokens=tokens, ours_tok_s=tokens / min(t_ours),
                           ours_median_tok_s=tokens / statistics.median(t_ours),
                           bare_tok_s=bare_tokens / min(t_bare), same_tokens=tokens == bare_tokens)
                if topk == 0 or n == min(cfg.prompts):  # HF at top-K only once (it is slow)
                    t_hf, g_hf = _timed(hf_engine, max(1, cfg.reps - 1), device)
                    row["hf_tok_s"] = sum(len(g.response_ids) for g in g_hf) / min(t_hf)
                rows.append(row)
        sync_full, _ = _timed(lambda r: engine.sync_weights(policy_weights(model)), cfg.reps, device)
        n_weights = sum(p.numel() for p in model.parameters())
    return dict(rollout=rows, sync_s=sync_full, start_s=start_s, params=n_weights)


# ---------------------------------------------------------------------------------------------
# 3: the learner inside real iterations
# ---------------------------------------------------------------------------------------------


def learner_section(cfg: Config) -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="oat_dppo_bench_gpu_") as run_dir:
        tc = TrainConfig(
            model=cfg.model, env=cfg.env, engine="vllm", device=cfg.device, response_prefix="\\boxed{",
            max_new_tokens=cfg.learner_new_tokens, episodes_per_iteration=cfg.episodes,
            mini_batch_size=cfg.episodes, micro_batch_size=min(cfg.micro_batches), trust_region="dppo_binary_tv",
            learning_rate=1e-5, vllm_gpu_memory_utilization=cfg.gpu_memory_utilization,
            vllm_enforce_eager=cfg.enforce_eager, iterations=1 + cfg.iterations * len(cfg.micro_batches),
            log="none", progress=False, eval_every=0, log_episodes=0,
        )
        trainer = LocalTrainer(tc, RunDir(run_dir))
        try:
            it = 0
            trainer.train_iteration(it)  # warm-up: allocator, kernels, engine caches
            it += 1
            for mb in cfg.micro_batches:
                trainer.learner.config.micro_batch_size = mb
                times = {k: [] for k in ("iteration", "generate", "train", "sync")}
                turns_seen: list = []
                for _ in range(cfg.iterations):
                    row = trainer.train_iteration(it)
                    it += 1
                    for k in times:
                        times[k].append(row[f"time/{k}_s"])
                    turns_seen = trainer.last_turns
                cmp = compare_learner(trainer, turns_seen, reps=cfg.reps, seed=0) if turns_seen else {}
                rows.append(dict(micro_batch=mb, turns=len(turns_seen),
                                 **{f"{k}_s": statistics.median(v) for k, v in times.items()}, **cmp))
        finally:
            trainer.close()
    return dict(learner=rows)


# ---------------------------------------------------------------------------------------------
# 4: the mismatch table
# ---------------------------------------------------------------------------------------------

def mismatch_config(cfg: Config) -> mismatch.Config:
    return mismatch.Config(model=cfg.model, rows=mismatch.VLLM_ROWS + mismatch.HF_ROWS, prompts=cfg.mismatch_prompts,
                           new_tokens=cfg.new_tokens, topk=cfg.topk, device=cfg.device,
                           gpu_memory_utilization=cfg.gpu_memory_utilization, enforce_eager=cfg.enforce_eager,
                           fresh_processes=cfg.fresh_processes)


# ---------------------------------------------------------------------------------------------
# running and reporting
# ---------------------------------------------------------------------------------------------


def _call(cfg: Config, fn: Callable[..., Any], *args: Any) -> Any:
    if not cfg.fresh_processes:
        return fn(cfg, *args)
    return in_fresh_process(fn, cfg, *args, timeout=3600)


def run(cfg: Config, progress: Callable[[str], None] = lambda s: None) -> dict:
    results: dict[str, Any] = {}
    if "rollout" in cfg.sections:
        progress("rollout and weight sync ...")
        results.update(_call(cfg, rollout_section))
    if "learner" in cfg.sections:
        progress("learner iterations ...")
        results.update(_call(cfg, learner_section))
    if "mismatch" in cfg.sections:
        results["mismatch"] = mismatch.run(mismatch_config(cfg), progress)
    return results


def _ok(good: bool) -> str:
    return "ok" if good else "MISSED"


def _versions() -> str:
    parts = [f"Python {platform.python_version()}", f"torch {torch.__version__}"]
    for dist in ("vllm", "transformers"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} (not installed)")
    return ", ".join(parts)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def format_tables(results: dict, cfg: Config) -> str:
    lines = [f"Device: **{device_name(cfg.device)}**; {_versions()}; commit {_commit()}; model {cfg.model}; "
             f"vLLM gpu_memory_utilization {cfg.gpu_memory_utilization}, enforce_eager {cfg.enforce_eager}.", ""]
    if "rollout" in results:
        lines += [
            f"Rollout: tokens/s of one generate call ({cfg.new_tokens} new tokens per prompt; best of {cfg.reps}; "
            f"vLLM bf16, HF engine fp32). vLLM started in {results['start_s']:.1f} s.",
            "",
            "| prompts | top-K | tokens | --engine vllm tok/s | bare vLLM tok/s | vllm / bare | target | "
            "HF engine tok/s | vllm / HF | target |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in results["rollout"]:
            vs_bare = r["ours_tok_s"] / r["bare_tok_s"]
            hf = r.get("hf_tok_s")
            vs_hf = r["ours_tok_s"] / hf if hf else math.nan
            hf_target = f">= {TARGET_VS_HF:g} ({_ok(vs_hf >= TARGET_VS_HF)})" if hf and r["prompts"] >= 512 else ""
            lines.append(
                f"| {r['prompts']} | {r['topk']} | {r['tokens']} | {r['ours_tok_s']:,.0f} | {r['bare_tok_s']:,.0f} | "
                f"**{vs_bare:.2f}** | >= {TARGET_VS_BARE} ({_ok(vs_bare >= TARGET_VS_BARE)}) | "
                f"{f'{hf:,.0f}' if hf else '-'} | {f'**{vs_hf:.1f}**' if hf else '-'} | {hf_target} |"
            )
        sync = results["sync_s"]
        lines += ["", f"Weight sync ({results['params'] / 1e6:.0f} M parameters, every weight, then the prefix-cache "
                  f"reset): best {1e3 * min(sync):.1f} ms, median {1e3 * statistics.median(sync):.1f} ms."]
    if "learner" in results:
        lines += [
            "",
            f"Learner: {cfg.episodes} episodes of {cfg.env} per iteration (`\\boxed{{` prefix, {cfg.learner_new_tokens} "
            f"new tokens, one optimizer step), --engine vllm; medians of {cfg.iterations} iterations; learner vs a bare "
            f"forward + backward + optimizer loop on the same micro-batches (best of {cfg.reps}).",
            "",
            "| micro-batch | s/iteration | generate s | update s | sync s | sync share | target | learner tok/s | "
            "bare tok/s | learner / bare | target |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in results["learner"]:
            share = r["sync_s"] / r["iteration_s"] if r["iteration_s"] else math.nan
            ratio = r.get("learner_vs_bare", math.nan)
            lines.append(
                f"| {r['micro_batch']} | {r['iteration_s']:.2f} | {r['generate_s']:.2f} | {r['train_s']:.2f} | "
                f"{r['sync_s']:.3f} | {100 * share:.2f}% | < {100 * TARGET_SYNC_SHARE:.0f}% "
                f"({_ok(share < TARGET_SYNC_SHARE)}) | {r.get('cmp_learner_tok_s', math.nan):,.0f} | "
                f"{r.get('cmp_bare_tok_s', math.nan):,.0f} | **{ratio:.2f}** | >= {TARGET_LEARNER_VS_BARE} "
                f"({_ok(ratio >= TARGET_LEARNER_VS_BARE)}) |"
            )
    if "mismatch" in results:
        lines += ["", *mismatch.format_table(results["mismatch"], mismatch_config(cfg))]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv, prog="python -m benchmarks gpu", description=__doc__)
    bad = [s for s in cfg.sections if s not in ("rollout", "learner", "mismatch")]
    if bad:
        return fail(f"--sections {' '.join(bad)}: expected rollout, learner or mismatch")
    why = vllm_engine.vllm_unavailable()
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        why = ("a CUDA GPU, which this machine lacks (vLLM on a CPU: python -m benchmarks engine, "
               "bench mismatch, bench local --engine vllm)")
    if why:
        return fail(f"bench gpu needs {why}")
    results = run(cfg, progress=lambda s: print(s, file=sys.stderr, flush=True))
    text = format_tables(results, cfg)
    print(text, flush=True)
    if cfg.out:
        Path(cfg.out).write_text(text + "\n")
    return 0


__all__ = ["Config", "format_tables", "learner_section", "main", "rollout_section", "run"]
