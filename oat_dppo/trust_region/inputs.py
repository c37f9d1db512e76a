"""Typed inputs and outputs of a trust-region strategy, and their validation.

Shapes: B sequences (or turns), T token positions, S top-K slots (K + 1: mu's top-K plus the sampled
token when it falls outside the top-K).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

from oat_dppo.trust_region.divergences import binary_kl, binary_tv

# exp() of a float32 log-ratio overflows above ~88.7; the ratio is clamped to exp(80) ~ 5.5e34.
MAX_LOG_RATIO = 80.0


@dataclass
class TrustRegionInputs:
    """One batch of trained tokens, as the learner sees it.

    logp:                [B, T] log pi(a_t|s_t) of the policy being trained (carries grad).
    behavior_logp:       [B, T] log mu(a_t|s_t), recorded by the inference engine at rollout.
    advantages:          [B, T] or [B, 1] (or [B]) advantage estimates A_t.
    mask:                [B, T] bool, True on response tokens that are trained.
    old_logp:            [B, T] recomputed log pi_old, only for anchor="recompute" strategies.
    topk_behavior_logp:  [B, T, S] log mu on the top-K set TopK(mu, K) ∪ {a_t}.
    topk_logp:           [B, T, S] log pi on the same token ids (no grad needed).
    topk_valid:          [B, T, S] bool, False on unused slots.
    topk_other_logp:     [B, T] log pi of the mass outside the valid slots (no grad needed), optional:
                         log sum_{a not in A'} pi(a), from pi's full distribution. Top-K KL uses it
                         (exact); without it, 1 - sum of the float32 slots cannot resolve a tail below
                         ~S x 1e-7 and top-K KL reads such a tail at that noise (a lower estimate).
                         The learner passes it; TV does not need it.
    sequence_ids:        [B, T] int64, which sequence each token belongs to, for strategies that decide
                         per sequence (sequence IS, TRM). None (what both backends pass): each row is
                         one sequence. Ids are >= 0; padding may carry any id (it is not valid).
    """

    logp: Tensor
    behavior_logp: Tensor
    advantages: Tensor
    mask: Tensor
    old_logp: Tensor | None = None
    topk_behavior_logp: Tensor | None = None
    topk_logp: Tensor | None = None
    topk_valid: Tensor | None = None
    topk_other_logp: Tensor | None = None
    sequence_ids: Tensor | None = None


@dataclass
class TrustRegionOutput:
    """keep: [B, T] bool, the mask M_t (False on padding and excluded tokens).
    loss_terms: [B, T] float32 per-token loss with d(loss_terms)/d(logp) = -M * min(r, C) * A (eq. 23);
        its value is the surrogate -M * min(r, C) * A. Zero where not kept.
    weights: [B, T] float32, detached M * min(r, C) * A (the per-token policy-gradient weight).
    metrics: batch diagnostics (see `metrics.trust_region_metrics`).
    """

    keep: Tensor
    loss_terms: Tensor
    weights: Tensor
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class PreparedBatch:
    """Float32, detached views of one batch, computed once and shared by masks and metrics.

    Every [B, T] tensor holds 0 at positions that are not `valid`, so that no NaN can reach a mask or
    a metric.
    """

    logp: Tensor  # [B, T] log pi, detached
    behavior_logp: Tensor  # [B, T] log mu
    anchor_logp: Tensor  # [B, T] log of the trust-region anchor: mu, or pi_old for anchor="recompute"
    advantages: Tensor  # [B, T]
    valid: Tensor  # [B, T] bool: trained tokens whose inputs are all finite
    log_ratio: Tensor  # [B, T] log(pi / mu), clamped to <= MAX_LOG_RATIO (the IS ratio of eq. 23)
    anchor_log_ratio: Tensor  # [B, T] log(pi / anchor), the ratio the mask's sign tests use
    nonfinite: Tensor  # [B, T] bool: trained tokens excluded because an input was NaN/inf
    # Top-K views are the caller's tensors, detached, not yet masked by `valid` (that happens chunk
    # by chunk in the divergence, to avoid three input-sized copies).
    topk_anchor_logp: Tensor | None = None  # [B, T, S]
    topk_logp: Tensor | None = None  # [B, T, S]
    topk_valid: Tensor | None = None  # [B, T, S] bool
    topk_other_logp: Tensor | None = None  # [B, T] log pi(other), when the caller gave it
    sequence_ids: Tensor | None = None  # [B, T] int64, or None: one sequence per row

    @cached_property
    def ratio(self) -> Tensor:
        """[B, T] r_t = pi / mu."""
        return self.log_ratio.exp()

    @cached_property
    def binary_tv(self) -> Tensor:
        """[B, T] eq. 13 against mu (shared by DPPO's mask and the metrics)."""
        return binary_tv(self.behavior_logp, self.logp)

    @cached_property
    def binary_kl(self) -> Tensor:
        """[B, T] eq. 14, KL(mu || pi), against mu."""
        return binary_kl(self.behavior_logp, self.logp)


def _check_2d(name: str, t: Tensor, shape: torch.Size) -> None:
    if not isinstance(t, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {tuple(shape)}, got {type(t).__name__}")
    if t.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)} (the shape of logp), got {tuple(t.shape)}")


def prepare(inputs: TrustRegionInputs, *, anchor: str, needs_topk: bool) -> PreparedBatch:
    """Validate `inputs` and build the float32, NaN-free views the strategies work on.

    bf16/fp16 inputs are upcast to float32. A trained token whose logp, behavior_logp, anchor or
    advantage is not finite is excluded from training and counted (`nonfinite`).
    """
    logp = inputs.logp
    if not isinstance(logp, Tensor) or logp.dim() != 2:
        shape = tuple(logp.shape) if isinstance(logp, Tensor) else type(logp).__name__
        raise ValueError(f"logp must be a [B, T] tensor, got {shape}")
    shape = logp.shape
    _check_2d("behavior_logp", inputs.behavior_logp, shape)
    _check_2d("mask", inputs.mask, shape)

    adv = inputs.advantages
    if not isinstance(adv, Tensor):
        raise ValueError(f"advantages must be a tensor of shape [B, T] or [B, 1], got {type(adv).__name__}")
    if adv.dim() == 1 and adv.shape[0] == shape[0]:
        adv = adv[:, None]
    if adv.dim() != 2 or adv.shape[0] != shape[0] or adv.shape[1] not in (1, shape[1]):
        raise ValueError(
            f"advantages must have shape [B, T] = {tuple(shape)} or [B, 1] = ({shape[0]}, 1), "
            f"got {tuple(inputs.advantages.shape)}"
        )
    adv = adv.float().expand(shape)

    mask = inputs.mask if inputs.mask.dtype == torch.bool else inputs.mask != 0

    lp = logp.detach().float()  # [B, T]
    blp = inputs.behavior_logp.detach().float()  # [B, T]
    finite = torch.isfinite(lp) & torch.isfinite(blp) & torch.isfinite(adv)

    if anchor == "recompute":
        if inputs.old_logp is None:
            raise ValueError(
                "old_logp is required for anchor='recompute' (the recomputed log pi_old of shape [B, T]); "
                "pass it, or use anchor='behavior' to anchor the trust region on mu"
            )
        _check_2d("old_logp", inputs.old_logp, shape)
        alp = inputs.old_logp.detach().float()
        finite &= torch.isfinite(alp)
    elif anchor == "behavior":
        alp = blp
    else:  # guarded at construction; kept for user strategies that call prepare() directly
        raise ValueError(f"anchor must be 'behavior' or 'recompute', got {anchor!r}")

    valid = mask & finite
    nonfinite = mask & ~finite
    zero = torch.zeros((), dtype=torch.float32, device=lp.device)
    lp = torch.where(valid, lp, zero)
    blp = torch.where(valid, blp, zero)
    alp = torch.where(valid, alp, zero) if anchor == "recompute" else blp
    adv = torch.where(valid, adv, zero)
    log_ratio = (lp - blp).clamp(max=MAX_LOG_RATIO)
    anchor_log_ratio = log_ratio if anchor == "behavior" else (lp - alp).clamp(max=MAX_LOG_RATIO)

    topk = None
    if needs_topk:
        topk = _prepare_topk(inputs, shape, valid, anchor)
    sequence_ids = inputs.sequence_ids
    if sequence_ids is not None:
        _check_2d("sequence_ids", sequence_ids, shape)
        if sequence_ids.dtype.is_floating_point or sequence_ids.dtype == torch.bool:
            raise ValueError(f"sequence_ids must be an integer tensor, got {sequence_ids.dtype}")
        if bool((sequence_ids[valid] < 0).any()):
            raise ValueError("sequence_ids must be >= 0 on trained tokens")
        sequence_ids = torch.where(valid, sequence_ids.long(), torch.zeros((), dtype=torch.long, device=lp.device))

    return PreparedBatch(
        logp=lp,
        behavior_logp=blp,
        anchor_logp=alp,
        advantages=adv,
        valid=valid,
        log_ratio=log_ratio,
        anchor_log_ratio=anchor_log_ratio,
        nonfinite=nonfinite,
        topk_anchor_logp=topk[0] if topk else None,
        topk_logp=topk[1] if topk else None,
        topk_valid=topk[2] if topk else None,
        topk_other_logp=topk[3] if topk else None,
        sequence_ids=sequence_ids,
    )


def _prepare_topk(
    inputs: TrustRegionInputs, shape: torch.Size, valid: Tensor, anchor: str
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    missing = [
        n for n in ("topk_behavior_logp", "topk_logp", "topk_valid") if getattr(inputs, n) is None
    ]
    if missing:
        raise ValueError(
            f"a top-K strategy needs {', '.join(missing)} ([B, T, K+1] tensors: mu and pi on "
            "TopK(mu) ∪ {a_t}); record top-K log-probs at rollout (--topk) or use a binary strategy"
        )
    if anchor != "behavior":
        raise ValueError("top-K strategies support anchor='behavior' only (their set is built from mu)")
    tb, tl, tv = inputs.topk_behavior_logp, inputs.topk_logp, inputs.topk_valid
    if tb.dim() != 3 or tb.shape[:2] != shape:
        raise ValueError(f"topk_behavior_logp must have shape [B, T, S] with [B, T] = {tuple(shape)}, got {tuple(tb.shape)}")
    if tl.shape != tb.shape:
        raise ValueError(f"topk_logp must have the shape of topk_behavior_logp {tuple(tb.shape)}, got {tuple(tl.shape)}")
    if tv.shape != tb.shape:
        raise ValueError(f"topk_valid must have the shape of topk_behavior_logp {tuple(tb.shape)}, got {tuple(tv.shape)}")
    tv = tv if tv.dtype == torch.bool else tv != 0
    other = inputs.topk_other_logp
    if other is not None:
        if not isinstance(other, Tensor) or other.shape != shape:
            got = tuple(other.shape) if isinstance(other, Tensor) else type(other).__name__
            raise ValueError(
                f"topk_other_logp must have shape [B, T] = {tuple(shape)} (log pi outside the slots), got {got}"
            )
        other = other.detach()
    # No copies here: the top-K divergence masks, clamps and upcasts chunk by chunk (see
    # `divergences.topk_divergence`): NaN slots are dropped, log-probs clamped into [log 1e-30, 0].
    return tb.detach(), tl.detach(), tv, other
