"""The training-inference mismatch on the same sampled tokens: mu (what an engine recorded) against
the learner's pi (a teacher-forced forward of the learner's model over the same prompt + response).

Shared by `python -m oat_dppo.bench gpu` (the mismatch table) and the GPU tests.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from oat_dppo.agent.types import Turn
from oat_dppo.engine.base import Generation, pad_token_id
from oat_dppo.envs import render_prompt
from oat_dppo.learner.batch import collate
from oat_dppo.learner.logprobs import policy_logprobs
from oat_dppo.trust_region.divergences import topk_tv

# |pi - mu| above this on a token counts as a large disagreement (the table's "share > 0.05").
LARGE_DIFF = 0.05


def as_turns(prompts: Sequence[Sequence[int]], gens: Sequence[Generation]) -> list[Turn]:
    """One trainable turn per generation with a response (reward and advantage unused)."""
    return [
        Turn(prompt_ids=list(p), response_ids=list(g.response_ids), behavior_logprobs=g.logprobs, reward=0.0,
             done=True, truncated=False, well_formed=True, finish_reason=g.finish_reason, topk_ids=g.topk_ids,
             topk_logprobs=g.topk_logprobs)
        for p, g in zip(prompts, gens) if g.response_ids
    ]


@torch.no_grad()
def measure_mismatch(model, tokenizer, prompts: Sequence[Sequence[int]], gens: Sequence[Generation], *,
                     topk: int = 0, micro_batch: int = 16) -> dict[str, float]:
    """|pi - mu| over every sampled token: mean, p99, max, share above `LARGE_DIFF`; with `topk`,
    the top-K TV (eq. 15) between mu and pi on mu's recorded top-K set: mean and max."""
    turns = as_turns(prompts, gens)
    device = next(model.parameters()).device
    diffs, tvs = [], []
    was_training = model.training
    model.eval()
    try:
        for i in range(0, len(turns), micro_batch):
            batch = collate(turns[i : i + micro_batch], pad_token_id(tokenizer), topk).to(device)
            pol = policy_logprobs(model, batch, with_topk=topk > 0, with_entropy=False)
            m = batch.response_mask  # [B, T]
            diffs.append((pol.logp[m].exp() - batch.behavior_logp[m].exp()).abs().float().cpu())  # [N]
            if topk:
                tvs.append(topk_tv(batch.topk_behavior_logp[m], pol.topk_logp[m], batch.topk_valid[m]).cpu())  # [N]
    finally:
        model.train(was_training)
    if not diffs:
        return {"tokens": 0.0}
    d = torch.cat(diffs)
    out = {
        "tokens": float(d.numel()),
        "mean": float(d.mean()),
        "p99": float(torch.quantile(d.double(), 0.99)),
        "max": float(d.max()),
        "share_large": float((d > LARGE_DIFF).double().mean()),
        "topk_tv_mean": math.nan,
        "topk_tv_max": math.nan,
    }
    if tvs:
        tv = torch.cat(tvs)
        out.update(topk_tv_mean=float(tv.mean()), topk_tv_max=float(tv.max()))
    return out


_TASKS = (
    "I have chosen a number between 1 and {hi}. Guess it; answer with \\boxed{{N}}.",
    "Compute {a} + {b} step by step and put the result within \\boxed{{}}.",
    "Write a short poem about the number {a}.",
    "List {b} prime numbers larger than {a}, then explain how you checked them.",
    "Explain in two sentences why the sky looks blue at noon and red at sunset ({a}).",
)


def sample_prompts(tokenizer, n: int, template: str = "chatml") -> list[list[int]]:
    """`n` varied chat prompts (token ids) for throughput and mismatch measurements."""
    out = []
    for i in range(n):
        text = _TASKS[i % len(_TASKS)].format(hi=10 + i, a=3 * i + 7, b=i % 9 + 2)
        out.append(list(tokenizer(render_prompt(template, text, tokenizer), add_special_tokens=False)["input_ids"]))
    return out
