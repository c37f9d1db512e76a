"""Diagnostics every strategy reports, over trained tokens only.

Zero-advantage tokens carry no gradient and are never masked, so they are left out of the kept
fractions' denominators (otherwise a batch of ties would look "fully kept").
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from oat_dppo.trust_region.inputs import PreparedBatch

# Section 5.3: an update on a negative sample that lowers the token's probability by more than this.
BAD_UPDATE_GAP = 0.5


@torch.no_grad()
def trust_region_metrics(
    p: PreparedBatch, keep: Tensor, C: float, divergence: Tensor | None = None
) -> dict[str, float]:
    """Batch metrics of one trust-region call (all Python floats; NaN where undefined).

    kept_frac{,_pos,_neg}: kept share of tokens with A != 0 (A > 0, A < 0).
    prob_diff_{mean,max}: |pi - mu|, the paper's training-inference mismatch curve.
    binary_tv_mean, binary_kl_mean: eqs. 13-14 against mu.
    ratio_{min,mean,max}: r = pi / mu. truncated_frac: share of tokens with r > C.
    masked_mu_mean: mean mu of masked tokens (figure 6, middle).
    bad_update_frac: share of tokens with A < 0 and mu - pi > 0.5 (section 5.3).
    kl_k3: the k3 estimate of KL(mu || pi) from tokens sampled by mu: r - 1 - log r.
    nonfinite_frac: share of trained positions excluded for a NaN/inf input.
    divergence_mean: mean of the strategy's own divergence, when it has one.
    """
    valid = p.valid  # [B, T]
    adv = p.advantages
    mu = p.behavior_logp.exp()  # [B, T]
    pi = p.logp.exp()
    ratio = p.ratio
    zero = torch.zeros((), device=valid.device)

    pos = valid & (adv > 0)
    neg = valid & (adv < 0)
    informative = pos | neg
    masked = valid & ~keep
    diff = (pi - mu).abs()

    # One stacked reduction, one host sync.
    sums = torch.stack(
        [
            valid.sum(),
            informative.sum(),
            (informative & keep).sum(),
            pos.sum(),
            (pos & keep).sum(),
            neg.sum(),
            (neg & keep).sum(),
            masked.sum(),
            p.nonfinite.sum(),
            (valid | p.nonfinite).sum(),
        ]
    ).float()
    fsums = torch.stack(
        [
            torch.where(valid, diff, zero).sum(),
            torch.where(valid, p.binary_tv, zero).sum(),
            torch.where(valid, p.binary_kl, zero).sum(),
            torch.where(valid, ratio, zero).sum(),
            (valid & (ratio > C)).sum().float(),
            torch.where(masked, mu, zero).sum(),
            (neg & (mu - pi > BAD_UPDATE_GAP)).sum().float(),
            torch.where(valid, ratio - 1.0 - p.log_ratio, zero).sum(),
            torch.where(valid, divergence, zero).sum() if divergence is not None else zero,
            torch.where(valid, diff, zero).max() if valid.any() else zero,
            torch.where(valid, ratio, torch.full((), math.inf, device=valid.device)).min(),
            torch.where(valid, ratio, zero).max(),
        ]
    )
    (n_valid, n_inf, n_inf_keep, n_pos, n_pos_keep, n_neg, n_neg_keep, n_masked, n_nonfinite, n_trained) = sums.tolist()
    (s_diff, s_tv, s_kl, s_ratio, n_trunc, s_masked_mu, n_bad, s_k3, s_div, max_diff, min_ratio, max_ratio) = fsums.tolist()

    def frac(num: float, den: float, empty: float) -> float:
        return num / den if den > 0 else empty

    def mean(total: float) -> float:
        return total / n_valid if n_valid > 0 else math.nan

    metrics = {
        "kept_frac": frac(n_inf_keep, n_inf, 1.0),
        "kept_frac_pos": frac(n_pos_keep, n_pos, 1.0),
        "kept_frac_neg": frac(n_neg_keep, n_neg, 1.0),
        "prob_diff_mean": mean(s_diff),
        "prob_diff_max": max_diff if n_valid > 0 else math.nan,
        "binary_tv_mean": mean(s_tv),
        "binary_kl_mean": mean(s_kl),
        "ratio_min": min_ratio if n_valid > 0 else math.nan,
        "ratio_mean": mean(s_ratio),
        "ratio_max": max_ratio if n_valid > 0 else math.nan,
        "truncated_frac": frac(n_trunc, n_valid, 0.0),
        "masked_mu_mean": frac(s_masked_mu, n_masked, math.nan),
        "bad_update_frac": frac(n_bad, n_valid, 0.0),
        "kl_k3": mean(s_k3),
        "nonfinite_frac": frac(n_nonfinite, n_trained, 0.0),
        "num_tokens": n_valid,
    }
    if divergence is not None:
        metrics["divergence_mean"] = mean(s_div)
    return metrics
