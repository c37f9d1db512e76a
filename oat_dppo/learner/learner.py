"""The learner: a rollout batch of turns -> several trust-region policy-gradient updates.

Per rollout batch: `num_ppo_epochs` passes over the turns, each split into mini-batches (one
optimizer step each, the paper's 4 gradient steps per batch is where a trust region matters),
each mini-batch split into micro-batches (gradient accumulation). Behavior-anchored strategies use
the mu recorded at rollout and never run an extra forward pass; anchor="recompute" strategies get
one no-grad pass over the batch before the first update (pi_old).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
import torch

from oat_dppo.agent.types import Turn
from oat_dppo.learner.batch import TokenBatch, collate
from oat_dppo.learner.logprobs import policy_logprobs
from oat_dppo.trust_region import TrustRegionInputs, aggregate


@dataclass
class LearnerConfig:
    learning_rate: float = 1e-5
    num_ppo_epochs: int = 1
    mini_batch_size: int = 16  # turns per optimizer step
    micro_batch_size: int = 4  # turns per forward/backward (gradient accumulation)
    logits_chunk_tokens: int = 4096  # response tokens per checkpointed LM-head block (0: one block)
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    aggregation: str = "token_mean"
    constant_length: int | None = None  # for aggregation "seq_sum_constant_length"
    # Where mu comes from: the log-probs the engine recorded at rollout (the paper's choice), or a
    # recomputed pi_old (what on-policy PPO implementations such as stock Oat without TIS assume).
    behavior: Literal["rollout", "recompute"] = "rollout"


def trust_region_loss(
    model,
    batch: TokenBatch,
    trust_region,
    *,
    aggregation: str = "token_mean",
    constant_length: int | None = None,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
    logits_chunk_tokens: int = 0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch: log pi at the response tokens -> trust region -> aggregated loss.

    Shared by the local learner and the Oat learner. `num_tokens` / `num_sequences` are the whole
    mini-batch's normalizers, so that accumulating micro-batches equals one big batch.
    `logits_chunk_tokens`: see `policy_logprobs`.
    """
    topk = getattr(trust_region, "topk", 0)
    pol = policy_logprobs(model, batch, with_topk=topk > 0, chunk_tokens=logits_chunk_tokens)
    out = trust_region(
        TrustRegionInputs(
            logp=pol.logp,
            behavior_logp=batch.behavior_logp,
            advantages=batch.advantages,
            mask=batch.response_mask,
            old_logp=batch.old_logp,
            topk_behavior_logp=batch.topk_behavior_logp,
            topk_logp=pol.topk_logp,
            topk_valid=batch.topk_valid,
            topk_other_logp=pol.topk_other_logp,
        )
    )
    loss = aggregate(out.loss_terms, batch.response_mask, aggregation, constant_length=constant_length,
                     num_tokens=num_tokens, num_sequences=num_sequences)
    metrics = dict(out.metrics)
    ent = pol.entropy[batch.response_mask]
    metrics["entropy"] = float(ent.mean()) if ent.numel() else math.nan
    return loss, metrics


# Metrics combined across micro-batches by min / max instead of a token-weighted mean.
_MIN_KEYS = ("ratio_min",)
_MAX_KEYS = ("ratio_max", "prob_diff_max")


