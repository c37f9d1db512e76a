"""log pi of the sampled response tokens, computed only where they are needed.

Prompts are long and responses short, so the LM head (the [*, V] matmul and log-softmax, the
dominant cost for small models with large vocabularies) runs only on the hidden states that predict
response tokens: [N_response, V] instead of [B, T, V].

Long responses make even [N_response, V] large (16k tokens x 151k Qwen ids x 4 bytes = 9.3 GiB per
float32 copy, and the log-softmax keeps one for backward). With `chunk_tokens`, the head runs on
blocks of response positions under activation checkpointing: each block's logits are freed after
its forward and recomputed in backward, so only one block's [chunk, V] tensors are alive at a
time. The gradient is the same; the price is one more head forward in backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from oat_dppo.learner.batch import TokenBatch
from oat_dppo.models.prefix import MIN_SHARED, PrefixPlan, plan_prefixes, prefix_forward


@dataclass
class PolicyLogprobs:
    logp: Tensor  # [B, T] float32, log pi at response tokens (grad), 0 elsewhere
    topk_logp: Tensor | None  # [B, T, S] float32, detached log pi on mu's top-K ids
    entropy: Tensor  # [B, T] float32, detached entropy of pi at response positions
    # [B, T] float32, detached log pi of the mass outside the valid top-K slots (with topk_logp)
    topk_other_logp: Tensor | None = None
    computed_tokens: int = 0  # token positions the decoder computed (padding and shared prefixes as computed)


def _decoder_and_head(model):
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    head = model.get_output_embeddings()
    return decoder, head


#: How the decoder sees a micro-batch's right-padded rows (`sequence_layout`).
LAYOUTS = ("padded", "rows", "packed", "prefix")

#: "prefix" computes a prefix its rows share once when it is at least this long (else `_rows_pay` decides).
MIN_SHARED_PREFIX = MIN_SHARED
#: Without a shared prefix, "prefix" runs a forward per row when the rows average this many tokens and padding
#: is at least this share of the grid, else the padded grid (`_rows_pay`).
ROWS_MIN_LENGTH, ROWS_MIN_PADDING = 128, 0.2


def sequence_layout(model, *, reduced_during_backward: bool = False) -> str:
    """The fastest exact way to run `model`'s decoder over a micro-batch here (`python -m benchmarks layouts`):

    * "rows": one forward per row at its own length, no padding and no mask. On a CPU (SmolLM2, 8 rows of
      180-380 tokens, 71% of the padded grid real): forward + backward 0.69x the padded time, the forward
      alone 0.35x (the causal kernel without a mask); on micro-batches sorted by length (1-6% padding, the
      local learner's plan): 0.97-1.02x, the same as padded.
    * "packed": the rows' real tokens as one sequence whose positions restart at each row, attention confined
      to each row by a block-diagonal causal mask (`_packed_mask`; a varlen kernel under flash-attention).
      On a CPU the dense mask made it 1.11x the padded time on the lengths above (attention quadratic in the
      whole sequence): offered, not chosen.
    * "prefix": each prefix a cluster of rows shares (a group's prompt; the instructions every turn of a game
      repeats) computed once, then every row's rest as a padded batch attending to it through the KV cache
      (`models.prefix`); where no cluster shares `MIN_SHARED_PREFIX` tokens, "rows" for long rows with much
      padding and "padded" otherwise (`_rows_pay`). The CPU default: on the
      local learner's micro-batches of Sudoku and GuessTheNumber turns, forward + backward 0.51x / 0.55x the
      padded time (0.39 / 0.62 of the real tokens computed). Not under ZeRO-3 (its ranks must run the same
      forwards) and not yet measured on a GPU.
    * "padded": the [B, T] batch with its mask: under DeepSpeed ZeRO-3, whose ranks must run the same number
      of forwards, and on GPUs (packed under flash-attention is the candidate there, not yet measured). And
      where the ranks' gradients are `reduced_during_backward` (ZeRO-2 with several ranks): stage 2 fills its
      flat reduction buckets in the order the parameters' gradients complete, and sums the ranks' buckets
      element by element; the prefix layout's two decoder calls complete them in another order than one call
      (a layer's q_proj after its v_proj), so a rank on it beside a rank on the padded grid would sum one
      parameter's gradient into another's (tests/test_oat_program.py's two-learner step on rows sorted by tokens:
      gradient norm 1.861 against its single-rank replay's 1.868; equal on the padded grid or under ZeRO-1)."""
    p = next(model.parameters(), None)
    # ds_numel: a ZeRO-3-partitioned parameter
    if p is None or hasattr(p, "ds_numel") or p.device.type != "cpu" or reduced_during_backward:
        return "padded"
    return "prefix"


def _rows_pay(attn: Tensor) -> bool:
    """Whether a forward per row beats the padded grid on a CPU: long rows with much padding (8 rows of 180-380
    tokens, 29% padding: 0.69x). Short rows lose to their per-call cost (the peers job's 64 rows of ~49 tokens in
    micro-batches of 8, 1-6% padding: learning 46 s a step per row against 28 s padded)."""
    lengths = attn.sum(-1).float()  # [B]
    return bool(lengths.mean() >= ROWS_MIN_LENGTH and 1 - lengths.sum() / attn.numel() >= ROWS_MIN_PADDING)


def prefix_plan(ids: Tensor, attn: Tensor, b_idx: Tensor, t_idx: Tensor) -> PrefixPlan:
    """How the rows with a response (`b_idx` row-major) share prefixes: each row's real tokens, capped before its
    first position whose hidden state predicts a response token (its min `t_idx` - 1)."""
    rows = b_idx.unique_consecutive()  # [R]
    lengths = attn[rows].sum(-1)  # [R]
    first = torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long, device=ids.device).scatter_reduce(
        0, b_idx, t_idx, reduce="amin")[rows]  # [R] each row's first response position
    return plan_prefixes([ids[r, : int(n)].tolist() for r, n in zip(rows.tolist(), lengths)],
                         [int(f) - 1 for f in first], MIN_SHARED_PREFIX)


def _prefix_hidden(decoder, ids: Tensor, attn: Tensor, b_idx: Tensor, t_idx: Tensor, plan: PrefixPlan
                   ) -> tuple[Tensor, int]:
    """`_response_hidden` with each cluster's shared prefix computed once (`models.prefix.prefix_forward`, with its
    graph: the backward sums each row's gradient into the one prefix forward): [N, H]."""
    rows = b_idx.unique_consecutive()  # [R] rows with a response (b_idx is row-major)
    out = prefix_forward(decoder, ids[rows], attn[rows], plan)
    r = torch.searchsorted(rows, b_idx)  # [N] each response token's row among `rows`
    return out.hidden[r, t_idx - 1 - out.offsets[r]], out.computed


def _response_hidden(decoder, ids: Tensor, attn: Tensor, b_idx: Tensor, t_idx: Tensor, layout: str) -> tuple[Tensor, int]:
    """The hidden states that predict the response tokens at (b_idx, t_idx), i.e. at t - 1: [N, H], and the number of
    token positions the decoder computed for them. Every layout computes the same values
    (tests/test_sequence_layout.py); rows are right-padded (`collate`)."""
    if layout == "prefix" and len(b_idx):
        rows = b_idx.unique_consecutive()
        # (transformers turns the cache off under gradient checkpointing in training)
        checkpointing = decoder.training and getattr(decoder, "gradient_checkpointing", False)
        # (a sliding window shorter than the rows would need the cache's sliding layers: not verified)
        window = getattr(getattr(decoder, "config", None), "sliding_window", None) or ids.shape[1]
        plain = not checkpointing and window >= ids.shape[1]
        plan = prefix_plan(ids, attn, b_idx, t_idx) if len(rows) > 1 and plain else None
        if plan is not None and plan.saved:
            return _prefix_hidden(decoder, ids, attn, b_idx, t_idx, plan)
        layout = "rows" if _rows_pay(attn) else "padded"
    if layout == "padded" or len(b_idx) == 0:  # (no response: one forward, so that the result carries a graph)
        hidden = decoder(input_ids=ids, attention_mask=attn.long(), use_cache=False).last_hidden_state
        return hidden[b_idx, t_idx - 1], ids.numel()
    lengths = attn.sum(-1)  # [B]
    if layout == "rows":  # only the rows with a response, each at its length (b_idx is sorted: row-major)
        parts = [decoder(input_ids=ids[b: b + 1, : int(lengths[b])], use_cache=False).last_hidden_state[0]
                 [t_idx[b_idx == b] - 1] for b in b_idx.unique_consecutive().tolist()]
        return torch.cat(parts), int(lengths[b_idx.unique_consecutive()].sum())  # [N, H]
    if layout != "packed":
        raise ValueError(f"layout {layout!r}: one of {LAYOUTS}")
    starts = lengths.cumsum(0) - lengths  # [B] each row's first index in the packed sequence
    positions = torch.cat([torch.arange(int(n), device=ids.device) for n in lengths])  # [sum L]
    hidden = decoder(input_ids=ids[attn][None], position_ids=positions[None], attention_mask=_packed_mask(decoder, lengths),
                     use_cache=False).last_hidden_state[0]
    return hidden[starts[b_idx] + t_idx - 1], int(lengths.sum())  # [N, H]


def _packed_mask(decoder, lengths: Tensor) -> Tensor | None:
    """The packed sequence's attention: causal within each row, nothing across rows, as an additive float mask
    [1, 1, L, L] (0 where a token may attend, the dtype's minimum elsewhere) that transformers uses as given on
    4.51 (Oat's pin) and 5.x alike, eager or SDPA. Position ids alone confine attention to each row only under
    flash-attention (varlen) or transformers >= 4.56 without a mask, so the mask is built everywhere but there
    (a flash kernel takes no 4D mask)."""
    if "flash" in str(getattr(getattr(decoder, "config", None), "_attn_implementation", "")):
        return None
    row = torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths)  # [L]
    index = torch.arange(len(row), device=lengths.device)  # [L]
    allowed = (row[:, None] == row[None, :]) & (index[:, None] >= index[None, :])  # [L, L]
    dtype = next(decoder.parameters()).dtype
    return torch.zeros(allowed.shape, dtype=dtype, device=lengths.device).masked_fill(
        ~allowed, torch.finfo(dtype).min)[None, None]


def _head_logprobs(head, softcap: float | None, hidden: Tensor, targets: Tensor, topk_ids: Tensor | None,
                   topk_valid: Tensor | None, with_entropy: bool, stats: dict[str, Tensor]) -> Tensor:
    """log pi(target) for one block of response positions: [n, H] -> [n] (grad).

    Fills `stats` (detached entropy [n], log pi on `topk_ids` [n, S] and log pi of the mass outside
    the valid slots [n]) once, on the forward call. Under checkpointing the backward's recompute
    finds it filled and skips that work.
    """
    logits = head(hidden)  # [n, V]
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    logp_all = logits.float().log_softmax(-1)  # [n, V]
    if not stats.get("filled"):
        stats["filled"] = True
        with torch.no_grad():
            probs = logp_all.exp() if with_entropy or topk_ids is not None else None  # [n, V]
            if with_entropy:
                stats["entropy"] = -_rowwise_dot(probs, logp_all)  # [n]
            if topk_ids is not None:
                stats["topk"] = logp_all.gather(-1, topk_ids)  # [n, S]
                stats["topk_other"] = _other_logp(probs, topk_ids, topk_valid)  # [n]
    return logp_all.gather(-1, targets[:, None])[:, 0]  # [n]


def _rowwise_dot(a: Tensor, b: Tensor, rows_per_pass: int = 256) -> Tensor:
    """[n, V] x [n, V] -> [n]: sum_v a*b per row, a few rows at a time.

    Elementwise product then sum keeps float32's pairwise-summation accuracy (entropy within ~1e-6
    of float64 at V = 49k); einsum/bmm accumulates V terms in one dot product and was off by 4e-4.
    Passes of `rows_per_pass` rows bound the temporary to [rows_per_pass, V] instead of [n, V].
    """
    return torch.cat([(a[i : i + rows_per_pass] * b[i : i + rows_per_pass]).sum(-1)
                      for i in range(0, a.shape[0], rows_per_pass)]) if a.shape[0] else a.new_zeros(0)


def _other_logp(probs: Tensor, topk_ids: Tensor, topk_valid: Tensor | None) -> Tensor:
    """[n] log of pi's mass outside the valid slots: the ids not in TopK(mu) ∪ {a_t}, summed directly.

    1 - sum(slots) would cancel: for a sharp pi the float32 slots sum to 1 +- 1e-7 and a tail of
    1e-9 is lost (issue 11). Summing the tail's own probabilities keeps it to float32's relative
    precision, consistent with the log pi values the learner trains on. Zeroes the slots of `probs`
    in place ([n, V], consumed); unused slots (id 0, `topk_valid` False) multiply by 1, so a repeated
    id cannot undo a zero. Tails below float32's ~1e-38 read as 0, i.e. 1e-30 in the divergence.
    """
    # [n, S]: 0 on valid slots, 1 on unused ones
    keep = torch.zeros_like(topk_ids, dtype=probs.dtype) if topk_valid is None else (~topk_valid).to(probs.dtype)
    probs.scatter_reduce_(-1, topk_ids, keep, reduce="prod")
    return probs.sum(-1).log()  # [n]


def policy_logprobs(model, batch: TokenBatch, *, with_topk: bool = False, with_entropy: bool = True,
                    chunk_tokens: int = 0, layout: str | None = None) -> PolicyLogprobs:
    """Forward `batch` through `model` and gather log pi(a_t|s_t) at the response tokens.

    `chunk_tokens > 0`: apply the LM head to at most that many response positions at a time,
    checkpointed when gradients are on (see the module docstring). 0: one block.
    `layout`: how the decoder sees the rows (`LAYOUTS`); None: `sequence_layout(model)`.
    """
    ids, attn, resp = batch.input_ids, batch.attention_mask, batch.response_mask  # [B, T]
    B, T = ids.shape
    if with_topk and batch.topk_ids is None:
        raise ValueError("with_topk needs batch.topk_ids (record top-K log-probs at rollout)")
    # Response token at position t is predicted from the hidden state at t - 1.
    b_idx, t_idx = resp.nonzero(as_tuple=True)  # [N] each
    targets = ids[b_idx, t_idx]  # [N]
    topk_ids = batch.topk_ids[b_idx, t_idx] if with_topk else None  # [N, S]
    topk_valid = batch.topk_valid[b_idx, t_idx] if with_topk else None  # [N, S]
    decoder, head = _decoder_and_head(model)
    if decoder is not None and head is not None:
        inputs, computed = _response_hidden(decoder, ids, attn, b_idx, t_idx, layout or sequence_layout(model))  # [N, H]
    else:  # a model without the usual split: full logits, then select; the "head" is the identity
        inputs = model(input_ids=ids, attention_mask=attn.long(), use_cache=False).logits[b_idx, t_idx - 1]  # [N, V]
        computed = ids.numel()
        head = torch.nn.Identity()
    softcap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)

    N = targets.shape[0]
    step = chunk_tokens if 0 < chunk_tokens < N else max(N, 1)
    checkpointed = step < N and torch.is_grad_enabled()
    logp_parts, entropy_parts, topk_parts, other_parts = [], [], [], []
    for i in range(0, max(N, 1), step):  # N == 0: one empty block, so logp still carries a graph
        rows = slice(i, i + step)
        stats: dict = {}
        block = (head, softcap, inputs[rows], targets[rows], None if topk_ids is None else topk_ids[rows],
                 None if topk_valid is None else topk_valid[rows], with_entropy, stats)
        if checkpointed:
            logp_parts.append(checkpoint(_head_logprobs, *block, use_reentrant=False))
        else:
            logp_parts.append(_head_logprobs(*block))
        entropy_parts.append(stats.get("entropy"))
        topk_parts.append(stats.get("topk"))
        other_parts.append(stats.get("topk_other"))

    logp = torch.zeros(B, T, dtype=torch.float32, device=ids.device)
    entropy = torch.zeros(B, T, dtype=torch.float32, device=ids.device)
    topk_logp = topk_other_logp = None
    logp = logp.index_put((b_idx, t_idx), torch.cat(logp_parts))  # [B, T], grad
    if with_entropy:
        entropy[b_idx, t_idx] = torch.cat(entropy_parts)
    if with_topk:
        topk_logp = torch.full((B, T, batch.topk_ids.shape[-1]), float("-inf"), device=ids.device)
        topk_logp[b_idx, t_idx] = torch.cat(topk_parts)  # [N, S]
        topk_other_logp = torch.full((B, T), float("-inf"), device=ids.device)
        topk_other_logp[b_idx, t_idx] = torch.cat(other_parts)  # [N]
    return PolicyLogprobs(logp=logp, topk_logp=topk_logp, entropy=entropy, topk_other_logp=topk_other_logp,
                          computed_tokens=computed)
