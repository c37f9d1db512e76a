"""Turns -> tensors -> trust region -> loss -> optimizer step."""

from oat_dppo.learner.batch import TokenBatch, collate
from oat_dppo.learner.learner import Learner, LearnerConfig, MetricAccumulator, trust_region_loss
from oat_dppo.learner.logprobs import PolicyLogprobs, policy_logprobs

__all__ = ["Learner", "LearnerConfig", "MetricAccumulator", "PolicyLogprobs", "TokenBatch", "collate", "policy_logprobs",
           "trust_region_loss"]