class MetricAccumulator:
    """Token-weighted means of per-micro-batch metrics (min/max where that is the statistic)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.extremes: dict[str, float] = {}

    def add(self, metrics: dict[str, float], weight: float) -> None:
        for k, v in metrics.items():
            if k in _MIN_KEYS or k in _MAX_KEYS:
                if not math.isnan(v):
                    op = min if k in _MIN_KEYS else max
                    self.extremes[k] = op(self.extremes.get(k, v), v)
            elif not math.isnan(v) and weight > 0:
                self.sums[k] = self.sums.get(k, 0.0) + v * weight
                self.weights[k] = self.weights.get(k, 0.0) + weight

    def result(self) -> dict[str, float]:
        out = {k: self.sums[k] / self.weights[k] for k in self.sums}
        out.update(self.extremes)
        return out


class Learner:
    def __init__(self, model, trust_region, config: LearnerConfig, *, pad_id: int, device: str | torch.device = "cpu"):
        self.model = model
        self.trust_region = trust_region
        self.config = config
        self.pad_id = pad_id
        self.device = torch.device(device)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
        self.topk = getattr(trust_region, "topk", 0)
        self.needs_old_logp = bool(getattr(trust_region, "needs_old_logp", False)) or config.behavior == "recompute"
        self.forward_passes = 0  # counted so tests can check behavior-anchored runs never recompute

    # -- public ------------------------------------------------------------------------------------
    def update(self, turns: Sequence[Turn], rng: random.Random) -> dict[str, float]:
        """Train on `turns` (advantages already assigned); returns the update's metrics."""
        cfg = self.config
        turns = [t for t in turns if t.response_ids]
        if not turns:
            return {"optimizer_steps": 0.0, "train_tokens": 0.0}
        t_start = time.perf_counter()
        self.model.train()
        if self.needs_old_logp:
            self._recompute_old_logprobs(turns)
        acc = MetricAccumulator()
        steps, tokens, grad_norms, losses = 0, 0, [], []
        order = list(range(len(turns)))
        for _ in range(cfg.num_ppo_epochs):
            rng.shuffle(order)
            for start in range(0, len(order), cfg.mini_batch_size):
                mini = [turns[i] for i in order[start : start + cfg.mini_batch_size]]
                loss, grad_norm, n_tok = self._optimizer_step(mini, acc)
                losses.append(loss)
                grad_norms.append(grad_norm)
                tokens += n_tok
                steps += 1
        self.model.eval()
        out = acc.result()
        out.update(
            loss=float(np.mean(losses)),
            grad_norm=float(np.mean(grad_norms)),
            optimizer_steps=float(steps),
            train_tokens=float(tokens),
            train_seconds=time.perf_counter() - t_start,
        )
        return out

    # -- internals ---------------------------------------------------------------------------------
    def _micro_batches(self, turns: Sequence[Turn]) -> list[list[Turn]]:
        # Sorting by length inside a mini-batch keeps padding (wasted compute) small.
        by_len = sorted(turns, key=lambda t: len(t.prompt_ids) + len(t.response_ids))
        m = self.config.micro_batch_size
        return [by_len[i : i + m] for i in range(0, len(by_len), m)]

    def _optimizer_step(self, mini: Sequence[Turn], acc: MetricAccumulator) -> tuple[float, float, int]:
        cfg = self.config
        n_tokens = sum(len(t.response_ids) for t in mini)
        n_seqs = len(mini)
        self.optimizer.zero_grad(set_to_none=True)
        total_loss = 0.0
        for micro in self._micro_batches(mini):
            batch = collate(micro, self.pad_id, self.topk).to(self.device)
            if cfg.behavior == "recompute":
                batch.behavior_logp = batch.old_logp
            loss, metrics = trust_region_loss(
                self.model, batch, self.trust_region, aggregation=cfg.aggregation,
                constant_length=cfg.constant_length, num_tokens=n_tokens, num_sequences=n_seqs,
                logits_chunk_tokens=cfg.logits_chunk_tokens,
            )
            self.forward_passes += 1
            loss.backward()
            total_loss += float(loss.detach())
            acc.add(metrics, float(batch.num_tokens))
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf"))
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:  # a non-finite gradient would destroy the weights; skip the step and report it
            acc.add({"skipped_steps": 1.0}, 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        return total_loss, float(grad_norm), n_tokens

    @torch.no_grad()
    def _recompute_old_logprobs(self, turns: Sequence[Turn]) -> None:
        """pi_old for anchor="recompute": one no-grad forward over the batch, before any update."""
        for micro in self._micro_batches(turns):
            batch = collate(micro, self.pad_id, 0).to(self.device)
            logp = policy_logprobs(self.model, batch, with_entropy=False,
                                   chunk_tokens=self.config.logits_chunk_tokens).logp
            self.forward_passes += 1
            for b, turn in enumerate(micro):
                p, r = len(turn.prompt_ids), len(turn.response_ids)
                turn.old_logprobs = logp[b, p : p + r].float().cpu().numpy()
