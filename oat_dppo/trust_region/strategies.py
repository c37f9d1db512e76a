"""Trust-region strategies: each is a mask M_t inside the unified policy gradient (paper eq. 23)

    grad L = E_{y~mu} [ sum_t  M_t * min(pi/mu, C) * A_t * grad log pi(y_t|s_t) ].

A strategy only decides which tokens to block (`blocked`); `MaskedPolicyGradient.__call__` does the
rest once for all of them: validation, the truncated IS weight, the loss terms and the metrics.
To add your own, subclass `MaskedPolicyGradient` and override `blocked` (see docs/trust_regions.md).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
from torch import Tensor

from oat_dppo.trust_region.divergences import binary_kl, binary_tv, topk_divergence
from oat_dppo.trust_region.inputs import PreparedBatch, TrustRegionInputs, TrustRegionOutput, prepare
from oat_dppo.trust_region.metrics import trust_region_metrics

Anchor = Literal["behavior", "recompute"]


def _non_negative(name: str, value: float) -> float:
    value = float(value)
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


class MaskedPolicyGradient:
    """PG-IS with an optional token mask: the base of every strategy (M_t = 1 here).

    C: truncation of the importance ratio r = pi/mu in the gradient weight (C = inf: no truncation).
    anchor: "behavior" anchors the mask on mu (the paper's choice, section 5.2); "recompute" anchors
        it on a recomputed pi_old (the decoupled ablation of figure 4; MiniRL). The IS weight is
        always min(pi/mu, C), as in eq. 23.
    """

    name: ClassVar[str] = "pg_is"
    #: strategies with True need the top-K inputs; `topk` is then the K to record at rollout.
    needs_topk: ClassVar[bool] = False
    supports_anchor: ClassVar[bool] = False
    #: per-token strategies never reduce over a sequence (see `trust_region.contract`).
    trajectory_sequences: bool = False

    def __init__(self, *, C: float = math.inf, anchor: Anchor = "behavior"):
        C = float(C)
        if math.isnan(C) or C <= 0:
            raise ValueError(f"C (the ratio truncation) must be > 0 (use inf for none), got {C}")
        if anchor not in ("behavior", "recompute"):
            raise ValueError(f"anchor must be 'behavior' or 'recompute', got {anchor!r}")
        if anchor == "recompute" and not self.supports_anchor:
            raise ValueError(f"{self.name} has no trust-region anchor; anchor='recompute' does not apply")
        self.C = C
        self.anchor = anchor

    # ---- what a strategy overrides -------------------------------------------------------------
    def blocked(self, p: PreparedBatch, divergence: Tensor | None) -> Tensor:
        """[B, T] bool: tokens whose update the trust region blocks (M_t = 0). `divergence` is what
        `self.divergence(p)` returned. Padding is handled by the caller; only the rule belongs here."""
        return torch.zeros_like(p.valid)

    def divergence(self, p: PreparedBatch) -> Tensor | None:
        """[B, T] the divergence the mask thresholds, if any (reported as `divergence_mean`)."""
        return None

    def is_weight(self, p: PreparedBatch) -> Tensor:
        """[B, T] the importance weight of eq. 23, min(r_t, C). Sequence-level IS overrides it with
        one weight per sequence (min(prod_t r_t, C)); every other strategy keeps it."""
        return p.ratio.clamp(max=self.C)

    # ---- shared by every strategy --------------------------------------------------------------
    @property
    def needs_old_logp(self) -> bool:
        return self.anchor == "recompute"

    @property
    def topk(self) -> int:
        """K of mu's top-K log-probs to record at rollout (0: sampled token only)."""
        return 0

    def __call__(self, inputs: TrustRegionInputs) -> TrustRegionOutput:
        p = prepare(inputs, anchor=self.anchor, needs_topk=self.needs_topk)
        with torch.no_grad():
            divergence = self.divergence(p)
            keep = p.valid & ~self.blocked(p, divergence)  # [B, T] M_t
            weight_ratio = self.is_weight(p)  # [B, T] min(r, C)
            weights = torch.where(keep, weight_ratio * p.advantages, torch.zeros((), device=keep.device))
        # loss = -w * exp(logp - sg(logp)): value -w (the surrogate), gradient -w d(logp) (eq. 23).
        # Non-kept positions use logp = 0 so a NaN there can reach neither value nor gradient.
        logp = torch.where(keep, inputs.logp.float(), torch.zeros((), device=keep.device))
        loss_terms = -weights * torch.exp(logp - logp.detach())
        metrics = trust_region_metrics(p, keep, self.C, divergence)
        return TrustRegionOutput(keep=keep, loss_terms=loss_terms, weights=weights, metrics=metrics)

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({params})"


class RatioClip(MaskedPolicyGradient):
    """PPO / GRPO clip-higher as a mask (eq. 9, appendix D.1): block A > 0 with r > 1 + eps_high and
    A < 0 with r < 1 - eps_low, where r = pi/mu (anchor "behavior") or pi/pi_old ("recompute", MiniRL)."""

    name = "ppo_clip"
    supports_anchor = True

    def __init__(self, *, eps_low: float = 0.2, eps_high: float = 0.28, C: float = math.inf, anchor: Anchor = "behavior"):
        super().__init__(C=C, anchor=anchor)
        self.eps_low = _non_negative("eps_low", eps_low)
        self.eps_high = _non_negative("eps_high", eps_high)

    def clip_high(self, p: PreparedBatch) -> Tensor:
        """[B, T] bool: A > 0 and r above the upper clip."""
        return (p.advantages > 0) & (p.anchor_log_ratio > math.log1p(self.eps_high))

    def clip_low(self, p: PreparedBatch) -> Tensor:
        """[B, T] bool: A < 0 and r below the lower clip (always false when eps_low >= 1)."""
        if self.eps_low >= 1.0:
            return torch.zeros_like(p.valid)
        return (p.advantages < 0) & (p.anchor_log_ratio < math.log1p(-self.eps_low))

    def blocked(self, p: PreparedBatch, divergence: Tensor | None) -> Tensor:
        return self.clip_high(p) | self.clip_low(p)


class RelaxedRatioClip(RatioClip):
    """Section 6: the ratio clip lifted for low-probability tokens (mu < alpha) on one end
    (`direction` "high": Relax-high, "low": Relax-low) or both ("both": Relax-both)."""

    name = "ppo_clip_relaxed"

    def __init__(
        self,
        *,
        alpha: float = 0.1,
        direction: Literal["low", "high", "both"] = "both",
        eps_low: float = 0.2,
        eps_high: float = 0.28,
        C: float = math.inf,
        anchor: Anchor = "behavior",
    ):
        super().__init__(eps_low=eps_low, eps_high=eps_high, C=C, anchor=anchor)
        self.alpha = _non_negative("alpha", alpha)
        if direction not in ("low", "high", "both"):
            raise ValueError(f"direction must be 'low', 'high' or 'both', got {direction!r}")
        self.direction = direction

    def blocked(self, p: PreparedBatch, divergence: Tensor | None) -> Tensor:
        low_prob = p.behavior_logp < math.log(self.alpha) if self.alpha > 0 else torch.zeros_like(p.valid)
        high = self.clip_high(p)
        low = self.clip_low(p)
        if self.direction in ("high", "both"):
            high = high & ~low_prob
        if self.direction in ("low", "both"):
            low = low & ~low_prob
        return high | low


class NegativeTVMask(MaskedPolicyGradient):
    """Section 5.3's minimal mask on top of PG-IS: block only A < 0 with mu - pi >= delta."""

    name = "neg_tv_mask"
    supports_anchor = True

    def __init__(self, *, delta: float = 0.5, C: float = math.inf, anchor: Anchor = "behavior"):
        super().__init__(C=C, anchor=anchor)
        self.delta = _non_negative("delta", delta)

    def blocked(self, p: PreparedBatch, divergence: Tensor | None) -> Tensor:
        drop = p.anchor_logp.exp() - p.logp.exp()  # [B, T] mu - pi
        return (p.advantages < 0) & (drop >= self.delta)


class DPPO(MaskedPolicyGradient):
    """DPPO's divergence mask (eq. 12): block A > 0 with r > 1 and D > delta, and A < 0 with r < 1
    and D > delta. The mask never blocks an update that moves pi back toward the anchor."""

    supports_anchor = True

    def __init__(self, *, delta: float, C: float = math.inf, anchor: Anchor = "behavior"):
        super().__init__(C=C, anchor=anchor)
        self.delta = _non_negative("delta", delta)

    def divergence(self, p: PreparedBatch) -> Tensor:
        return p.binary_tv if self.anchor == "behavior" else binary_tv(p.anchor_logp, p.logp)

    def blocked(self, p: PreparedBatch, divergence: Tensor | None) -> Tensor:
        away_up = (p.advantages > 0) & (p.anchor_log_ratio > 0)  # r > 1
        away_down = (p.advantages < 0) & (p.anchor_log_ratio < 0)  # r < 1
        return (away_up | away_down) & (divergence > self.delta)


class DPPOBinaryTV(DPPO):
    """DPPO with the binary TV of eq. 13 (delta 0.2 in the scaling runs, 0.15 in the sanity test)."""

    name = "dppo_binary_tv"

    def __init__(self, *, delta: float = 0.2, C: float = math.inf, anchor: Anchor = "behavior"):
        super().__init__(delta=delta, C=C, anchor=anchor)


class DPPOBinaryKL(DPPO):
    """DPPO with the binary KL(mu || pi) of eq. 14 (delta 0.05)."""

    name = "dppo_binary_kl"

    def __init__(self, *, delta: float = 0.05, C: float = math.inf, anchor: Anchor = "behavior"):
        super().__init__(delta=delta, C=C, anchor=anchor)

    def divergence(self, p: PreparedBatch) -> Tensor:
        return p.binary_kl if self.anchor == "behavior" else binary_kl(p.anchor_logp, p.logp)


class DPPOTopK(DPPO):
    """DPPO with a top-K divergence (eqs. 15-16) over TopK(mu, K) ∪ {a_t} plus the "other" bucket.
    K is what the rollout records; the divergence uses whatever slots the inputs carry."""

    needs_topk = True
    supports_anchor = False

    def __init__(self, *, delta: float, topk: int = 20, C: float = math.inf, anchor: Anchor = "behavior"):
        super().__init__(delta=delta, C=C, anchor=anchor)
        if int(topk) != topk or topk < 1:
            raise ValueError(f"topk must be a positive integer (K of TopK(mu, K)), got {topk}")
        self.K = int(topk)

    @property
    def topk(self) -> int:
        return self.K


class DPPOTopKTV(DPPOTopK):
    name = "dppo_topk_tv"

    def __init__(self, *, delta: float = 0.2, topk: int = 20, C: float = math.inf, anchor: Anchor = "behavior"):
        super().__init__(delta=delta, topk=topk, C=C, anchor=anchor)

    def divergence(self, p: PreparedBatch) -> Tensor:
        return topk_divergence("tv", p.topk_anchor_logp, p.topk_logp, p.topk_valid)


class DPPOTopKKL(DPPOTopK):
    name = "dppo_topk_kl"

    def __init__(self, *, delta: float = 0.05, topk: int = 20, C: float = math.inf, anchor: Anchor = "behavior"):
        super().__init__(delta=delta, topk=topk, C=C, anchor=anchor)

    def divergence(self, p: PreparedBatch) -> Tensor:
        # pi's "other" mass, exact when the caller gave it (the learner does); else bounded from the slots
        return topk_divergence("kl", p.topk_anchor_logp, p.topk_logp, p.topk_valid, p.topk_other_logp)


class CISPO(MaskedPolicyGradient):
    """PG-TIS, called CISPO in the paper: no mask, the ratio truncated at C (3 in section 5)."""

    name = "cispo"

    def __init__(self, *, C: float = 3.0, anchor: Anchor = "behavior"):
        super().__init__(C=C, anchor=anchor)
