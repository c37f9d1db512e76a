"""Sampling with a transformers causal LM, recording the behavior policy mu on the fly.

mu is the distribution tokens are actually sampled from: the model's raw softmax at temperature 1 (no
top-k / top-p / penalties, whatever the checkpoint's generation_config says). The engine runs its own
loop over the decoder and the LM head rather than `generate`, so no generation config or logits
processor is involved at all: each step's log-softmax is what it samples from and what it records.

A call's prompts usually share long prefixes (a group's prompt, a game's instructions on every turn):
each is prefilled once and its keys and values selected for the rows that share it; the rests of the
prompts then run as one right-padded batch at their positions (`models.prefix`), and each row decodes
at its own position (explicit position ids; padding is masked). Greedy decoding equals transformers' `generate`
token for token (tests/test_engine.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from oat_dppo.models.prefix import MIN_SHARED, plan_prefixes, prefix_forward

from .base import Generation, as_id_list, pad_token_id, token_budgets
from .base import stop_token_ids as default_stop_token_ids

__all__ = ["HFEngine", "MIN_SHARED_PROMPT"]

#: Prompts sharing at least this many leading tokens have them prefilled once.
MIN_SHARED_PROMPT = MIN_SHARED


@dataclass
class _Record:
    """Per step: log mu of each row's sampled token [B], and with top-K its K+1 slots [B, K+1]."""

    topk: int
    sampled_logp: list[torch.Tensor] = field(default_factory=list)
    slot_ids: list[torch.Tensor] = field(default_factory=list)
    slot_logp: list[torch.Tensor] = field(default_factory=list)

    def add(self, logp: torch.Tensor, tokens: torch.Tensor) -> None:
        """`logp` [B, V] log mu of this step, `tokens` [B] sampled from it."""
        tok = tokens[:, None]  # [B, 1]
        lp = logp.gather(1, tok)  # [B, 1]
        self.sampled_logp.append(lp[:, 0])
        if self.topk:
            top_logp, top_ids = logp.topk(self.topk, dim=-1)  # [B, K] each, descending
            inside = (top_ids == tok).any(dim=1, keepdim=True)  # [B, 1]
            extra_id = torch.where(inside, torch.full_like(tok, -1), tok)  # [B, 1]
            extra_lp = torch.where(inside, torch.full_like(lp, float("-inf")), lp)  # [B, 1]
            self.slot_ids.append(torch.cat([top_ids, extra_id], dim=1))  # [B, K+1]
            self.slot_logp.append(torch.cat([top_logp, extra_lp], dim=1))  # [B, K+1]


def _merge(rows: list[tuple[torch.Tensor, _Record]], pad_id: int, topk: int) -> tuple[torch.Tensor, _Record]:
    """Single-row `_sample` results as one batch: tokens [B, S] padded with `pad_id`, records padded alike."""
    S = max(t.shape[1] for t, _ in rows)
    tokens = torch.cat([torch.nn.functional.pad(t, (0, S - t.shape[1]), value=pad_id) for t, _ in rows])  # [B, S]
    merged = _Record(topk)
    for step in range(S):
        live = [(r, step < t.shape[1]) for t, r in rows]
        merged.sampled_logp.append(torch.cat([r.sampled_logp[step] if ok else r.sampled_logp[-1] for r, ok in live]))
        if topk:
            merged.slot_ids.append(torch.cat([r.slot_ids[step] if ok else r.slot_ids[-1] for r, ok in live]))
            merged.slot_logp.append(torch.cat([r.slot_logp[step] if ok else r.slot_logp[-1] for r, ok in live]))
    return tokens, merged


