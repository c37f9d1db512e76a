"""Divergences between the rollout policy mu and the trained policy pi (paper section 4.4, appendix C).

All functions take log-probabilities, work in float32 log space, never return NaN or a negative
value, and treat probabilities below 1e-30 as 1e-30 (so a zero probability gives a large, finite
divergence). Each is a lower bound of the next (appendix C, data processing):
binary <= top-K <= full, for TV and for KL(mu || pi). (Top-K KL from slot log-probs alone, without
pi's "other" mass, stays <= full but can fall below binary where pi's tail is below float32 noise.)

KL's log makes it sensitive to a small complement that float32 cannot resolve: pi(other) in top-K
KL (1 - a slot sum near 1) and 1 - pi(a_t) in binary KL. Where the learner knows pi(other) it passes
it in log space (`other_logp`, exact); otherwise such a complement is taken no smaller than its
float32 noise, never as 0 (see `binary_kl` and `_pi_other_from_slots`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# Log-probabilities below this are treated as this value inside divergences, so that a zero
# probability gives a large, finite divergence instead of inf/NaN (exp(-69.08) = 1e-30).
LOG_EPS = -69.07755278982137
_LOG_HALF = -math.log(2.0)
# float32's spacing at 1 (2^-23): the resolution of a float32 softmax normalizer Z = 1 + (the rest),
# so the finest complement 1 - pi(a) that a float32 log pi(a) near 0 carries.
EPS32 = torch.finfo(torch.float32).eps
_LOG_EPS32 = math.log(EPS32)


def log1mexp(x: Tensor) -> Tensor:
    """log(1 - exp(x)) for x <= 0, accurate at both ends (Maechler 2012); -inf at x = 0."""
    return torch.where(x > _LOG_HALF, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def binary_tv(behavior_logp: Tensor, logp: Tensor) -> Tensor:
    """Eq. 13: D_TV^Bin = |mu(a_t) - pi(a_t)|, the TV between (p, 1 - p) Bernoullis. Shape of inputs."""
    return (behavior_logp.float().clamp(max=0).exp() - logp.float().clamp(max=0).exp()).abs()


def binary_kl(behavior_logp: Tensor, logp: Tensor) -> Tensor:
    """Eq. 14: KL(Bern(mu(a_t)) || Bern(pi(a_t))) = mu log(mu/pi) + (1-mu) log((1-mu)/(1-pi)).

    1 - pi comes from log pi by log1mexp (exact for the given value) but is taken >= EPS32: a float32
    log-softmax gives log pi(a) = 0 once 1 - pi(a) < EPS32 / 2 (its normalizer Z rounds to 1), and
    1e-30 there would add (1 - mu) * 52 nats that pi does not have. Values above EPS32 are untouched.
    """
    lmu = behavior_logp.float().clamp(LOG_EPS, 0.0)
    lpi = logp.float().clamp(LOG_EPS, 0.0)
    l1mu = log1mexp(lmu).clamp(min=LOG_EPS)  # log(1 - mu)
    l1pi = log1mexp(lpi).clamp(min=_LOG_EPS32)  # log(1 - pi), floored at its float32 noise
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
    other_logp: Tensor | None = None,
) -> Tensor:
    """Top-K TV or KL (`kind` "tv" / "kl") of [..., S] slot log-probs, computed in row chunks.

    `other_logp` ([...], optional): log pi(other), pi's mass outside the valid slots, from pi's full
    distribution (the learner has it: exact). KL uses it; without it KL bounds pi(other) from the
    slots (`_pi_other_from_slots`). TV always takes the "other" bucket from the slots: it is
    Lipschitz in the bucket, so float32's ~S x 6e-8 error on it stays ~S x 6e-8 in the value.

    Chunking keeps every temporary small (no tensor of the input's size is allocated) and lets the
    ~10 elementwise passes run from cache: 4x faster than whole-tensor ops on CPU. Log-probs are
    clamped into [log 1e-30, 0] (-inf is a zero probability); unused slots (`topk_valid` False) and
    NaN slots count as absent. A row with a NaN slot or a NaN `other_logp` takes pi(other) from its
    remaining slots (a dropped slot's mass is then part of "other").
    """
    if kind not in ("tv", "kl"):
        raise ValueError(f"kind must be 'tv' or 'kl', got {kind!r}")
    S = topk_behavior_logp.shape[-1]
    lead = topk_behavior_logp.shape[:-1]
    a_all = topk_behavior_logp.detach().reshape(-1, S)
    b_all = topk_logp.detach().reshape(-1, S)
    v_all = topk_valid.reshape(-1, S) if topk_valid is not None else None
    o_all = other_logp.detach().reshape(-1) if other_logp is not None and kind == "kl" else None
    out = torch.empty(a_all.shape[0], dtype=torch.float32, device=a_all.device)
    rows = _chunk_rows(a_all.shape[0], S, a_all.device)
    for i in range(0, a_all.shape[0], rows):
        a, b = a_all[i : i + rows], b_all[i : i + rows]  # [R, S] log mu, log pi
        v = v_all[i : i + rows] if v_all is not None else None
        o = o_all[i : i + rows] if o_all is not None else None  # [R] log pi(other)
        chunk = _topk_chunk(kind, a, b, v, o)  # [R]
        nan_rows = chunk.isnan()
        if nan_rows.any():  # rare: a NaN slot or other; drop NaN slots in those rows only
            a, b = a[nan_rows], b[nan_rows]
            ok = ~(a.isnan() | b.isnan())
            v_nan = ok if v is None else ok & v[nan_rows]
            chunk[nan_rows] = _topk_chunk(kind, a.nan_to_num(0.0), b.nan_to_num(0.0), v_nan, None)
        out[i : i + rows] = chunk
    return out.view(lead)


def _mu_other(mu: Tensor) -> Tensor:
    """[R] mu's mass outside the slots, 1 - sum_s mu[:, s], from [R, S] float32 slot probabilities.

    mu's "other" bucket has no better source than the engine's top-K log-probs. A float32 sum would
    leave 1 - (a sum near 1) off by up to ~S x 6e-8; summed in float64, only the float32 exp's
    rounding (<= 6e-8 x sum) is left, the precision of the given float32 log-probs themselves (a
    float64 exp too cost a fifth of the benchmark's top-K KL step and bought no more than that).
    """
    return (1.0 - mu.sum(-1, dtype=torch.float64)).clamp_(min=0.0).float()


def _pi_other_from_slots(logp: Tensor, weight: Tensor | None) -> Tensor:
    """[R] pi(other) from float32 slot log-probs alone: 1 - sum plus the sum's float32 noise.

    With sum = sum_s pi(s) over the S slots, the exact pi(other) lies within 1 - sum +- n, where
    n = S * EPS32 * sum bounds (first order, in units of EPS32 * sum)
      - the float32 rounding of each log pi(s): |log pi(s)| / 2 relative in pi(s), in all at most
        log(S / sum) / 2 (the slots' entropy);
      - this chunk's float32 exp (1/2) and sum of S terms ((S - 1) / 2);
      - what is left, (S - log S) / 2 (9 at S = 21), covers the normalizer of a float32 log-softmax,
        shared by all slots: log2(V) / 2 for a tree reduction (a GPU kernel; V = 152k: 8.6).
    The result is the top of that interval, 1 - sum + n (and n where the sum exceeds 1, as a learner's
    float32 slots do for a sharp pi: 1.00000013 in issue 11, where a floor of 1e-30 added 0.06 nats).
    An upper bound of pi(other) can only lower the tail term mu(other) log(mu(other) / pi(other)),
    so top-K KL stays <= its exact value, hence <= the full KL (appendix C); where pi's true tail is
    below n, it reads the tail as n and falls short of the exact value by at most
    mu(other) log(n / pi(other)). A CPU log-softmax over a large vocabulary can lose more of a tiny
    tail than n in its normalizer (sequential lanes; measured 4e-5 at V = 152k): pass `other_logp`.
    """
    S = logp.shape[-1]
    p = logp.exp()  # [R, S]
    if weight is not None:  # 0 on absent slots
        p.mul_(weight)
    total = p.sum(-1)  # [R]
    return (1.0 - total).clamp_(min=0.0).add_(total * (S * EPS32))


def _topk_chunk(kind: str, a: Tensor, b: Tensor, valid: Tensor | None, other: Tensor | None) -> Tensor:
    """[R] divergence of one chunk of [R, S] slot log-probs and [R] log pi(other) (see `topk_divergence`)."""
    a = a.float().clamp(LOG_EPS, 0.0)  # [R, S]
    b = b.float().clamp(LOG_EPS, 0.0)
    weight = None if valid is None else valid.to(a.dtype)  # [R, S] 1 on used slots, 0 on absent ones
    mu = a.exp()  # [R, S]
    if weight is not None:  # absent slots weigh 0 (values there are finite after the clamp)
        mu.mul_(weight)
    if kind == "tv":
        pi = b.exp()  # [R, S]
        if weight is not None:
            pi.mul_(weight)
        other_mu = (1.0 - mu.sum(-1)).clamp_(min=0.0)  # [R] the "other" bucket
        other_pi = (1.0 - pi.sum(-1)).clamp_(min=0.0)
        return 0.5 * (mu.sub_(pi).abs_().sum(-1) + (other_mu - other_pi).abs_())
    other_mu = _mu_other(mu)  # [R] mu's "other" bucket
    if other is not None:  # exact, in log space: a tail of 1e-9 stays 1e-9
        log_other_pi = other.float().clamp(LOG_EPS, 0.0)  # [R]
    else:
        log_other_pi = _pi_other_from_slots(b, weight).log_()  # [R], >= its float32 noise
    head = a.sub_(b).mul_(mu).sum(-1)  # [R] sum_a mu (log mu - log pi)
    tail = torch.xlogy(other_mu, other_mu) - other_mu * log_other_pi
    return (head + tail).clamp_(min=0.0)


def topk_tv(topk_behavior_logp: Tensor, topk_logp: Tensor, topk_valid: Tensor | None = None) -> Tensor:
    """Eq. 15: 1/2 (sum_{a in A'} |mu(a) - pi(a)| + |mu(other) - pi(other)|) over A' = TopK(mu) ∪ {a_t}.

    Inputs are [..., S] log-probs on the S slots of A' (unused slots marked by `topk_valid`, or -inf
    in both); the result has shape [...]. The paper's eq. 15 sums over A'; the "other" bucket is
    included here as in appendix C's partition, which is what makes binary <= top-K <= full hold.
    """
    return topk_divergence("tv", topk_behavior_logp, topk_logp, topk_valid)


def topk_kl(
    topk_behavior_logp: Tensor,
    topk_logp: Tensor,
    topk_valid: Tensor | None = None,
    other_logp: Tensor | None = None,
) -> Tensor:
    """Eq. 16: sum_{a in A' ∪ {other}} p^mu(a) log(p^mu(a) / p^pi(a)) = KL(mu || pi) on the reduced space.

    p^pi(other) = exp(`other_logp`) ([...], log of pi's mass outside the valid slots) when given: the
    exact value. Without it, p^pi(other) = 1 - sum_{A'} pi(a) is not resolved by float32 slots once
    it is below ~S x 1e-7, and is bounded from above by its float32 noise (`_pi_other_from_slots`):
    the result is then never above the exact top-K KL, and may fall below it (and below binary KL)
    where pi's tail is below that noise.
    """
    return topk_divergence("kl", topk_behavior_logp, topk_logp, topk_valid, other_logp)


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
