"""The warm start's objective: imitate the demonstrated tokens, through the trust-region interface.

A strategy is any callable `(TrustRegionInputs) -> TrustRegionOutput`, so a supervised step runs through
the learner that RL's steps run through: the same packing of an episode's turns, micro-batches, loss
aggregation, optimizer hooks and metrics. Per response token a_t of a demonstration turn:

    loss_t = -log pi(a_t | s_t)          d loss_t / d log pi = -1 on every kept token

(the policy-gradient form of eq. 23 with weight 1: `weights` = M). With `token_mean` aggregation the loss
is the mean negative log-likelihood per demonstrated token, logged as `nll`.
"""

from __future__ import annotations

import math

import torch

from oat_dppo.trust_region.inputs import TrustRegionInputs, TrustRegionOutput


class NegativeLogLikelihood:
    topk = 0  # no top-K of mu: demonstrations have no behavior distribution
    needs_old_logp = False
    trajectory_sequences = False

    def __call__(self, inputs: TrustRegionInputs) -> TrustRegionOutput:
        mask = inputs.mask  # [B, T] bool
        terms = torch.where(mask, -inputs.logp, torch.zeros_like(inputs.logp))  # [B, T]
        n = int(mask.sum())
        nll = float(terms.detach().sum()) / n if n else math.nan
        return TrustRegionOutput(keep=mask, loss_terms=terms, weights=mask.float(), metrics={"nll": nll})

    def __repr__(self) -> str:
        return "NegativeLogLikelihood()"