class HFEngine:
    """Batched sampling with a transformers causal LM; see `generate`.

    Stop tokens: the tokenizer's eos, the model generation_config's eos ids, and the pad token
    (a sampled pad ends the document too), unless `stop_token_ids` is given; plus
    `extra_stop_token_ids`. `max_context` defaults
    to `model.config.max_position_embeddings`.

    `model` is usually the learner's own model (mu = pi up to float rounding). When it is a separate
    copy (e.g. in bfloat16 under a float32 learner), `sync_weights` loads the learner's weights into it.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_context: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        extra_stop_token_ids: Sequence[int] = (),
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.pad_id = pad_token_id(tokenizer)
        if stop_token_ids is None:
            self.stop_ids = default_stop_token_ids(tokenizer, getattr(model, "generation_config", None),
                                                   extra_stop_token_ids)
        else:
            self.stop_ids = list(dict.fromkeys(as_id_list(stop_token_ids) + as_id_list(list(extra_stop_token_ids))))
        if max_context is None:
            max_context = getattr(model.config, "max_position_embeddings", None)
        self.max_context = max_context

    @torch.no_grad()
    def sync_weights(self, weights: Iterable[tuple[str, Any]]) -> float:
        """Copy `weights` ((HF parameter name, tensor) pairs, any dtype) into this engine's model, cast
        to its dtype: how a separate copy follows the learner. Returns the seconds it took."""
        t0 = time.perf_counter()
        params = dict(self.model.named_parameters())
        for name, tensor in weights:
            if name not in params:
                raise KeyError(f"the engine's model has no parameter {name!r} (a learner of another architecture?)")
            params[name].copy_(tensor)
        return time.perf_counter() - t0

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[list[int]],
        max_new_tokens: int,
        topk: int = 0,
        *,
        seed: int | None = None,
        temperature: float | None = None,
    ) -> list[Generation]:
        """Sample one response per prompt and record mu.

        Each response ends at (and includes) its first stop token ("stop"), or after its token
        budget ("length"). The budget is `max_new_tokens`, reduced per prompt so that prompt +
        response stays within `max_context`; a prompt that leaves no room for a single token makes
        the whole call raise `PromptTooLongError` (with the offending `indices`) before any work.
        `seed` makes the call reproducible without disturbing the global torch RNG; `None` uses
        (and advances) the global RNG. `temperature` (evaluations only; None: 1) other than 1 leaves the
        recorded log-probs those of temperature 1, which no learner then reads; 0 is greedy.
        """
        vocab = getattr(self.model.config, "vocab_size", None)
        if vocab is not None and topk > vocab:
            raise ValueError(f"topk={topk} exceeds the vocabulary size {vocab}")
        budgets = token_budgets(prompt_ids, max_new_tokens, topk, self.max_context)
        if not prompt_ids:
            return []
        temperature = 1.0 if temperature is None else float(temperature)
        model = self.model
        was_training = model.training
        model.eval()  # sample from the deterministic network (no dropout)
        try:
            with _rng(seed, model.device):
                new, record = self._sample(prompt_ids, budgets, topk, temperature)
        finally:
            model.train(was_training)
        return self._assemble(new, record, budgets, topk)

    def _sample(self, prompt_ids: list[list[int]], budgets: list[int], topk: int,
                temperature: float) -> tuple[torch.Tensor, _Record]:
        """The decoding loop: [B, S] sampled tokens (pad after a row finished) and their record."""
        model = self.model
        B, steps = len(prompt_ids), max(budgets)
        window = getattr(model.config, "sliding_window", None)
        if B > 1 and window and max(map(len, prompt_ids)) + steps > window:
            # A sliding window is masked by cache slot, and a padded row's slots run ahead of its positions: rows
            # that could reach the window run alone (no padding), so the window counts positions.
            rows = [self._sample([p], [b], topk, temperature) for p, b in zip(prompt_ids, budgets)]
            return _merge(rows, self.pad_id, topk)
        decoder, head = model.get_decoder(), model.get_output_embeddings()
        softcap = getattr(model.config, "final_logit_softcapping", None)
        device = model.device
        lengths = torch.tensor([len(p) for p in prompt_ids], device=device)  # [B]
        T = int(lengths.max())
        ids = torch.full((B, T), self.pad_id, dtype=torch.long, device=device)  # [B, T] right-padded
        mask = torch.zeros((B, T), dtype=torch.long, device=device)  # [B, T]
        for i, p in enumerate(prompt_ids):
            ids[i, : len(p)] = torch.as_tensor(p, dtype=torch.long)
            mask[i, : len(p)] = 1
        # Prompts sharing a prefix (a group's prompt, a game's instructions) have it prefilled once; never a
        # prompt's last token, whose logits start the sampling.
        plan = plan_prefixes(prompt_ids, [len(p) - 1 for p in prompt_ids], MIN_SHARED_PROMPT)
        out = prefix_forward(decoder, ids, mask, plan)
        cache, mask = out.cache, out.mask  # [B, P + S] the cache slots each row attends to
        hidden = out.hidden[torch.arange(B, device=device), lengths - 1 - out.offsets]  # [B, H] each row's last token

        stop = torch.as_tensor(self.stop_ids, dtype=torch.long, device=device)
        budget = torch.as_tensor(budgets, device=device)  # [B]
        done = torch.zeros(B, dtype=torch.bool, device=device)  # [B]
        record, tokens_out = _Record(topk), []
        positions = lengths.clone()  # [B] the position each row's next token takes
        for step in range(steps):
            logits = head(hidden)  # [B, V]
            if softcap:
                logits = torch.tanh(logits / softcap) * softcap
            logp = logits.float().log_softmax(-1)  # [B, V] log mu
            if temperature > 0:
                probs = logp.exp() if temperature == 1.0 else (logits.float() / temperature).softmax(-1)
                tokens = torch.multinomial(probs, 1)[:, 0]  # [B]
            else:
                tokens = logp.argmax(-1)
            tokens = torch.where(done, torch.full_like(tokens, self.pad_id), tokens)  # finished rows: pad
            record.add(logp, tokens)
            tokens_out.append(tokens)
            done = done | torch.isin(tokens, stop) | (step + 1 >= budget)
            if bool(done.all()):
                break
            mask = torch.cat([mask, (~done).long()[:, None]], dim=1)  # [B, past + 1]
            hidden = decoder(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions[:, None],
                             past_key_values=cache, use_cache=True).last_hidden_state[:, -1]  # [B, H]
            positions = positions + 1
        return torch.stack(tokens_out, dim=1), record

    def _assemble(self, new: torch.Tensor, rec: _Record, budgets: list[int], topk: int) -> list[Generation]:
        B, S = new.shape
        new_cpu = new.cpu()  # [B, S]
        logp = torch.stack(rec.sampled_logp, dim=1).cpu().numpy().astype(np.float32)  # [B, S]
        if topk:
            slot_ids = torch.stack(rec.slot_ids, dim=1).cpu().numpy().astype(np.int64)  # [B, S, K+1]
            slot_lp = torch.stack(rec.slot_logp, dim=1).cpu().numpy().astype(np.float32)  # [B, S, K+1]
        cols = torch.arange(S)[None, :]  # [1, S]
        stop = torch.as_tensor(self.stop_ids, dtype=torch.long)
        is_stop = torch.isin(new_cpu, stop) & (cols < torch.as_tensor(budgets)[:, None])  # [B, S]
        has_stop = is_stop.any(dim=1)  # [B]
        first_stop = is_stop.int().argmax(dim=1)  # [B] first True (0 when none; guarded by has_stop)
        gens = []
        for i in range(B):
            if has_stop[i]:
                L, reason = int(first_stop[i]) + 1, "stop"
            else:
                L, reason = min(budgets[i], S), "length"
            gens.append(
                Generation(
                    response_ids=new_cpu[i, :L].tolist(),
                    logprobs=logp[i, :L].copy(),
                    topk_ids=slot_ids[i, :L].copy() if topk else None,
                    topk_logprobs=slot_lp[i, :L].copy() if topk else None,
                    finish_reason=reason,
                )
            )
        return gens


class _rng:
    """Seed a private RNG stream for one call (restoring the caller's), or do nothing for seed=None."""

    def __init__(self, seed: int | None, device: torch.device):
        self.seed = seed
        self.devices = [device.index or 0] if device.type == "cuda" else []
        self._fork = None

    def __enter__(self):
        if self.seed is not None:
            self._fork = torch.random.fork_rng(devices=self.devices)
            self._fork.__enter__()
            torch.manual_seed(self.seed)
        return self

    def __exit__(self, *exc):
        if self._fork is not None:
            return self._fork.__exit__(*exc)
        return False
