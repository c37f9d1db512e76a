"""The training-inference mismatch on the same sampled tokens: mu (what an engine recorded) against
the learner's pi (a teacher-forced forward of the learner's model over the same prompt + response).

    python -m benchmarks mismatch                       # every row this machine can run, SmolLM2
    python -m benchmarks mismatch --rows hf:bfloat16:float32 --prompts 16

A row `ENGINE:ENGINE_DTYPE:LEARNER_DTYPE` samples with ENGINE (hf: transformers generate on a copy of
the policy in ENGINE_DTYPE, as `--engine hf --engine-dtype`; vllm: a colocated vLLM, GPU only) and
scores the tokens with the learner in LEARNER_DTYPE: mean, p99 and max |pi - mu|, the share of
tokens above 0.05, and the top-K TV (eq. 15) on mu's top-K. Each row runs in a fresh process (vLLM
keeps GPU memory and global state for the life of one). `bench gpu` prints the same table.
"""

from __future__ import annotations

import math
import platform
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from oat_dppo.agent.types import Turn
from benchmarks.memory import in_fresh_process
from oat_dppo.cli import fail, opt, parse
from oat_dppo.engine import vllm as vllm_engine
from oat_dppo.engine.base import Generation, pad_token_id, stop_token_ids
from oat_dppo.engine.hf import HFEngine
from oat_dppo.envs import render_prompt
from oat_dppo.learner.batch import collate
from oat_dppo.learner.logprobs import policy_logprobs
from oat_dppo.models import engine_model_source, load_policy, policy_weights
from oat_dppo.trust_region.divergences import topk_tv

# |pi - mu| above this on a token counts as a large disagreement (the table's "share > 0.05").
LARGE_DIFF = 0.05


def as_turns(prompts: Sequence[Sequence[int]], gens: Sequence[Generation]) -> list[Turn]:
    """One trainable turn per generation with a response (reward and advantage unused)."""
    return [
        Turn(prompt_ids=list(p), response_ids=list(g.response_ids), behavior_logprobs=g.logprobs, reward=0.0,
             done=True, truncated=False, well_formed=True, finish_reason=g.finish_reason, topk_ids=g.topk_ids,
             topk_logprobs=g.topk_logprobs)
        for p, g in zip(prompts, gens) if g.response_ids
    ]


@torch.no_grad()
def measure_mismatch(model, tokenizer, prompts: Sequence[Sequence[int]], gens: Sequence[Generation], *,
                     topk: int = 0, micro_batch: int = 16) -> dict[str, float]:
    """|pi - mu| over every sampled token: mean, p99, max, share above `LARGE_DIFF`; with `topk`,
    the top-K TV (eq. 15) between mu and pi on mu's recorded top-K set: mean and max."""
    turns = as_turns(prompts, gens)
    device = next(model.parameters()).device
    diffs, tvs = [], []
    was_training = model.training
    model.eval()
    try:
        for i in range(0, len(turns), micro_batch):
            batch = collate(turns[i : i + micro_batch], pad_token_id(tokenizer), topk).to(device)
            pol = policy_logprobs(model, batch, with_topk=topk > 0, with_entropy=False)
            m = batch.response_mask  # [B, T]
            diffs.append((pol.logp[m].exp() - batch.behavior_logp[m].exp()).abs().float().cpu())  # [N]
            if topk:
                tvs.append(topk_tv(batch.topk_behavior_logp[m], pol.topk_logp[m], batch.topk_valid[m]).cpu())  # [N]
    finally:
        model.train(was_training)
    if not diffs:
        return {"tokens": 0.0}
    d = torch.cat(diffs)
    out = {
        "tokens": float(d.numel()),
        "mean": float(d.mean()),
        "p99": float(torch.quantile(d.double(), 0.99)),
        "max": float(d.max()),
        "share_large": float((d > LARGE_DIFF).double().mean()),
        "topk_tv_mean": math.nan,
        "topk_tv_max": math.nan,
    }
    if tvs:
        tv = torch.cat(tvs)
        out.update(topk_tv_mean=float(tv.mean()), topk_tv_max=float(tv.max()))
    return out


