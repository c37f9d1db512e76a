"""The policy: a tiny autoregressive model over a long-tailed vocabulary.

State s_t = (prompt, position t, previous token y_{t-1}). One hidden layer on the sum of three
embeddings, then a full-vocabulary softmax whose output bias starts at Zipf log-probabilities, so
every state shares a long tail and low-probability tokens are a real share of the mass:

    h = tanh(W1 (E_prompt[p] + E_pos[t] + E_tok[y_{t-1}]) + b1)
    logits = W_out h + b_out,   b_out(rank k) = -s log k   (+ the state part W_out h, std ~ state_logit_scale)

All parameters are shared across states, so a large update on one state moves the others (the
"internal knowledge" that a bad negative update can corrupt). The forward pass takes an optional
rounding function applied after every op: the inference engine (mismatch.py) runs the *same*
function with rounded weights and activations.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn

from benchmarks.lab.config import SimConfig

Rounder = Callable[[Tensor], Tensor]


def _identity(x: Tensor) -> Tensor:
    return x


class TinyLM(nn.Module):
    def __init__(self, cfg: SimConfig, generator: torch.Generator):
        super().__init__()
        V, d, H = cfg.vocab, cfg.embed_dim, cfg.hidden_dim
        g = generator

        def randn(*shape, std=1.0):
            return nn.Parameter(torch.randn(*shape, generator=g) * std)

        self.vocab = V
        self.bos = V  # previous-token id at t = 0
        self.prompt_emb = randn(cfg.n_problems, d)
        self.pos_emb = randn(cfg.seq_len, d)
        self.tok_emb = randn(V + 1, d)
        self.w1 = randn(H, d, std=1.0 / math.sqrt(3 * d))  # input has variance ~3 (sum of three embeddings)
        self.b1 = nn.Parameter(torch.zeros(H))
        # tanh(.) has variance ~0.4 at this scale; W_out scaled so the state part of the logits has std ~state_logit_scale
        self.w_out = randn(V, H, std=cfg.state_logit_scale / math.sqrt(0.4 * H))
        ranks = torch.randperm(V, generator=g).float() + 1.0  # a random token order for the Zipf tail
        self.b_out = nn.Parameter(-cfg.zipf_exponent * torch.log(ranks))

    def params(self) -> dict[str, Tensor]:
        return dict(self.named_parameters())

    @staticmethod
    def logits_fn(params: dict[str, Tensor], prompts: Tensor, positions: Tensor, prev: Tensor, rnd: Rounder = _identity) -> Tensor:
        """prompts, positions, prev: matching integer shapes [...] -> logits [..., V] (float32)."""
        x = rnd(params["prompt_emb"][prompts] + params["pos_emb"][positions])
        x = rnd(x + params["tok_emb"][prev])
        h = rnd(torch.tanh(rnd(x @ params["w1"].T + params["b1"])))
        return rnd(h @ params["w_out"].T + params["b_out"])

    def logits(self, prompts: Tensor, tokens: Tensor) -> Tensor:
        """Teacher-forced logits of whole responses: prompts [B], tokens [B, T] -> [B, T, V]."""
        B, T = tokens.shape
        prev = torch.cat([torch.full((B, 1), self.bos, dtype=tokens.dtype), tokens[:, :-1]], dim=1)
        positions = torch.arange(T).expand(B, T)
        return self.logits_fn(self.params(), prompts[:, None].expand(B, T), positions, prev)

    def logprobs(self, prompts: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """(log pi of the sampled tokens [B, T], full log-probs [B, T, V])."""
        logp_all = torch.log_softmax(self.logits(prompts, tokens), dim=-1)
        return logp_all.gather(-1, tokens[..., None]).squeeze(-1), logp_all
