"""Generation with Hugging Face `generate`, recording the behavior policy mu on the fly.

mu is the distribution tokens are actually sampled from. We make that the model's raw softmax
(temperature 1, no top-k / top-p / penalties, whatever the checkpoint's generation_config says)
and record it with a logits processor that is the only one HF runs. In transformers 4.51 custom
processors are merged *before* the sampling warpers (temperature, top-k, top-p, min-p, typical,
epsilon, eta), so a recorder only sees the sampled distribution when no warper is built at all;
`_sampling_config` guarantees that. generate() also fills fields of the config we pass from the
checkpoint's own generation_config (4.51: fields left at their global default, e.g. temperature=1.0
on SmolLM2's hub config; 5.x: every field left None, e.g. min_new_tokens, with no opt-out), so
`_blank_model_defaults` hides the checkpoint's config for the duration of the call.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from .base import Generation, as_id_list, pad_token_id, token_budgets
from .base import stop_token_ids as default_stop_token_ids

__all__ = ["HFEngine"]


class _MuRecorder(LogitsProcessor):
    """Keeps log mu of each step's sampled token (and top-K) without holding [steps, B, V].

    HF calls a processor once per step, before sampling, so step t's token is only known at the
    next call (as `input_ids[:, -1]`), or, for the last step, from generate's output (`finish`).
    Only one [B, V] buffer lives at a time.
    """

    def __init__(self, topk: int):
        self.topk = topk
        self._logp: torch.Tensor | None = None  # [B, V] log mu of the step whose token is pending
        self._top_logp: torch.Tensor | None = None  # [B, K]
        self._top_ids: torch.Tensor | None = None  # [B, K]
        self.sampled_logp: list[torch.Tensor] = []  # per step [B]
        self.slot_ids: list[torch.Tensor] = []  # per step [B, K+1]
        self.slot_logp: list[torch.Tensor] = []  # per step [B, K+1]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._logp is not None:
            self._collect(input_ids[:, -1])
        logp = scores.float().log_softmax(dim=-1)  # [B, V]
        self._logp = logp
        if self.topk:
            self._top_logp, self._top_ids = logp.topk(self.topk, dim=-1)  # [B, K] each, descending
        return scores  # untouched: sampling uses exactly what we recorded

    def finish(self, last_tokens: torch.LongTensor) -> None:
        if self._logp is not None:
            self._collect(last_tokens)
            self._logp = self._top_logp = self._top_ids = None

    def _collect(self, tokens: torch.LongTensor) -> None:
        tok = tokens[:, None]  # [B, 1]
        lp = self._logp.gather(1, tok)  # [B, 1]
        self.sampled_logp.append(lp[:, 0])
        if self.topk:
            inside = (self._top_ids == tok).any(dim=1, keepdim=True)  # [B, 1]
            extra_id = torch.where(inside, torch.full_like(tok, -1), tok)  # [B, 1]
            extra_lp = torch.where(inside, torch.full_like(lp, float("-inf")), lp)  # [B, 1]
            self.slot_ids.append(torch.cat([self._top_ids, extra_id], dim=1))  # [B, K+1]
            self.slot_logp.append(torch.cat([self._top_logp, extra_lp], dim=1))  # [B, K+1]


class _RowBudget(StoppingCriteria):
    """Per-sequence token budget (HF's max_new_tokens is one number for the whole batch)."""

    def __init__(self, prompt_len: int, budgets: torch.Tensor):
        self.prompt_len = prompt_len
        self.budgets = budgets  # [B] long

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        return (input_ids.shape[1] - self.prompt_len) >= self.budgets  # [B]


@contextlib.contextmanager
def _blank_model_defaults(model):
    """Swap every generation_config under `model` (a peft wrapper holds the HF model inside) for a
    blank one, so generate() has no checkpoint defaults to merge into `_sampling_config`."""
    saved = [(m, m.generation_config) for m in model.modules()
             if isinstance(vars(m).get("generation_config"), GenerationConfig)]
    try:
        for m, _ in saved:
            m.generation_config = GenerationConfig()
        yield
    finally:
        for m, gc in saved:
            m.generation_config = gc


def _sampling_config(max_new_tokens: int, stop_ids: list[int], pad_id: int,
                     temperature: float = 1.0) -> GenerationConfig:
    # Every field that would build a logits processor or warper is set to its "off" value explicitly
    # (temperature 1; 0 is greedy, for evaluations).
    return GenerationConfig(
        do_sample=temperature > 0,
        num_beams=1,
        temperature=temperature if temperature > 0 else 1.0,
        top_k=0,
        top_p=1.0,
        min_p=None,
        typical_p=1.0,
        epsilon_cutoff=0.0,
        eta_cutoff=0.0,
        repetition_penalty=1.0,
        encoder_repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        bad_words_ids=None,
        suppress_tokens=None,
        begin_suppress_tokens=None,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        min_length=0,
        min_new_tokens=None,
        renormalize_logits=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=stop_ids or None,  # [] (stop_token_ids=[]) means: always run to the budget
        pad_token_id=pad_id,
        use_cache=True,
        return_dict_in_generate=False,
    )


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
        """Sample one response per prompt (one batched HF generate call) and record mu.

        Each response ends at (and includes) its first stop token ("stop"), or after its token
        budget ("length"). The budget is `max_new_tokens`, reduced per prompt so that prompt +
        response stays within `max_context`; a prompt that leaves no room for a single token makes
        the whole call raise `PromptTooLongError` (with the offending `indices`) before any work.
        `seed` makes the call reproducible without disturbing the global torch RNG; `None` uses
        (and advances) the global RNG. `temperature` (evaluations only; None: 1) other than 1 leaves the
        recorded log-probs those of temperature 1, which no learner then reads.
        """
        vocab = getattr(self.model.config, "vocab_size", None)
        if vocab is not None and topk > vocab:
            raise ValueError(f"topk={topk} exceeds the vocabulary size {vocab}")
        budgets = token_budgets(prompt_ids, max_new_tokens, topk, self.max_context)
        if not prompt_ids:
            return []
        lengths = [len(p) for p in prompt_ids]
        steps = max(budgets)

        model = self.model
        device = model.device
        B, P = len(prompt_ids), max(lengths)
        input_ids = torch.full((B, P), self.pad_id, dtype=torch.long)  # [B, P] left-padded
        attention_mask = torch.zeros((B, P), dtype=torch.long)  # [B, P]
        for i, p in enumerate(prompt_ids):
            input_ids[i, P - len(p) :] = torch.as_tensor(p, dtype=torch.long)
            attention_mask[i, P - len(p) :] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)

        recorder = _MuRecorder(topk)
        stopping = StoppingCriteriaList()
        if min(budgets) < steps:
            stopping.append(_RowBudget(P, torch.as_tensor(budgets, device=device)))

        was_training = model.training
        model.eval()  # sample from the deterministic network (no dropout), with the KV cache
        try:
            with _rng(seed, device), _blank_model_defaults(model):
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    generation_config=_sampling_config(steps, self.stop_ids, self.pad_id,
                                                       1.0 if temperature is None else temperature),
                    logits_processor=LogitsProcessorList([recorder]),
                    stopping_criteria=stopping,
                )
        finally:
            model.train(was_training)

        new = out[:, P:]  # [B, S] sampled tokens (pad after a row finished)
        S = new.shape[1]
        recorder.finish(new[:, -1])
        if len(recorder.sampled_logp) != S:  # the recorder must have seen every sampling step
            raise RuntimeError(
                f"recorded {len(recorder.sampled_logp)} steps for {S} generated tokens; another logits "
                "processor or a generate() change broke mu capture"
            )
        return self._assemble(new, recorder, budgets, topk)

    def _assemble(self, new: torch.Tensor, rec: _MuRecorder, budgets: list[int], topk: int) -> list[Generation]:
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
