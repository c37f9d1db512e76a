"""The task: a hidden answer per prompt, a sequence-level reward, GRPO group advantages.

Each of the `n_problems` prompts has a hidden answer of `seq_len` tokens. The answer token at
position t is the initial policy's rank-k token in the state (prompt, t, previous answer token), with
k drawn log-uniformly from [1, max_target_rank]: about half the answer tokens start in the head
(mu ~ 0.05-0.5), the rest in the tail (mu ~ 1e-3-1e-2). Every problem is solvable by the initial
model (the paper's sanity-test property) but learning it means raising low-probability tokens.

Reward R(y) = fraction of positions where y_t equals the answer (sequence level: every token of a
response gets the same advantage). Advantages A = R - mean_group(R), no std normalization (eq. 23).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from benchmarks.lab.config import SimConfig
from benchmarks.lab.policy import TinyLM


class HiddenAnswerTask:
    def __init__(self, cfg: SimConfig, policy: TinyLM, generator: torch.Generator):
        self.cfg = cfg
        P, T = cfg.n_problems, cfg.seq_len
        u = torch.rand(P, T, generator=generator)
        ranks = torch.exp(u * math.log(cfg.max_target_rank)).floor().long().clamp(1, cfg.max_target_rank)  # 1-based
        answers = torch.empty(P, T, dtype=torch.long)
        init_prob = torch.empty(P, T)
        prev = torch.full((P,), policy.bos, dtype=torch.long)
        prompts = torch.arange(P)
        with torch.no_grad():
            for t in range(T):
                logits = TinyLM.logits_fn(policy.params(), prompts, torch.full((P,), t, dtype=torch.long), prev)
                probs = torch.softmax(logits, dim=-1)
                order = torch.argsort(probs, dim=-1, descending=True)
                tok = order.gather(-1, (ranks[:, t] - 1)[:, None]).squeeze(-1)
                answers[:, t] = tok
                init_prob[:, t] = probs.gather(-1, tok[:, None]).squeeze(-1)
                prev = tok
        self.answers = answers
        self.init_answer_prob = init_prob  # pi_0(answer_t | answer_<t): diagnostics and docs

    def reward(self, prompts: Tensor, tokens: Tensor) -> Tensor:
        """prompts [B], tokens [B, T] -> R [B] in [0, 1]."""
        return (tokens == self.answers[prompts]).float().mean(-1)

    @staticmethod
    def group_advantages(rewards: Tensor, group_size: int) -> Tensor:
        """A = R - mean over the G rollouts of the same prompt (consecutive rows), no std scaling."""
        r = rewards.view(-1, group_size)
        return (r - r.mean(-1, keepdim=True)).view(-1)
