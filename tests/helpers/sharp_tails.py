"""Issue 11's case: a sharp float32 pi whose tail outside mu's top-K is below float32's resolution."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SharpTailCase:
    lmu: torch.Tensor  # [V] float64 log mu
    logits: torch.Tensor  # [V] float32 logits of pi, as an LM head gives them
    ids: torch.Tensor  # [K] mu's top-K token ids (0..K-1), the sampled token among them
    a: int  # the sampled token: mu(a) = 0.05, pi(a) = 0.05005
    exact: float  # float64 KL(mu || pi) on the K + 1 partition, pi = softmax of `logits` in float64
    full: float  # float64 KL(mu || pi) over the vocabulary

    @property
    def lpi32(self) -> torch.Tensor:
        """[V] the learner's float32 log pi (a float32 log-softmax of the logits)."""
        return self.logits.log_softmax(-1)


def issue_11_case(pi_tail: float, V: int = 4096, K: int = 20, seed: int = 0) -> SharpTailCase:
    """mu keeps 1e-3 of its mass outside its top-K; pi keeps `pi_tail` (1e-9 to 1e-6) there, its head
    is mu's rescaled (so pi(a) = 0.05 / 0.999 = 0.05005). Token 0 is in the top-K (slot ids of unused
    slots are 0 too)."""
    g = torch.Generator().manual_seed(seed)
    a = 3
    head = torch.rand(K, generator=g, dtype=torch.float64) + 0.2
    head[a] = 0.0
    head = head / head.sum() * (0.999 - 0.05)
    head[a] = 0.05
    mu_tail = torch.rand(V - K, generator=g, dtype=torch.float64)
    mu = torch.cat([head, mu_tail / mu_tail.sum() * 1e-3])
    pi_rest = torch.rand(V - K, generator=g, dtype=torch.float64)
    pi = torch.cat([head / 0.999 * (1 - pi_tail), pi_rest / pi_rest.sum() * pi_tail])
    logits = (pi.log() + 4.0).float()  # an LM head's logits are not normalized
    lmu, lpi = mu.log(), logits.double().log_softmax(-1)
    ids = torch.arange(K)
    mu_o, pi_o = mu[K:].sum(), lpi[K:].exp().sum()
    exact = (mu[:K] * (lmu[:K] - lpi[:K])).sum() + mu_o * (mu_o / pi_o).log()
    full = (mu * (lmu - lpi)).sum()
    return SharpTailCase(lmu=lmu, logits=logits, ids=ids, a=a, exact=float(exact), full=float(full))