_TASKS = (
    "I have chosen a number between 1 and {hi}. Guess it; answer with \\boxed{{N}}.",
    "Compute {a} + {b} step by step and put the result within \\boxed{{}}.",
    "Write a short poem about the number {a}.",
    "List {b} prime numbers larger than {a}, then explain how you checked them.",
    "Explain in two sentences why the sky looks blue at noon and red at sunset ({a}).",
)


def sample_prompts(tokenizer, n: int, template: str = "chatml") -> list[list[int]]:
    """`n` varied chat prompts (token ids) for throughput and mismatch measurements."""
    out = []
    for i in range(n):
        text = _TASKS[i % len(_TASKS)].format(hi=10 + i, a=3 * i + 7, b=i % 9 + 2)
        out.append(list(tokenizer(render_prompt(template, text, tokenizer), add_special_tokens=False)["input_ids"]))
    return out


# ---------------------------------------------------------------------------------------------
# the benchmark: one row per engine / dtype pair
# ---------------------------------------------------------------------------------------------

# vllm-head32: vLLM with its LM head in float32 (`--vllm-head-dtype float32`, vLLM 0.32's head_dtype)
VLLM_ROWS = ("vllm:bfloat16:float32", "vllm-head32:bfloat16:float32", "vllm:bfloat16:bfloat16", "vllm:float32:float32",
             "vllm:float32:bfloat16")
ENGINES = ("hf", "vllm", "vllm-head32")
HF_ROWS = ("hf:bfloat16:float32", "hf:float16:float32", "hf:bfloat16:bfloat16", "hf:float32:float32")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class Config:
    """python -m benchmarks mismatch: |pi - mu| on the same sampled tokens, engine by engine."""

    model: str = opt("smollm2", "Policy (any `--model` of the main job).")
    rows: tuple[str, ...] = opt((), "Rows ENGINE:ENGINE_DTYPE:LEARNER_DTYPE (default: the vLLM rows where vLLM runs, "
                                    "then every hf row).")
    prompts: int = opt(64, "Prompts per row.")
    new_tokens: int = opt(128, "Tokens sampled per prompt (stop tokens still end a response).")
    topk: int = opt(20, "K of the top-K TV.")
    device: str = opt("auto", "Torch device of both engine and learner (auto: cuda where there is one).")
    gpu_memory_utilization: float = opt(0.3, "vLLM rows: vLLM's share of the GPU.")
    enforce_eager: bool = opt(False, "vLLM rows: no CUDA graphs (faster start, slower decoding).")
    threads: int = opt(0, "CPU threads (0: torch's default).")
    fresh_processes: bool = opt(True, "Each row in its own process (off: in this one; tests).")
    out: str | None = opt(None, "Also write the table to this Markdown file (with the device and versions).")

    def resolved_device(self) -> str:
        return ("cuda" if torch.cuda.is_available() else "cpu") if self.device == "auto" else self.device


def default_rows() -> tuple[str, ...]:
    return (() if vllm_engine.vllm_unavailable() else VLLM_ROWS) + HF_ROWS


def check_row(row: str) -> str | None:
    """Why `row` is not ENGINE:ENGINE_DTYPE:LEARNER_DTYPE, or None."""
    parts = row.split(":")
    if len(parts) != 3 or parts[0] not in ENGINES or not set(parts[1:]) <= set(DTYPES):
        return (f"{row!r}: expected ENGINE:ENGINE_DTYPE:LEARNER_DTYPE, ENGINE {', '.join(ENGINES)}, "
                f"dtypes {', '.join(DTYPES)}")
    return None


def colocated_vllm(model_name: str, model, tok, scratch: str, *, dtype: str, gpu_memory_utilization: float,
                   enforce_eager: bool, topk: int, head_dtype: str | None = None) -> vllm_engine.ColocatedVLLM:
    """A colocated vLLM in `dtype` holding the learner `model`'s weights (prefix cache reset)."""
    settings = vllm_engine.VLLMSettings(gpu_memory_utilization=gpu_memory_utilization, dtype=dtype,
                                        enforce_eager=enforce_eager, max_logprobs=max(20, topk), seed=0,
                                        head_dtype=head_dtype)
    engine = vllm_engine.ColocatedVLLM.launch(engine_model_source(model_name, model, tok, scratch), settings,
                                              stop_token_ids=stop_token_ids(tok, model.generation_config))
    engine.sync_weights(policy_weights(model))
    return engine


