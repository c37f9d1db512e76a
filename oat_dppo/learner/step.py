"""One micro-batch through the trust region: log pi at the response tokens -> strategy -> aggregated
loss and metrics (`trust_region_loss`), and the metrics of many micro-batches combined
(`MetricAccumulator`). The innermost step of both backends' learner loop."""

from __future__ import annotations

import math

import torch

from oat_dppo.learner.batch import TokenBatch
from oat_dppo.learner.logprobs import policy_logprobs
from oat_dppo.learner.timing import OnTiming, timed
from oat_dppo.trust_region import TrustRegionInputs, aggregate, requirements


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
    on_timing: OnTiming | None = None,
    layout: str | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch: log pi at the response tokens -> trust region -> aggregated loss.

    Shared by the local learner and the Oat learner. `num_tokens` / `num_sequences` are the whole
    mini-batch's normalizers, so that accumulating micro-batches equals one big batch.
    `logits_chunk_tokens`, `layout`: see `policy_logprobs`. `on_timing`: gets the seconds of "forward" and
    "trust_region".
    """
    topk = requirements(trust_region).topk
    with timed(on_timing, "forward"):
        pol = policy_logprobs(model, batch, with_topk=topk > 0, chunk_tokens=logits_chunk_tokens, layout=layout)
    with timed(on_timing, "trust_region"):
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
                sequence_ids=_sequence_ids(batch),
            )
        )
        loss = aggregate(out.loss_terms, batch.response_mask, aggregation, constant_length=constant_length,
                         num_tokens=num_tokens, num_sequences=num_sequences, segment_ids=batch.segment_ids)
    metrics = dict(out.metrics)
    ent = pol.entropy[batch.response_mask]
    metrics["entropy"] = float(ent.mean()) if ent.numel() else math.nan
    # (token-weighted across micro-batches: the whole update's decoder tokens per trained token)
    metrics["decoder_tokens_per_token"] = pol.computed_tokens / ent.numel() if ent.numel() else math.nan
    return loss, metrics


def _sequence_ids(batch: TokenBatch) -> torch.Tensor | None:
    """[B, T] the sequence of each token for the trust region: the row's episode (`sequence_ids`, for strategies
    deciding per episode), else its turn on rows of several turns (`segment_ids`), else None (the row)."""
    if batch.sequence_ids is not None:
        return batch.sequence_ids[:, None].expand_as(batch.response_mask)
    if batch.segment_ids is not None:
        return batch.segment_ids.clamp(min=0)
    return None


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
