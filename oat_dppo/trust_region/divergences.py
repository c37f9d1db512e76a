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

# Log-probabilities below this are treated as this value inside divergences, so that a zero
# probability gives a large, finite divergence instead of inf/NaN (exp(-69.08) = 1e-30).
LOG_EPS = -69.07755278982137
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


def _chunk_rows(n_rows: int, slots: int, device: torch.device) -> int:
    """Rows per chunk: temporaries stay in cache on CPU (~128k elements), few launches on GPU."""
    elements = 1 << 17 if device.type == "cpu" else 1 << 22
    return max(1, min(n_rows, elements // max(slots, 1)))


def topk_divergence(
    kind: str,
    topk_behavior_logp: Tensor,
    topk_logp: Tensor,
    topk_valid: Tensor | None = None,
) -> Tensor:
    """Top-K TV or KL (`kind` "tv" / "kl") of [..., S] slot log-probs, computed in row chunks.

    Chunking keeps every temporary small (no tensor of the input's size is allocated) and lets the
    ~10 elementwise passes run from cache: 4x faster than whole-tensor ops on CPU. Log-probs are
    clamped into [log 1e-30, 0] (-inf is a zero probability); unused slots (`topk_valid` False) and
    NaN slots count as absent.
    """
    if kind not in ("tv", "kl"):
        raise ValueError(f"kind must be 'tv' or 'kl', got {kind!r}")
    S = topk_behavior_logp.shape[-1]
    lead = topk_behavior_logp.shape[:-1]
    a_all = topk_behavior_logp.detach().reshape(-1, S)
    b_all = topk_logp.detach().reshape(-1, S)
    v_all = topk_valid.reshape(-1, S) if topk_valid is not None else None
    out = torch.empty(a_all.shape[0], dtype=torch.float32, device=a_all.device)
    rows = _chunk_rows(a_all.shape[0], S, a_all.device)
    for i in range(0, a_all.shape[0], rows):
        a, b = a_all[i : i + rows], b_all[i : i + rows]  # [R, S] log mu, log pi
        v = v_all[i : i + rows] if v_all is not None else None
        chunk = _topk_chunk(kind, a, b, v)  # [R]
        nan_rows = chunk.isnan()
        if nan_rows.any():  # rare: a NaN slot; drop NaN slots in those rows only
            a, b = a[nan_rows], b[nan_rows]
            ok = ~(a.isnan() | b.isnan())
            chunk[nan_rows] = _topk_chunk(kind, a.nan_to_num(0.0), b.nan_to_num(0.0), ok if v is None else ok & v[nan_rows])
        out[i : i + rows] = chunk
    return out.view(lead)


def _other_mass_float64(logp: Tensor, valid: Tensor | None) -> Tensor:
    """[R] the mass outside the slots, 1 - sum_s exp(logp[:, s]), summed in float64.

    In float32, 1 - (a sum near 1) is off by up to ~S x 6e-8. TV does not notice; KL's log does
    once a tail is that small (the property tests found top-K KL above the full KL: pi's tail of
    1.5e-8 rounded to 0). In float64 the tail is exact for the given float32 log-probs.
    """
    p = logp.double().exp()  # [R, S]
    if valid is not None:
        p.mul_(valid)
    return (1.0 - p.sum(-1)).clamp_(min=0.0).float()


def _topk_chunk(kind: str, a: Tensor, b: Tensor, valid: Tensor | None) -> Tensor:
    """[R] divergence of one chunk of [R, S] slot log-probs (see `topk_divergence`)."""
    a = a.float().clamp(LOG_EPS, 0.0)  # [R, S]
    b = b.float().clamp(LOG_EPS, 0.0)
    mu = a.exp()  # [R, S]
    if valid is not None:  # absent slots weigh 0 (values there are finite after the clamp)
        mu.mul_(valid)
    if kind == "tv":
        pi = b.exp()  # [R, S]
        if valid is not None:
            pi.mul_(valid)
        other_mu = (1.0 - mu.sum(-1)).clamp_(min=0.0)  # [R] the "other" bucket
        other_pi = (1.0 - pi.sum(-1)).clamp_(min=0.0)
        return 0.5 * (mu.sub_(pi).abs_().sum(-1) + (other_mu - other_pi).abs_())
    other_mu = _other_mass_float64(a, valid)  # [R] the "other" bucket, summed in float64
    other_pi = _other_mass_float64(b, valid)
    head = torch.einsum("rs,rs->r", mu, a.sub_(b))  # sum_a mu (log mu - log pi)
    tail = torch.xlogy(other_mu, other_mu) - other_mu * other_pi.clamp_(min=1e-30).log()
    return (head + tail).clamp_(min=0.0)


def topk_tv(topk_behavior_logp: Tensor, topk_logp: Tensor, topk_valid: Tensor | None = None) -> Tensor:
    """Eq. 15: 1/2 (sum_{a in A'} |mu(a) - pi(a)| + |mu(other) - pi(other)|) over A' = TopK(mu) ∪ {a_t}.

    Inputs are [..., S] log-probs on the S slots of A' (unused slots marked by `topk_valid`, or -inf
    in both); the result has shape [...]. The paper's eq. 15 sums over A'; the "other" bucket is
    included here as in appendix C's partition, which is what makes binary <= top-K <= full hold.
    """
    return topk_divergence("tv", topk_behavior_logp, topk_logp, topk_valid)


def topk_kl(topk_behavior_logp: Tensor, topk_logp: Tensor, topk_valid: Tensor | None = None) -> Tensor:
    """Eq. 16: sum_{a in A' ∪ {other}} p^mu(a) log(p^mu(a) / p^pi(a)) = KL(mu || pi) on the reduced space."""
    return topk_divergence("kl", topk_behavior_logp, topk_logp, topk_valid)


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
