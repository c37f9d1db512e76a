"""`VLLMEngine`: the project's `Engine` protocol over a vLLM `LLM` (inside an Oat actor).

The agent loop (`oat_dppo.agent.play_episodes`) is engine-agnostic; this is the vLLM side of it.
It turns vLLM 0.8.4's per-position log-prob maps (`dict[token_id, Logprob(logprob, rank, ...)]`)
into the project's compact arrays:

    logprobs       [L]       float32  log mu of each sampled token
    topk_ids       [L, K+1]  int64    mu's top-K ids (descending) + the sampled id in slot K when it
                                      is outside the top-K, else -1
    topk_logprobs  [L, K+1]  float32  log mu on those ids, -inf on unused slots

mu is the sampling distribution only at temperature 1, top_p 1, top_k -1: vLLM's V1 sampler returns
log-probs of the raw logits, before any of these (args.finalize refuses other values for training).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from oat_dppo.engine.base import Generation, token_budgets

# vLLM: `llm.generate(prompts, sampling_params=[...], ...)` -> list[RequestOutput]; the actor wraps it
# (LoRA request, Oat's generate_mode flag for weight sync).
GenerateFn = Callable[[list, list], list]


def generation_from_completion(completion: Any, topk: int = 0) -> Generation:
    """One vLLM `CompletionOutput` -> `Generation`. Raises if vLLM returned no log-probs (the
    request must set `logprobs`) or a position lacks the sampled token."""
    ids = [int(t) for t in completion.token_ids]
    L = len(ids)
    maps = completion.logprobs
    if maps is None or len(maps) != L:
        got = None if maps is None else len(maps)
        raise RuntimeError(f"vLLM returned {got} log-prob maps for {L} tokens; the request must set logprobs >= 1")
    logp = np.empty(L, dtype=np.float32)
    if topk:
        slot_ids = np.full((L, topk + 1), -1, dtype=np.int64)
        slot_lp = np.full((L, topk + 1), -np.inf, dtype=np.float32)
    for t, (tok, pos) in enumerate(zip(ids, maps)):
        entry = pos.get(tok)
        if entry is None:
            raise RuntimeError(f"vLLM's log-prob map at position {t} lacks the sampled token {tok}")
        logp[t] = entry.logprob
        if not topk:
            continue
        # vLLM returns the top-K plus the sampled token: K entries when it is among them, K + 1 when
        # not. Ranks can tie at the boundary, so "outside" is decided by the count, and the order by
        # log-prob (descending; rank then id break ties).
        outside = len(pos) > topk
        top = [(tid, e) for tid, e in pos.items() if not (outside and tid == tok)]
        top.sort(key=lambda x: (-x[1].logprob, x[1].rank if x[1].rank is not None else 0, x[0]))
        top = top[:topk]
        for k, (tid, e) in enumerate(top):
            slot_ids[t, k] = tid
            slot_lp[t, k] = e.logprob
        if outside or all(tid != tok for tid, _ in top):
            slot_ids[t, topk] = tok
            slot_lp[t, topk] = entry.logprob
    return Generation(
        response_ids=ids,
        logprobs=logp,
        topk_ids=slot_ids if topk else None,
        topk_logprobs=slot_lp if topk else None,
        # "stop": EOS or a stop token; "length" (budget or context) and "abort" are both cut responses.
        finish_reason="stop" if completion.finish_reason == "stop" else "length",
    )


class VLLMEngine:
    """Batched sampling with vLLM; implements `oat_dppo.engine.base.Engine`.

    generate_fn:     the actor's call into `vllm.LLM.generate` (prompts, one SamplingParams each).
    sampling_params: `vllm.SamplingParams` (the class; passed in so that this module imports without
                     vLLM, and tests use the fake's record).
    max_context:     the model's context (vLLM's max_model_len); responses are cut to fit it.
    stop_token_ids:  extra stop tokens (as the HF engine: the tokenizer's EOS and the pad token).
    temperature/top_p/top_k: 1 / 1 / -1 for training (mu = the sampling distribution); the actor's
                     evaluation engine uses Oat's eval_* settings.
    """

    def __init__(
        self,
        generate_fn: GenerateFn,
        sampling_params: type,
        *,
        max_context: int | None,
        stop_token_ids: Sequence[int] = (),
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
    ):
        self.generate_fn = generate_fn
        self.sampling_params = sampling_params
        self.max_context = max_context
        self.stop_token_ids = list(dict.fromkeys(int(i) for i in stop_token_ids))
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k

    def generate(
        self, prompt_ids: list[list[int]], max_new_tokens: int, topk: int = 0, *, seed: int | None = None
    ) -> list[Generation]:
        # vLLM would reject an over-long request; the agent loop ends those episodes instead.
        budgets = token_budgets(prompt_ids, max_new_tokens, topk, self.max_context)
        if not prompt_ids:
            return []
        params = [
            self.sampling_params(
                n=1,
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                max_tokens=b,
                # The sampled token's log-prob comes with any logprobs >= 1 (Oat asks for 1 too);
                # top-K strategies ask for K, which vLLM caps at max_logprobs (set by the actor).
                logprobs=max(topk, 1),
                stop_token_ids=self.stop_token_ids or None,
                # Distinct per request: group members share a prompt and must not share a sample.
                seed=None if seed is None else (seed + i) & 0x7FFFFFFF,
            )
            for i, b in enumerate(budgets)
        ]
        outputs = self.generate_fn([{"prompt_token_ids": list(p)} for p in prompt_ids], params)
        if len(outputs) != len(prompt_ids):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompt_ids)} prompts")
        return [generation_from_completion(o.outputs[0], topk) for o in outputs]
