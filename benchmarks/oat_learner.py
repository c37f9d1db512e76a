"""Benchmark: one Oat learning step, stock `PPOLearner` vs the Oat backend's `DPPOLearner`.

    python -m benchmarks oat-learner [--batch 16] [--mb 2] [--words 40] [--hidden 256] [--layers 4]
        [--vocab 0] [--topk 20] [--reps 7] [--warmup 2] [--threads 1]

Same CPU batch (Oat's own `TransitionDataset` collate of real `TransitionData`), same tiny Qwen3,
four learners built by the CPU harness (tests/oat_harness.py: Oat's real learner classes and `_init`
chain, a real DeepSpeed engine (stage 0) from Oat's DeepspeedStrategy, vllm/launchpad import fakes
where missing):

* stock:          Oat's `PPOLearner.learning_step` (recompute of pi_old + ratio clip; the logits
                  head, as the fused head with micro-batch > 1 trains only the head, see
                  docs/dev_oat_cpu.md; tis_c None)
* ppo_clip/recompute: this learner, ratio clip on a recomputed pi_old (MiniRL: runs the recompute)
* dppo_binary_tv: this learner, behavior-anchored (no recompute forward)
* dppo_topk_kl:   this learner, top-K KL with K = --topk (mu's top-K from the batch, pi gathered)

Timing: the fastest of `reps` interleaved repetitions (round-robin, so load drifts hit every
variant alike), one intra-op thread by default (see `benchmarks/trust_region.py`: on a shared 2-core
machine a waiting OpenMP thread stalls each op). Ratios use the process's CPU time, which does not
count the time the process waits for a core that another job holds (wall time is shown too). The
machine load is printed with the table; only ratios measured in one run compare. Targets: dppo_binary_tv <= 0.8 x stock, top-K <= 1.15 x binary.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from oat_dppo.cli import opt, parse

TARGET_BINARY_VS_STOCK = 0.8
TARGET_TOPK_VS_BINARY = 1.15


@dataclass
class Config:
    batch: int = opt(16, "transitions per learning step")
    mb: int = opt(2, "micro-batch size (Oat's train_batch_size_per_device)")
    words: int = opt(40, "prompt and response lengths are drawn from [words / 2, words] words")
    hidden: int = opt(256, "hidden size of the tiny Qwen3 policy")
    layers: int = opt(4, "its number of layers")
    vocab: int = opt(
        0,
        "vocabulary size (0: the byte tokenizer's 259; larger pads the embedding like a real vocabulary)",
    )
    topk: int = opt(20, "K of the top-K strategy timed")
    reps: int = opt(7, "timed repetitions, interleaved across learners (the best counts)")
    warmup: int = opt(2, "untimed repetitions first")
    threads: int = opt(1, "torch intra-op threads")
    seed: int = opt(0, "seed of the synthetic batch and the weights")


def _harness():
    """The CPU harness lives with the tests (it fakes only vllm/launchpad, and only where missing)."""
    tests = Path(__file__).resolve().parents[1] / "tests"
    if not (tests / "oat_harness.py").exists():
        raise SystemExit("the Oat benchmark needs a source checkout (tests/oat_harness.py) and `make setup-oat`")
    if str(tests) not in sys.path:
        sys.path.insert(0, str(tests))
    import oat_harness  # the tests' Oat harness (tests/ on sys.path): only when this benchmark runs

    return oat_harness


def build(cfg: Config):
    H = _harness()  # installs the vllm/launchpad fakes that the Oat imports below need on CPU
    from oat.args import default_args_validation

    from oat_dppo.backends.oat.args import DPPOArgs, finalize
    from oat_dppo.backends.oat.data import DPPOTransitionData
    from oat_dppo.backends.oat.learner import DPPOLearner

    tok = H.byte_tokenizer()
    common = dict(critic_type="drgrpo", num_samples=2, train_batch_size=cfg.batch, train_batch_size_per_device=cfg.mb,
                  rollout_batch_size=cfg.batch, rollout_batch_size_per_device=cfg.batch, generate_max_length=512,
                  learning_rate=1e-6)

    def model():
        m = H.tiny_policy(tok, "qwen3", seed=cfg.seed, hidden=cfg.hidden, layers=cfg.layers, heads=4, kv_heads=2,
                          intermediate=3 * cfg.hidden)
        if cfg.vocab > len(tok):
            torch.manual_seed(cfg.seed)
            m.resize_token_embeddings(cfg.vocab, mean_resizing=False)  # unused rows: the head's [*, V] cost
        return m

    def ours(**kw):
        args = DPPOArgs(**{**H.CPU_ARGS, **common, "env": "rg:arc_1d", **kw})
        finalize(args, world_size=1)
        return H.make_stock_learner(args=default_args_validation(args), learner_cls=DPPOLearner, model=model(),
                                    tokenizer=tok)

    learners = {
        "stock": H.make_stock_learner(dict(common, tis_c=None, use_fused_lm_head=False), model=model(), tokenizer=tok),
        "ppo_clip/recompute": ours(trust_region="ppo_clip", anchor="recompute"),
        "dppo_binary_tv": ours(trust_region="dppo_binary_tv"),
        "dppo_topk_kl": ours(trust_region="dppo_topk_kl", topk=cfg.topk),
    }
    ref = learners["stock"].model

    @torch.no_grad()
    def topk_arrays(i, prompt_ids, response_ids):
        ids = torch.tensor([list(prompt_ids) + list(response_ids)])
        logp = ref.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float().log_softmax(-1)
        top_lp, top_ids = logp.topk(cfg.topk, -1)
        resp = torch.tensor(response_ids)
        inside = (top_ids == resp[:, None]).any(-1)
        ids_out = torch.cat([top_ids, torch.where(inside, -1, resp)[:, None]], 1).numpy().astype(np.int32)
        lp_out = torch.cat([top_lp, torch.where(inside, float("-inf"), logp.gather(1, resp[:, None])[:, 0])[:, None]], 1)
        return dict(topk_ids=ids_out, topk_logprobs=lp_out.numpy().astype(np.float32))

    w = (max(1, cfg.words // 2), cfg.words)
    transitions = H.make_transitions(tok, cfg.batch, num_samples=2, prompt_words=w, response_words=w, behavior=ref,
                                     logprob_offset=-0.05, seed=cfg.seed, transition_cls=DPPOTransitionData,
                                     extra=topk_arrays)
    batches = {name: H.collate(learner, transitions) for name, learner in learners.items()}
    tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in transitions)
    return H, learners, batches, tokens


def run(cfg: Config) -> dict:
    torch.set_num_threads(cfg.threads)
    load_before = os.getloadavg()
    H, learners, batches, tokens = build(cfg)
    names = list(learners)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    with H.cuda_as_cpu():
        for rep in range(cfg.warmup + cfg.reps):
            for n in names:
                np.random.seed(rep)  # the same minibatch order for every variant
                w0, c0 = time.perf_counter(), time.process_time()
                learners[n].learning_step(batches[n])
                if rep >= cfg.warmup:
                    wall[n].append(time.perf_counter() - w0)
                    cpu[n].append(time.process_time() - c0)
    # CPU time of this process (one intra-op thread): time spent descheduled while other jobs use the
    # cores is not counted, so it is far steadier than wall time on a loaded machine.
    rows = {n: dict(best=min(cpu[n]), median=statistics.median(cpu[n]), wall=min(wall[n])) for n in names}
    model = learners["stock"].model.model
    return dict(rows=rows, tokens=tokens, load=(load_before, os.getloadavg()),
                params=sum(p.numel() for p in model.parameters()), vocab=model.config.vocab_size)


def format_table(res: dict, cfg: Config) -> str:
    rows = res["rows"]
    stock, binary = rows["stock"]["best"], rows["dppo_binary_tv"]["best"]
    (b1, b5, b15), (a1, a5, a15) = res["load"]
    lines = [
        f"Oat learning step, B = {cfg.batch} transitions ({res['tokens']} tokens), micro-batch {cfg.mb}, tiny Qwen3 "
        f"{res['params'] / 1e6:.2f} M params (hidden {cfg.hidden}, {cfg.layers} layers, vocab {res['vocab']}), K = {cfg.topk}; "
        f"best of {cfg.reps} interleaved reps (ratios of process CPU time), torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
        f"load average before {b1:.2f} / {b5:.2f} / {b15:.2f}, after {a1:.2f} / {a5:.2f} / {a15:.2f}",
        "",
        "| learner | CPU best (ms) | CPU median (ms) | wall best (ms) | / stock | / dppo_binary_tv | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, r in rows.items():
        target = ""
        if n == "dppo_binary_tv":
            ok = r["best"] / stock <= TARGET_BINARY_VS_STOCK
            target = f"<= {TARGET_BINARY_VS_STOCK} x stock ({'ok' if ok else 'MISSED'})"
        elif n == "dppo_topk_kl":
            ok = r["best"] / binary <= TARGET_TOPK_VS_BINARY
            target = f"<= {TARGET_TOPK_VS_BINARY} x binary ({'ok' if ok else 'MISSED'})"
        lines.append(f"| {n} | {r['best'] * 1e3:.1f} | {r['median'] * 1e3:.1f} | {r['wall'] * 1e3:.1f} | {r['best'] / stock:.2f} | "
                     f"{r['best'] / binary:.2f} | {target} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(Config, argv, prog="python -m benchmarks oat-learner", description=__doc__)
    print(format_table(run(cfg), cfg), flush=True)
    return 0
