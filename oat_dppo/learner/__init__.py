"""Turns -> tensors -> trust region -> loss -> optimizer steps: the loop both backends share."""

from oat_dppo.learner.batch import Sample, TokenBatch, collate
from oat_dppo.learner.learner import Learner, LearnerConfig
from oat_dppo.learner.logprobs import PolicyLogprobs, policy_logprobs, sequence_layout
from oat_dppo.learner.loop import (
    UpdateHooks,
    chunks,
    equalize_plan,
    needs_pi_old,
    plan_steps,
    plan_update,
    recompute_old_logp,
    row_sort_keys,
    run_update,
    use_mu_source,
)
from oat_dppo.learner.step import MetricAccumulator, trust_region_loss

__all__ = ["Learner", "LearnerConfig", "MetricAccumulator", "PolicyLogprobs", "Sample", "TokenBatch", "UpdateHooks",
           "chunks", "collate", "equalize_plan", "needs_pi_old", "plan_steps", "plan_update", "policy_logprobs", "recompute_old_logp",
           "row_sort_keys", "run_update", "sequence_layout", "trust_region_loss", "use_mu_source"]
