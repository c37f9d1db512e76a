"""Divergences between the rollout policy mu and the trained policy pi (paper section 4.4, appendix C).

All functions take log-probabilities, work in float32 log space, never return NaN or a negative
value, and treat probabilities below 1e-30 as 1e-30 (so a zero probability gives a large, finite
divergence). Each is a lower bound of the next (appendix C, data processing):
binary <= top-K <= full, for TV and for KL(mu || pi).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from oat_dppo.trust_region.inputs import LOG_EPS

_LOG_HALF = -math.log(2.0)


def log1mexp(x: Tensor) -> Tensor:
    """log(1 - exp(x)) for x <= 0, accurate at both ends (Maechler 2012); -inf at x = 0."""
    return torch.where(x > _LOG_HALF, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def binary_tv(behavior_logp: Tensor, logp: Tensor) -> Tensor:
    """Eq. 13: D_TV^Bin = |mu(a_t) - pi(a_t)|, the TV between (p, 1 - p) Bernoullis. Shape of inputs."""
    return (behavior_logp.float().clamp(max=0).exp() - logp.float().clamp(max=0).exp()).abs()


def binary_kl(behavior_logp: Tensor, logp: Tensor) -> Tensor:
    """Eq. 14: KL(Bern(mu(a_t)) || Bern(pi(a_t))) = mu log(mu/pi) + (1-mu) log((1-mu)/(1-pi))."""
    lmu = behavior_logp.float().clamp(LOG_EPS, 0.0)
    lpi = logp.float().clamp(LOG_EPS, 0.0)
    l1mu = log1mexp(lmu).clamp(min=LOG_EPS)  # log(1 - mu)
    l1pi = log1mexp(lpi).clamp(min=LOG_EPS)  # log(1 - pi)
    kl = lmu.exp() * (lmu - lpi) + l1mu.exp() * (l1mu - l1pi)
    return kl.clamp(min=0.0)


def _topk_masses(
    topk_behavior_logp: Tensor, topk_logp: Tensor, topk_valid: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Slot probabilities [..., S] and the 'other' bucket masses [...] of mu and pi."""
    lmu = topk_behavior_logp.float().clamp(max=0.0)  # [..., S]
    lpi = topk_logp.float().clamp(max=0.0)  # [..., S]
    if topk_valid is not None:
        neg_inf = torch.full((), float("-inf"), device=lmu.device)
        lmu = torch.where(topk_valid, lmu, neg_inf)
        lpi = torch.where(topk_valid, lpi, neg_inf)
    mu = lmu.exp()  # [..., S], 0 on unused slots and -inf entries
    pi = lpi.exp()
    other_mu = (1.0 - mu.sum(-1)).clamp(min=0.0)  # [...]
    other_pi = (1.0 - pi.sum(-1)).clamp(min=0.0)
    return lmu, lpi, mu, pi, torch.stack([other_mu, other_pi])


def topk_tv(topk_behavior_logp: Tensor, topk_logp: Tensor, topk_valid: Tensor | None = None) -> Tensor:
    """Eq. 15: 1/2 (sum_{a in A'} |mu(a) - pi(a)| + |mu(other) - pi(other)|) over A' = TopK(mu) ∪ {a_t}.

    Inputs are [..., S] log-probs on the S slots of A' (unused slots marked by `topk_valid` or -inf
    in both); the result has shape [...].
    """
    _, _, mu, pi, other = _topk_masses(topk_behavior_logp, topk_logp, topk_valid)
    return 0.5 * ((mu - pi).abs().sum(-1) + (other[0] - other[1]).abs())


def topk_kl(topk_behavior_logp: Tensor, topk_logp: Tensor, topk_valid: Tensor | None = None) -> Tensor:
    """Eq. 16: sum_{a in A' ∪ {other}} p^mu(a) log(p^mu(a) / p^pi(a)) = KL(mu || pi) on the reduced space."""
    lmu, lpi, mu, _, other = _topk_masses(topk_behavior_logp, topk_logp, topk_valid)
    # mu = 0 slots (unused, or -inf from the engine) contribute 0; pi = 0 is floored at 1e-30.
    head = torch.where(mu > 0, mu * (lmu - lpi.clamp(min=LOG_EPS)), torch.zeros((), device=mu.device))
    other_mu, other_pi = other[0], other[1]
    log_other_mu = other_mu.clamp(min=1e-30).log()
    log_other_pi = other_pi.clamp(min=1e-30).log()
    tail = torch.where(other_mu > 0, other_mu * (log_other_mu - log_other_pi), torch.zeros((), device=mu.device))
    return (head.sum(-1) + tail).clamp(min=0.0)


def full_tv(behavior_logp: Tensor, logp: Tensor) -> Tensor:
    """D_TV(mu || pi) = 1/2 sum_a |mu(a) - pi(a)| over the last (vocabulary) dim of [..., V] log-probs."""
    return 0.5 * (behavior_logp.float().exp() - logp.float().exp()).abs().sum(-1)


def full_kl(behavior_logp: Tensor, logp: Tensor) -> Tensor:
    """D_KL(mu || pi) = sum_a mu(a) (log mu(a) - log pi(a)) over the last dim of [..., V] log-probs."""
    lmu = behavior_logp.float()
    lpi = logp.float().clamp(min=LOG_EPS)
    mu = lmu.exp()
    terms = torch.where(mu > 0, mu * (lmu - lpi), torch.zeros((), device=mu.device))
    return terms.sum(-1).clamp(min=0.0)
