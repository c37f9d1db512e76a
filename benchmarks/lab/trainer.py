"""The training loop: rollout from the engine (mu), group advantages, then `grad_steps` Adam steps of
the eq. 23 gradient through the public trust-region API. One row of metrics per iteration."""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch

from benchmarks.lab.config import SimConfig
from benchmarks.lab.mismatch import InferenceEngine
from benchmarks.lab.policy import TinyLM
from benchmarks.lab.task import HiddenAnswerTask
from oat_dppo.trust_region import TrustRegionInputs, aggregate, make_trust_region

# Trust-region metrics averaged over the gradient steps of an iteration (NaN-aware).
TR_METRICS = (
    "kept_frac",
    "kept_frac_pos",
    "kept_frac_neg",
    "prob_diff_mean",
    "prob_diff_max",
    "binary_tv_mean",
    "ratio_max",
    "truncated_frac",
    "masked_mu_mean",
    "bad_update_frac",
    "kl_k3",
    "nonfinite_frac",
)


def _nanmean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def run_simulation(
    cfg: SimConfig,
    strategy: str,
    params: dict[str, Any] | None = None,
    seed: int = 0,
    progress: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Train one policy with one trust region; returns one metrics dict per iteration.

    The seed fixes everything: the initial policy, the hidden answers, sampling and mismatch noise.
    """
    torch.set_num_threads(1)
    params = dict(params or {})
    tr = make_trust_region(strategy, **params)
    needs_old = getattr(tr, "anchor", "behavior") == "recompute"

    gen = torch.Generator().manual_seed(seed)
    policy = TinyLM(cfg, gen)
    task = HiddenAnswerTask(cfg, policy, gen)
    engine = InferenceEngine(cfg, gen)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)

    P, G = cfg.prompts_per_batch, cfg.group_size
    B, T = P * G, cfg.seq_len
    mask_full = torch.ones(B, T, dtype=torch.bool)
    rows: list[dict] = []
    diverged = False
    for it in range(cfg.iterations):
        t0 = time.perf_counter()
        if diverged:  # parameters went non-finite: the run is dead, record it as such
            rows.append({**rows[-1], "iteration": it, "reward": 0.0, "diverged": 1.0, "wall_s": 0.0})
            continue
        prompts = torch.randint(cfg.n_problems, (P,), generator=gen).repeat_interleave(G)
        engine.sync(policy)
        tokens, mu_logp = engine.rollout(prompts, policy.bos)
        rewards = task.reward(prompts, tokens)
        adv = HiddenAnswerTask.group_advantages(rewards, G)

        with torch.no_grad():
            old_logp, old_all = policy.logprobs(prompts, tokens)
            mismatch = (old_logp.exp() - mu_logp.exp()).abs()  # pure training-inference mismatch, before any update
            entropy = -(old_all.exp() * old_all).sum(-1).mean().item()
            answer_logp = old_all.gather(-1, task.answers[prompts][..., None]).squeeze(-1)
        if cfg.minibatch:
            perm = torch.randperm(B, generator=gen)
            chunks = [perm[i :: cfg.grad_steps] for i in range(cfg.grad_steps)]
        else:
            chunks = [torch.arange(B)] * cfg.grad_steps

        tr_rows: list[dict] = []
        masked_ent, grad_norms = [], []
        for idx in chunks:
            logp, logp_all = policy.logprobs(prompts[idx], tokens[idx])
            inputs = TrustRegionInputs(
                logp=logp,
                behavior_logp=mu_logp[idx],
                advantages=adv[idx, None],
                mask=mask_full[idx],
                old_logp=old_logp[idx] if needs_old else None,
            )
            out = tr(inputs)
            loss = aggregate(out.loss_terms, mask_full[idx], cfg.aggregation)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            opt.step()
            grad_norms.append(float(gn))
            tr_rows.append(out.metrics)
            with torch.no_grad():
                blocked = ~out.keep & (adv[idx, None] != 0)
                if blocked.any():
                    lp = logp_all.detach()[blocked]
                    masked_ent.append(float(-(lp.exp() * lp).sum(-1).mean()))
        if not all(torch.isfinite(p).all() for p in policy.parameters()):
            diverged = True

        row = {
            "iteration": it,
            "reward": rewards.mean().item(),
            "reward_all_right": (rewards == 1.0).float().mean().item(),
            "mismatch": mismatch.mean().item(),
            "mismatch_max": mismatch.max().item(),
            "entropy": entropy,
            "answer_prob": answer_logp.exp().mean().item(),
            "masked_entropy_mean": _nanmean(masked_ent),
            "grad_norm": _nanmean(grad_norms),
            "weight_norm": math.sqrt(sum(float((p.detach() ** 2).sum()) for p in policy.parameters())),
            "diverged": float(diverged),
        }
        for k in TR_METRICS:
            row[k] = _nanmean([m.get(k, math.nan) for m in tr_rows])
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows
