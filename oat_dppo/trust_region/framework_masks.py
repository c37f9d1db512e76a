r"""The masks other frameworks ship, in this project's contract (eq. 23's M_t * w_t * A_t, anchored
on mu, the engine that sampled). Each class names its source and keeps the source's defaults; where a
source leaves a choice open, the docstring says what was chosen.

Token-level (one decision per token):
    ipo       prime-rl      block |pi - mu| > delta (0.3), whatever A's sign; raw ratio on kept tokens
    icepop    IcePop        block r outside [low, high] ([0.2, 5], prime-rl's band), whatever A's sign
    kpop      KPop          block binary KL(mu||pi) > phi or KL(pi||mu) > phi (0.1), p in [1e-6, 1-1e-6]
    tis       verl / slime  no mask, w = min(r, C) per token (C 2); level="sequence": min(prod r, C)
    mis       verl / slime  rejection: block r outside [1/t, t] per token (t 2), per sequence (prod r)
              or by the sequence's geometric mean (C 1.001); raw ratio on kept tokens
Sequence-level:
    trm       Trust Region Masking (arXiv 2512.23075): block a whole sequence whose max (or mean) token
              KL(mu||pi) exceeds delta

Every boundary is kept: a value exactly at a threshold is inside the trust region (each source
masks with a strict > or <).

What a sequence is (`sequence`, for tis/mis at sequence or geometric level and trm): "trajectory" (the
default) is the whole episode, every turn's response tokens together, as the sources mean it: their
sequence is the model's whole response to a task, which in a multi-turn episode spans its turns
(verl and slime train an agent's turns as one response with the environment's tokens masked out).
"turn" is each turn's response alone. Single-turn environments: the same thing.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from oat_dppo.trust_region.inputs import PreparedBatch
from oat_dppo.trust_region.sequences import per_sequence
from oat_dppo.trust_region.strategies import MaskedPolicyGradient, _non_negative

# Safety bound of sequence log-ratios (verl bounds IS weights to [exp(-20), exp(20)]).
_MAX_SEQ_LOG_RATIO = 20.0


def _positive(name: str, value: float) -> float:
    value = float(value)
    if math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


class IPO(MaskedPolicyGradient):
    """prime-rl's `ipo` loss (its default since PR #3418): a token is masked when |pi - mu| > delta,
    for either sign of the advantage (unlike DPPO, which never blocks a move back toward mu); kept
    tokens get the raw ratio r = pi/mu. delta 0.3 (prime-rl's default since PR #3586; 0.1 before)."""

    name = "ipo"

    def __init__(self, *, delta: float = 0.3, C: float = math.inf):
        super().__init__(C=C)
        self.delta = _non_negative("delta", delta)

    def divergence(self, p: PreparedBatch) -> Tensor:
        return p.binary_tv  # [B, T] |mu(a_t) - pi(a_t)|

    def blocked(self, p: PreparedBatch, divergence: Tensor | None) -> Tensor:
        return divergence > self.delta


class IcePop(MaskedPolicyGradient):
    """IcePop (Ring-1T; prime-rl's `icepop`, open-instruct): a token is masked when r = pi/mu leaves
    [low, high], for either sign of the advantage; kept tokens get the raw ratio. Band [0.2, 5] as
    prime-rl ships it."""

    name = "icepop"

    def __init__(self, *, low: float = 0.2, high: float = 5.0, C: float = math.inf):
        super().__init__(C=C)
        self.low = _positive("low", low)
        self.high = _positive("high", high)
        if self.low > self.high:
            raise ValueError(f"low ({low}) must be <= high ({high})")

    def blocked(self, p: PreparedBatch, divergence: Tensor | None) -> Tensor:
        return (p.log_ratio < math.log(self.low)) | (p.log_ratio > math.log(self.high))


def clamped_binary_kl(p_logp: Tensor, q_logp: Tensor, eps: float = 1e-6) -> Tensor:
    """KL(Bern(p) || Bern(q)) with both probabilities clamped to [eps, 1 - eps], as KPop computes it."""
    p = p_logp.exp().clamp(eps, 1 - eps)
    q = q_logp.exp().clamp(eps, 1 - eps)
    return (p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()).clamp(min=0.0)


class KPop(MaskedPolicyGradient):
    """KPop (prime-rl PR #3283): a token is masked when the binary KL in either direction exceeds
    phi (0.1), KL(mu||pi) or KL(pi||mu), with probabilities clamped to [1e-6, 1 - 1e-6]; either sign
    of the advantage; raw ratio on kept tokens. The reported divergence is the larger direction."""

    name = "kpop"

    def __init__(self, *, phi: float = 0.1, C: float = math.inf):
        super().__init__(C=C)
        self.phi = _non_negative("phi", phi)

    def divergence(self, p: PreparedBatch) -> Tensor:
        forward = clamped_binary_kl(p.behavior_logp, p.logp)  # [B, T] KL(mu || pi)
        reverse = clamped_binary_kl(p.logp, p.behavior_logp)  # [B, T] KL(pi || mu)
        return torch.maximum(forward, reverse)

    def blocked(self, p: PreparedBatch, divergence: Tensor | None) -> Tensor:
        return divergence > self.phi


Level = Literal["token", "sequence", "geometric"]
Sequence = Literal["trajectory", "turn"]


def _check_sequence(sequence: str) -> str:
    if sequence not in ("trajectory", "turn"):
        raise ValueError(f"sequence must be 'trajectory' (the whole episode) or 'turn', got {sequence!r}")
    return sequence


def _sequence_log_ratio(p: PreparedBatch, level: Level) -> Tensor:
    """[B, T] per token: its own log r (token), its sequence's sum of log r (sequence: log prod r), or
    its sequence's mean log r (geometric: log of the geometric mean)."""
    if level == "token":
        return p.log_ratio
    reduce = "sum" if level == "sequence" else "mean"
    return per_sequence(p.log_ratio, p.valid, p.sequence_ids, reduce).clamp(-_MAX_SEQ_LOG_RATIO, _MAX_SEQ_LOG_RATIO)


class TruncatedIS(MaskedPolicyGradient):
    """Truncated importance sampling, verl's rollout correction in bypass / policy-gradient mode
    (`rollout_is: token | sequence`, `rollout_is_threshold` 2.0) and slime's TIS: no mask; the weight is
    min(r_t, C) per token, or min(prod_t r_t, C) for every token of a sequence (`level="sequence"`,
    the product bounded to exp(+-20) as verl bounds it). Token level equals `cispo` at C = 2."""

    name = "tis"

    def __init__(self, *, level: Literal["token", "sequence"] = "token", C: float = 2.0,
                 sequence: Sequence = "trajectory"):
        super().__init__(C=C)
        if level not in ("token", "sequence"):
            raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
        self.level = level
        self.sequence = _check_sequence(sequence)

    @property
    def trajectory_sequences(self) -> bool:
        return self.level != "token" and self.sequence == "trajectory"

    def is_weight(self, p: PreparedBatch) -> Tensor:
        return _sequence_log_ratio(p, self.level).exp().clamp(max=self.C)


class MaskedIS(MaskedPolicyGradient):
    """Masked importance sampling (rejection), verl's `rollout_rs: token | sequence | geometric` and
    slime's MIS: tokens (or whole sequences) whose ratio leaves [low, C] are masked, low = 1/C unless
    given (verl's `rollout_rs_threshold_lower`); kept tokens get the raw token ratio (eq. 23, C = inf in
    the weight). The ratio tested is r_t (token), prod_t r_t (sequence) or its geometric mean
    exp(mean_t log r_t) (geometric). Defaults: threshold 2.0 (verl's threshold) at token and sequence level,
    1.001 at geometric level (the top of verl's "typical 1.0002 - 1.001"; verl sets no default).
    `veto`: also mask a sequence in which any token has r < veto (verl's `rollout_token_veto_threshold`,
    off by default)."""

    name = "mis"

    def __init__(self, *, level: Level = "token", threshold: float | None = None, low: float | None = None,
                 veto: float = 0.0, sequence: Sequence = "trajectory"):
        if level not in ("token", "sequence", "geometric"):
            raise ValueError(f"level must be 'token', 'sequence' or 'geometric', got {level!r}")
        super().__init__()
        self.level = level
        self.sequence = _check_sequence(sequence)
        self.threshold = _positive("threshold", threshold if threshold is not None else (1.001 if level == "geometric" else 2.0))
        self.low = _positive("low", low) if low is not None else 1.0 / self.threshold
        if self.low > self.threshold:
            raise ValueError(f"low ({self.low}) must be <= threshold ({self.threshold})")
        self.veto = _non_negative("veto", veto)

    @property
    def trajectory_sequences(self) -> bool:  # the veto reduces over the sequence at any level
        return (self.level != "token" or self.veto > 0) and self.sequence == "trajectory"

    def divergence(self, p: PreparedBatch) -> Tensor:
        return _sequence_log_ratio(p, self.level).abs()  # [B, T] |log ratio| tested, for the metrics

    def blocked(self, p: PreparedBatch, divergence: Tensor | None) -> Tensor:
        tested = _sequence_log_ratio(p, self.level)
        out = (tested < math.log(self.low)) | (tested > math.log(self.threshold))
        if self.veto > 0:
            below = (p.log_ratio < math.log(self.veto)) & p.valid
            out |= per_sequence(below.float(), p.valid, p.sequence_ids, "max") > 0
        return out


class TrustRegionMask(MaskedPolicyGradient):
    """Trust Region Masking (arXiv 2512.23075; slime): a whole sequence is masked when the maximum
    (`reduce="max"`) or the mean (`"mean"`) of its tokens' KL(mu||pi) exceeds delta, for either sign
    of the advantage; kept tokens get the raw ratio. The paper bounds a sequence-level divergence; the
    token KL here is the binary KL of eq. 14 (what the rollout records without top-K). delta 0.05, the
    paper's DPPO-KL threshold: the TRM paper gives no default this project could confirm."""

    name = "trm"

    def __init__(self, *, reduce: Literal["max", "mean"] = "max", delta: float = 0.05, C: float = math.inf,
                 sequence: Sequence = "trajectory"):
        super().__init__(C=C)
        if reduce not in ("max", "mean"):
            raise ValueError(f"reduce must be 'max' or 'mean', got {reduce!r}")
        self.reduce = reduce
        self.delta = _non_negative("delta", delta)
        self.sequence = _check_sequence(sequence)

    @property
    def trajectory_sequences(self) -> bool:
        return self.sequence == "trajectory"

    def divergence(self, p: PreparedBatch) -> Tensor:
        return per_sequence(p.binary_kl, p.valid, p.sequence_ids, self.reduce)  # [B, T] the sequence's

    def blocked(self, p: PreparedBatch, divergence: Tensor | None) -> Tensor:
        return divergence > self.delta


FRAMEWORK_STRATEGIES = (IPO, IcePop, KPop, TruncatedIS, MaskedIS, TrustRegionMask)