def measure_row(cfg: Config, row: str) -> dict:
    """One row: sample `cfg.prompts` x `cfg.new_tokens` with the row's engine, score with its learner."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    kind, engine_dtype, learner_dtype = row.split(":")
    device = torch.device(cfg.resolved_device())
    model, tok = load_policy(cfg.model, dtype=getattr(torch, learner_dtype))
    model.to(device).eval()
    prompts = sample_prompts(tok, cfg.prompts)
    with tempfile.TemporaryDirectory(prefix="oat_dppo_bench_mismatch_") as scratch:
        if kind == "hf":  # a separate copy, as --engine hf --engine-dtype builds it (same dtype: same numbers)
            sampler, _ = load_policy(cfg.model, dtype=getattr(torch, engine_dtype))
            engine = HFEngine(sampler.to(device).eval(), tok)
            engine.sync_weights(policy_weights(model))
        else:
            engine = colocated_vllm(cfg.model, model, tok, scratch, dtype=engine_dtype,
                                    gpu_memory_utilization=cfg.gpu_memory_utilization,
                                    enforce_eager=cfg.enforce_eager, topk=cfg.topk,
                                    head_dtype="float32" if kind == "vllm-head32" else None)
        gens = engine.generate(prompts, cfg.new_tokens, cfg.topk, seed=123)
    stats = measure_mismatch(model, tok, prompts, gens, topk=cfg.topk)
    return dict(engine=kind, engine_dtype=engine_dtype, learner_dtype=learner_dtype, **stats)


def run(cfg: Config, progress: Callable[[str], None] = lambda s: None) -> list[dict]:
    results = []
    for row in cfg.rows or default_rows():
        progress(f"mismatch: {row} ...")
        results.append(in_fresh_process(measure_row, cfg, row, timeout=3600) if cfg.fresh_processes
                       else measure_row(cfg, row))
    return results


_SHORT = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


def format_table(results: Sequence[dict], cfg: Config) -> list[str]:
    lines = [
        f"Mismatch on the same sampled tokens ({cfg.prompts} prompts x up to {cfg.new_tokens} tokens; top-K TV with "
        f"K = {cfg.topk}). HF rows sample with a copy of the policy in the engine's dtype, as `--engine hf "
        f"--engine-dtype`; in the learner's dtype that is the learner's own model.",
        "",
        "| engine -> learner | tokens | mean abs(pi - mu) | p99 | max | share > 0.05 | top-K TV mean | top-K TV max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        engine = {"hf": "HF", "vllm": "vLLM", "vllm-head32": "vLLM"}[r["engine"]]
        head = " (fp32 head)" if r["engine"] == "vllm-head32" else ""
        name = f"{engine} {_SHORT[r['engine_dtype']]}{head} -> HF {_SHORT[r['learner_dtype']]}"
        lines.append(
            f"| {name} | {r['tokens']:.0f} | {r['mean']:.2g} | {r['p99']:.2g} | {r['max']:.2g} | "
            f"{100 * r['share_large']:.2f}% | {r['topk_tv_mean']:.2g} | {r['topk_tv_max']:.2g} |"
        )
    return lines


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's model name and the threads torch uses."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        cpu = ""
    return f"{cpu or platform.processor() or platform.machine() or 'CPU'}, {torch.get_num_threads()} threads"


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv, prog="python -m benchmarks mismatch", description=__doc__)
    for row in cfg.rows:
        if problem := check_row(row):
            return fail(f"--rows {problem}")
    if any(r.startswith("vllm") for r in cfg.rows) and vllm_engine.vllm_unavailable():
        return fail(f"vllm rows need {vllm_engine.vllm_unavailable()}")
    if cfg.prompts < 1 or cfg.new_tokens < 1 or cfg.topk < 1:
        return fail("--prompts, --new-tokens and --topk must be >= 1")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    results = run(cfg, progress=lambda s: print(s, file=sys.stderr, flush=True))
    text = "\n".join([f"Device: **{device_name(cfg.resolved_device())}** ({cfg.resolved_device()}); torch "
                      f"{torch.__version__}; model {cfg.model}; `python -m benchmarks mismatch`.", "",
                      *format_table(results, cfg)])
    print(text, flush=True)
    if cfg.out:
        Path(cfg.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
