"""log pi of the sampled response tokens, computed only where they are needed.

Prompts are long and responses short, so the LM head (the [*, V] matmul and log-softmax, the
dominant cost for small models with large vocabularies) runs only on the hidden states that predict
response tokens: [N_response, V] instead of [B, T, V].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from oat_dppo.learner.batch import TokenBatch


@dataclass
class PolicyLogprobs:
    logp: Tensor  # [B, T] float32, log pi at response tokens (grad), 0 elsewhere
    topk_logp: Tensor | None  # [B, T, S] float32, detached log pi on mu's top-K ids
    entropy: Tensor  # [B, T] float32, detached entropy of pi at response positions


def _decoder_and_head(model):
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    head = model.get_output_embeddings()
    return decoder, head


def policy_logprobs(model, batch: TokenBatch, *, with_topk: bool = False, with_entropy: bool = True) -> PolicyLogprobs:
    """Forward `batch` through `model` and gather log pi(a_t|s_t) at the response tokens."""
    ids, attn, resp = batch.input_ids, batch.attention_mask, batch.response_mask  # [B, T]
    B, T = ids.shape
    # Response token at position t is predicted from the hidden state at t - 1.
    b_idx, t_idx = resp.nonzero(as_tuple=True)  # [N] each
    decoder, head = _decoder_and_head(model)
    if decoder is not None and head is not None:
        hidden = decoder(input_ids=ids, attention_mask=attn.long(), use_cache=False).last_hidden_state  # [B, T, H]
        logits = head(hidden[b_idx, t_idx - 1])  # [N, V]
    else:  # a model without the usual split: full logits, then select
        logits = model(input_ids=ids, attention_mask=attn.long(), use_cache=False).logits[b_idx, t_idx - 1]
    cap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    logp_all = logits.float().log_softmax(-1)  # [N, V]
    targets = ids[b_idx, t_idx]  # [N]
    logp = torch.zeros(B, T, dtype=torch.float32, device=ids.device)
    logp = logp.index_put((b_idx, t_idx), logp_all.gather(-1, targets[:, None])[:, 0])  # [B, T], grad
    topk_logp = None
    entropy = torch.zeros(B, T, dtype=torch.float32, device=ids.device)
    with torch.no_grad():
        if with_topk:
            if batch.topk_ids is None:
                raise ValueError("with_topk needs batch.topk_ids (record top-K log-probs at rollout)")
            S = batch.topk_ids.shape[-1]
            topk_logp = torch.full((B, T, S), float("-inf"), device=ids.device)
            topk_logp[b_idx, t_idx] = logp_all.gather(-1, batch.topk_ids[b_idx, t_idx])  # [N, S]
        if with_entropy:
            entropy[b_idx, t_idx] = -(logp_all.exp() * logp_all).sum(-1)
    return PolicyLogprobs(logp=logp, topk_logp=topk_logp, entropy=entropy)
