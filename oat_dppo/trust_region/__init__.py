"""The trust region: pluggable token masks inside the unified policy gradient of the DPPO paper.

    from oat_dppo.trust_region import TrustRegionInputs, make_trust_region
    out = make_trust_region("dppo_binary_tv", delta=0.2)(TrustRegionInputs(logp, behavior_logp, adv, mask))
    loss = aggregate(out.loss_terms, mask)

Pure torch: nothing here imports oat, vllm or gem.
"""

from oat_dppo.trust_region.aggregation import AGGREGATION_MODES, aggregate
from oat_dppo.trust_region.contract import Requirements, requirements
from oat_dppo.trust_region.divergences import binary_kl, binary_tv, full_kl, full_tv, topk_kl, topk_tv
from oat_dppo.trust_region.inputs import PreparedBatch, TrustRegionInputs, TrustRegionOutput, prepare
from oat_dppo.trust_region.metrics import trust_region_metrics
from oat_dppo.trust_region.registry import available, factory_params, make_trust_region, register
from oat_dppo.trust_region.strategies import (
    CISPO,
    DPPO,
    DPPOBinaryKL,
    DPPOBinaryTV,
    DPPOTopKKL,
    DPPOTopKTV,
    MaskedPolicyGradient,
    NegativeTVMask,
    RatioClip,
    RelaxedRatioClip,
)

__all__ = [
    "AGGREGATION_MODES",
    "CISPO",
    "DPPO",
    "DPPOBinaryKL",
    "DPPOBinaryTV",
    "DPPOTopKKL",
    "DPPOTopKTV",
    "MaskedPolicyGradient",
    "NegativeTVMask",
    "PreparedBatch",
    "RatioClip",
    "RelaxedRatioClip",
    "Requirements",
    "TrustRegionInputs",
    "TrustRegionOutput",
    "aggregate",
    "available",
    "binary_kl",
    "binary_tv",
    "factory_params",
    "full_kl",
    "full_tv",
    "make_trust_region",
    "prepare",
    "register",
    "requirements",
    "topk_kl",
    "topk_tv",
    "trust_region_metrics",
]
