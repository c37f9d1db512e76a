"""The inference engine and its training-inference mismatch.

The engine samples rollouts from mu and records log mu of the sampled tokens, as vLLM/SGLang do. mu is
the *same* policy as the learner's pi, computed differently:

- "round": weights synced into the engine are rounded to `mantissa_bits` significant bits, and so is
  every intermediate activation and the logits (8 bits = bfloat16, round to nearest); softmax in
  float32. Deterministic, like a bf16 engine: the error grows with the magnitude of weights and
  logits, so an update that inflates them also inflates the mismatch.
- "noise": float32 forward plus i.i.d. Gaussian noise of std `noise_std` on every logit, fresh per
  sampled state (a stand-in for non-deterministic kernels / MoE routing jitter).
- "none": mu == pi exactly (before any update).
"""

from __future__ import annotations

import torch
from torch import Tensor

from benchmarks.lab.config import SimConfig
from benchmarks.lab.policy import TinyLM


def round_mantissa(x: Tensor, bits: int) -> Tensor:
    """Round to `bits` significant binary digits (round half away from zero); bits=8 ~ bfloat16."""
    m, e = torch.frexp(x)  # x = m * 2**e, |m| in [0.5, 1)
    scale = float(2**bits)
    return torch.ldexp(torch.round(m * scale) / scale, e)


class InferenceEngine:
    def __init__(self, cfg: SimConfig, generator: torch.Generator):
        if cfg.mismatch not in ("round", "noise", "none"):
            raise ValueError(f"mismatch must be 'round', 'noise' or 'none', got {cfg.mismatch!r}")
        self.cfg = cfg
        self.gen = generator
        self.params: dict[str, Tensor] = {}

    def _rnd(self, x: Tensor) -> Tensor:
        return round_mantissa(x, self.cfg.mantissa_bits) if self.cfg.mismatch == "round" else x

    def sync(self, policy: TinyLM) -> None:
        """Load the learner's current weights (rounded for "round"), as a weight sync to vLLM does."""
        with torch.no_grad():
            self.params = {k: self._rnd(v.detach().clone()) for k, v in policy.params().items()}

    @torch.no_grad()
    def logits(self, prompts: Tensor, positions: Tensor, prev: Tensor) -> Tensor:
        z = TinyLM.logits_fn(self.params, prompts, positions, prev, rnd=self._rnd)
        if self.cfg.mismatch == "noise" and self.cfg.noise_std > 0:
            z = z + self.cfg.noise_std * torch.randn(z.shape, generator=self.gen)
        return z

    @torch.no_grad()
    def rollout(self, prompts: Tensor, bos: int) -> tuple[Tensor, Tensor]:
        """Sample responses from mu. prompts [B] -> (tokens [B, T] int64, log mu of them [B, T])."""
        B, T = prompts.shape[0], self.cfg.seq_len
        tokens = torch.empty(B, T, dtype=torch.long)
        mu_logp = torch.empty(B, T)
        prev = torch.full((B,), bos, dtype=torch.long)
        for t in range(T):
            logp = torch.log_softmax(self.logits(prompts, torch.full((B,), t, dtype=torch.long), prev).float(), dim=-1)
            u = torch.rand(logp.shape, generator=self.gen).clamp_(1e-20, 1.0)
            tok = torch.argmax(logp - torch.log(-torch.log(u)), dim=-1)  # Gumbel-max: a sample from mu
            tokens[:, t] = tok
            mu_logp[:, t] = logp.gather(-1, tok[:, None]).squeeze(-1)
            prev = tok
        return tokens, mu_logp
