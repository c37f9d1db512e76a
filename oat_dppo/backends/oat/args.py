"""`DPPOArgs`: Oat's `PPOArgs` plus the local backend's options, with the same names.

One command line works on both backends. Every `oat_dppo.config.TrainConfig` option is accepted here,
in one of four ways (`OPTION_ROUTES`; a test keeps the table complete as TrainConfig grows):

* own:        environment, template, trust-region, advantage options: fields of DPPOArgs, used by
              the actor and the learner exactly as on the local backend;
* same name:  Oat has the option already (temperature, learning_rate, seed, ...): Oat's field,
              with Oat's default;
* alias:      Oat has it under another name (`--model` = `--pretrain`, `--max-new-tokens` =
              `--generate-max-length`, `--group-size` = `--num-samples`, `--mini-batch-size` =
              `--train-batch-size`, ...): Oat's field, reachable by both names;
* local only: device, threads, progress, log_episodes (ignored), trainable_layers and resume
              (refused with a message: they have no Oat counterpart).

The base class is the real `oat.algorithms.ppo.PPOArgs` where it imports (GPU machines), otherwise a
stand-in with the same fields read from Oat's installed sources (`source_fields`), so that
`--backend oat --help` lists every Oat option on a machine without vLLM.

`finalize(args)` resolves the derived settings and checks the combination; every violation is one
`ConfigError` line (exit status 2 from the CLI).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import typing
from pathlib import Path
from typing import Annotated, Any, Optional

import tyro

from oat_dppo import config as _config
from oat_dppo.backends.oat.source_fields import as_dataclass_fields, oat_ppo_args_fields, read_dataclass
from oat_dppo.config import ConfigError, TrainConfig

# ---------------------------------------------------------------------------------------------
# How each TrainConfig option reaches Oat
# ---------------------------------------------------------------------------------------------

#: TrainConfig name -> Oat field that means the same thing.
OAT_ALIASES: dict[str, str] = {
    "model": "pretrain",
    "max_new_tokens": "generate_max_length",
    "group_size": "num_samples",
    "mini_batch_size": "train_batch_size",
    "micro_batch_size": "train_batch_size_per_device",
    "max_grad_norm": "max_norm",
    "run_dir": "save_path",
    "eval_every": "eval_steps",
    "save_every": "save_steps",
    "wandb_project": "wb_project",
    "vllm_gpu_memory_utilization": "vllm_gpu_ratio",
}
#: Options of the one-process backend with no Oat counterpart: accepted so that a local command line
#: parses; the first four are ignored, the last two refused when set (see `finalize`).
LOCAL_ONLY: tuple[str, ...] = ("device", "threads", "progress", "log_episodes", "vllm_dtype", "vllm_enforce_eager",
                               "engine", "trainable_layers", "resume")
#: Own options whose default differs here: None means "derive it from Oat's settings" (finalize).
OWN_DEFAULT_OVERRIDES: dict[str, Any] = {
    "episodes_per_iteration": None,  # -> rollout_batch_size x num_samples
    "iterations": None,  # -> Oat's max_train
    "aggregation": None,  # -> from --critic-type (drgrpo: seq_sum_constant_length)
    "log": None,  # Oat logs to stdout, and to wandb with --use-wb (or --log wandb)
    "dtype": None,  # -> Oat's --bf16 / --fp16
    "logits_chunk_tokens": None,  # -> the local default, or 0 under ZeRO-3 with LoRA
}

#: Oat fields re-declared with the project's default (and why).
OAT_DEFAULT_OVERRIDES: dict[str, tuple[Any, Any, str]] = {
    # name: (type or None to keep Oat's, default, help)
    "pretrain": (None, "Qwen/Qwen3-1.7B-Base", "Policy: a Hugging Face id or local path (vLLM loads it too)."),
    "generate_max_length": (Optional[int], None, "Response token budget per turn (default: the environment's preset, 4096 for GEM ids)."),
    "eval_generate_max_length": (Optional[int], None, "Token budget per evaluation turn (default: --generate-max-length)."),
    "gamma": (Optional[float], None, "Discount over turns (default: the environment's preset: 0.9 for games, 1.0 otherwise)."),
    "num_samples": (None, 1, "Episodes per start state (same seed), as --group-size on the local backend; >1 enables group baselines (--advantage group)."),
    "tis_c": (None, None, "Oat's truncated IS (pi_old/mu clamped at tis_c). Off for DPPO: with --behavior rollout the weight is already pi/mu (truncate it with --C); only meaningful with --behavior recompute."),
    "beta": (None, 0.0, "KL-to-reference coefficient. Must be 0: the DPPO learner has no reference model (the paper's runs use 0)."),
    "cliprange": (Optional[float], None, "Oat's PPO clip: for ppo_clip strategies, sets --eps-low and --eps-high when they are not given."),
    "use_fused_lm_head": (None, False, "Unused by the DPPO learner: it computes log pi (and pi on mu's top-K ids) with the LM head applied only at response positions, in checkpointed blocks of --logits-chunk-tokens: never a [B, T, V] tensor."),
    "pi_buffer_maxlen_per_device": (Optional[int], None, "Turns a learner buffers per learning round (default: exactly "
                                    "one round: rollout-batch-size-per-device x group size x steps per update)."),
    "lr_scheduler": (None, "constant", "Learning-rate schedule (constant: as the local backend and GEM's/Oat's RL "
                     "scripts; Oat sizes decaying schedules by prompt count, not by optimizer steps)."),
    "algo": (None, "PPO", "Fixed to PPO for this backend."),
    "oracle": (None, "", "Unused: rewards come from the environments."),
    "prompt_data": (None, "", "Unused: prompts come from the environments."),
}

#: Help for own options whose meaning on Oat needs saying.
OWN_HELP: dict[str, str] = {
    "episodes_per_iteration": "Episodes per learning round over all actors: sets --rollout-batch-size to this / "
                              "--group-size, split evenly over the learners (default: --rollout-batch-size x --group-size).",
    "iterations": "Learning rounds (rollout + update); default: until Oat's --max-train turns.",
    "aggregation": "Loss aggregation (default: from --critic-type: drgrpo -> seq_sum_constant_length, Oat's "
                   "masked_sum / generate_max_length; grpo -> seq_mean_token_mean).",
    "log": "wandb: log to Weights & Biases (as --use-wb). Oat always logs to stdout.",
    "dtype": "bfloat16 / float16 / float32: sets Oat's --bf16 / --fp16 (default: Oat's --bf16).",
    "eval_episodes": "Held-out episodes per evaluation (every --eval-steps steps), split over the actors; 0: none.",
    "logits_chunk_tokens": "Response tokens per LM-head block: a block's [tokens, vocab] logits are recomputed in "
                           "backward (activation checkpointing) instead of kept for the whole micro-batch; 0: one block. "
                           f"Default {TrainConfig.logits_chunk_tokens}, but 0 with --zero-stage 3 and --lora-rank: "
                           "DeepSpeed 0.16.8 partitions the frozen LM head again before the recompute "
                           "(deepspeedai/DeepSpeed#8148).",
}

_HELP = {
    "vllm_max_logprobs": "vLLM's max_logprobs (top-K strategies record K log-probs per token; default max(20, K)).",
}


def _unannotate(t: Any) -> tuple[Any, tuple[str, ...]]:
    """(the bare type, tyro aliases) of a possibly `Annotated[T, tyro.conf.arg(aliases=...)]` hint."""
    if typing.get_origin(t) is Annotated:
        aliases: tuple[str, ...] = ()
        for meta in t.__metadata__:
            aliases += tuple(getattr(meta, "aliases", None) or ())
        return t.__origin__, aliases
    return t, ()


def _arg(t: Any, *, help: str = "", aliases: tuple[str, ...] = ()) -> Any:
    kw: dict[str, Any] = {}
    if help:
        kw["help"] = help
    if aliases:
        kw["aliases"] = tuple(dict.fromkeys(aliases))
    return Annotated[t, tyro.conf.arg(**kw)] if kw else t


# ---------------------------------------------------------------------------------------------
# The base: Oat's PPOArgs, or the same fields read from Oat's sources
# ---------------------------------------------------------------------------------------------


def _oat_base() -> tuple[type | None, str]:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:  # skip a slow import (torch, deepspeed) that must fail
        return _from_source("ModuleNotFoundError: No module named 'vllm'")
    try:
        from oat.algorithms.ppo import PPOArgs  # imports vLLM (and torch, deepspeed)

        return PPOArgs, "oat"
    except Exception as e:  # ImportError without vLLM; OSError/ValueError on a broken CUDA stack
        return _from_source(f"{type(e).__name__}: {e}")


def _from_source(reason: str) -> tuple[type | None, str]:
    fields = oat_ppo_args_fields()
    if fields is None:
        return None, f"oat-llm is not installed ({reason})"
    spec = as_dataclass_fields(fields, lambda f: _arg(f.type(), help=f.help))
    cls = dataclasses.make_dataclass("PPOArgs", spec)
    cls.__module__ = __name__
    cls.__qualname__ = "OatPPOArgsFromSource"
    cls.__doc__ = "Oat's PPOArgs, read from the installed sources (oat.algorithms.ppo does not import here)."
    return cls, f"read from Oat's installed sources (oat.algorithms.ppo does not import here: {reason})"


def _build(base: type | None) -> type:
    train_hints = typing.get_type_hints(TrainConfig, include_extras=True)
    train_docs = {f.name: f.help for f in read_dataclass(Path(_config.__file__).read_text(), "TrainConfig")}
    base_fields = {f.name: f for f in dataclasses.fields(base)} if base is not None else {}
    base_hints = typing.get_type_hints(base, include_extras=True) if base is not None else {}
    oat_docs = {f.name: f.help for f in (oat_ppo_args_fields() or [])}
    aliases_of: dict[str, tuple[str, ...]] = {}
    for ours, theirs in OAT_ALIASES.items():
        aliases_of[theirs] = aliases_of.get(theirs, ()) + ("--" + ours.replace("_", "-"),)

    spec: list[tuple] = []
    # Oat fields that get an alias or the project's default (they keep their place in Oat's order).
    for name in base_fields:
        if name not in aliases_of and name not in OAT_DEFAULT_OVERRIDES:
            continue
        f = base_fields[name]
        t, old_aliases = _unannotate(base_hints[name])
        typ, default, help_ = OAT_DEFAULT_OVERRIDES.get(name, (None, dataclasses.MISSING, ""))
        if typ is not None:
            t = typ
        help_ = help_ or oat_docs.get(name, "")
        if default is dataclasses.MISSING:
            field = dataclasses.field(default=f.default) if f.default is not dataclasses.MISSING else \
                dataclasses.field(default_factory=f.default_factory)
        else:
            field = dataclasses.field(default=default)
        spec.append((name, _arg(t, help=help_, aliases=old_aliases + aliases_of.get(name, ())), field))
    # The local backend's options that Oat lacks.
    for f in dataclasses.fields(TrainConfig):
        if f.name in OAT_ALIASES or f.name in base_fields:
            continue
        t, aliases = _unannotate(train_hints[f.name])
        default = f.default
        if f.name in OWN_DEFAULT_OVERRIDES:
            default = OWN_DEFAULT_OVERRIDES[f.name]
            if default is None and typing.get_origin(t) is not typing.Union:
                t = Optional[t]
        help_ = OWN_HELP.get(f.name) or train_docs.get(f.name, "")
        if f.name in LOCAL_ONLY:
            refused = f.name in ("trainable_layers", "resume", "engine")
            help_ = f"[local backend only: {'refused' if refused else 'ignored'} here] " + help_
        spec.append((f.name, _arg(t, help=help_, aliases=aliases), dataclasses.field(default=default)))
    spec.append(("vllm_max_logprobs", _arg(Optional[int], help=_HELP["vllm_max_logprobs"]), dataclasses.field(default=None)))

    cls = dataclasses.make_dataclass("DPPOArgs", spec, bases=(base,) if base is not None else ())
    # launchpad pickles the args into every node: the class must be found by reference.
    cls.__module__ = __name__
    cls.__qualname__ = "DPPOArgs"
    cls.__doc__ = (
        "Train an LLM agent with a pluggable trust region on Oat (vLLM actors, DeepSpeed learners).\n\n"
        "The local backend's options (env, template, trust region) keep their names; Oat's own options "
        "follow. See docs/gpu.md."
    )
    return cls


OatPPOArgs, OAT_ARGS_SOURCE = _oat_base()
if OatPPOArgs is not None and OatPPOArgs.__qualname__ == "OatPPOArgsFromSource":
    OatPPOArgsFromSource = OatPPOArgs  # importable by name (pickling)
DPPOArgs = _build(OatPPOArgs)


def option_routes() -> dict[str, str]:
    """For every TrainConfig option: "own", "same-name", "alias:<oat field>" or "local-only"."""
    base = {f.name for f in dataclasses.fields(OatPPOArgs)} if OatPPOArgs is not None else set()
    routes = {}
    for f in dataclasses.fields(TrainConfig):
        if f.name in OAT_ALIASES:
            routes[f.name] = f"alias:{OAT_ALIASES[f.name]}"
        elif f.name in LOCAL_ONLY:
            routes[f.name] = "local-only"
        elif f.name in base:
            routes[f.name] = "same-name"
        else:
            routes[f.name] = "own"
    return routes


def parse(argv: list[str]) -> Any:
    """`DPPOArgs` from a command line (prints help and exits on --help)."""
    import warnings

    with warnings.catch_warnings():
        # Oat annotates some fields `str` with default None; tyro warns about each. Not ours to fix.
        warnings.filterwarnings("ignore", message="The field .* is annotated with type", category=UserWarning)
        return tyro.cli(DPPOArgs, args=argv, description=_help_description())


def _help_description() -> str:
    text = DPPOArgs.__doc__ or ""
    if OAT_ARGS_SOURCE != "oat":
        text += f"\n\nNote: Oat's options are {OAT_ARGS_SOURCE}."
    return text


# ---------------------------------------------------------------------------------------------
# TrainConfig view: the local backend's helpers (envs, templates, trust region) take one
# ---------------------------------------------------------------------------------------------

_CRITIC_AGGREGATION = {"drgrpo": "seq_sum_constant_length", "grpo": "seq_mean_token_mean"}


def aggregation_of(args) -> str:
    """--aggregation, or the aggregation Oat's --critic-type implies (drgrpo: masked_sum over the
    response budget, Oat's default; grpo: per-sequence token mean)."""
    if args.aggregation is not None:
        return args.aggregation
    return _CRITIC_AGGREGATION.get(args.critic_type, "seq_sum_constant_length")


def to_train_config(args) -> TrainConfig:
    """The same run as a `TrainConfig` (only the fields the shared code reads are meaningful)."""
    epi = args.episodes_per_iteration or args.rollout_batch_size * max(args.num_samples, 1)
    return TrainConfig(
        env=args.env,
        math_data=args.math_data,
        max_turns=args.max_turns,
        format_penalty=args.format_penalty,
        template=args.template,
        system_prompt=args.system_prompt,
        response_prefix=args.response_prefix,
        model=args.pretrain,
        max_new_tokens=args.generate_max_length,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        trust_region=args.trust_region,
        delta=args.delta,
        eps_low=args.eps_low,
        eps_high=args.eps_high,
        alpha=args.alpha,
        direction=args.direction,
        clip_c=args.clip_c,
        anchor=args.anchor,
        topk=args.topk,
        behavior=args.behavior,
        learning_rate=args.learning_rate,
        num_ppo_epochs=args.num_ppo_epochs,
        mini_batch_size=args.train_batch_size,
        micro_batch_size=args.train_batch_size_per_device,
        logits_chunk_tokens=args.logits_chunk_tokens,
        max_grad_norm=args.max_norm,
        aggregation=aggregation_of(args),
        advantage=args.advantage,
        gamma=args.gamma,
        iterations=args.iterations or 1,
        seed=args.seed,
        episodes_per_iteration=epi,
        group_size=args.num_samples,
        eval_every=max(0, args.eval_steps),
        eval_episodes=args.eval_episodes,
        save_every=max(0, args.save_steps),
        lora_rank=args.lora_rank,
        backend="oat",
    )


# ---------------------------------------------------------------------------------------------
# Resolution and validation
# ---------------------------------------------------------------------------------------------


def learner_world_size(args) -> int:
    """Learner ranks, as `oat.interface.get_program` splits the GPUs (all of them when collocated,
    else the second half; an odd count shares one GPU)."""
    per_group = args.gpus if args.collocate else args.gpus - args.gpus // 2
    return per_group * args.num_groups


def finalize(args, *, world_size: int | None = None) -> list[str]:
    """Resolve derived settings in place and check the combination. Returns notes (ignored options);
    raises `ConfigError` (one line) on the first violation. Needs no GPU and no Oat import.
    `world_size` overrides the learner count derived from --gpus (CPU tests run one rank, gpus=0)."""
    notes: list[str] = []
    # -- options of the local backend ------------------------------------------------------------
    if args.trainable_layers:
        raise ConfigError("--trainable-layers is local-backend only; on Oat use --lora-rank (or full fine-tuning)")
    if args.resume:
        raise ConfigError("--resume is local-backend only; Oat resumes DeepSpeed checkpoints with --resume-dir DIR")
    if args.engine == "hf":
        raise ConfigError("--engine hf is local-backend only; Oat's actors sample with vLLM")
    ignored = [n for n in ("device", "threads", "progress", "log_episodes", "vllm_dtype", "vllm_enforce_eager")
               if getattr(args, n) != getattr(TrainConfig, n)]
    if ignored:
        notes.append(f"ignored on the Oat backend: {', '.join('--' + n.replace('_', '-') for n in ignored)}")
    if args.log == "wandb":
        args.use_wb = True
    elif args.log == "tensorboard":
        notes.append("--log tensorboard: Oat logs to stdout and to wandb (--use-wb); no tensorboard files")
    if args.dtype is not None:
        args.bf16, args.fp16 = args.dtype == "bfloat16", args.dtype == "float16"

    # -- what the learner cannot do ----------------------------------------------------------------
    if args.critic_type == "ppo":
        raise ConfigError("--critic-type ppo (a learned critic) is not supported by the DPPO learner; "
                          "use drgrpo or grpo (advantages come from the actor, --advantage)")
    if args.reinforce_update:
        raise ConfigError("--reinforce-update bypasses the trust region; use --trust-region pg_is")
    if args.beta or args.kl_penalty_coef:
        raise ConfigError(f"--beta {args.beta} / --kl-penalty-coef {args.kl_penalty_coef}: the DPPO learner has "
                          "no reference model; use 0 (the paper's runs do)")

    # -- trust region and sampling ------------------------------------------------------------------
    if args.cliprange is not None:
        if not args.trust_region.startswith("ppo_clip"):
            raise ConfigError(f"--cliprange sets the ratio clip of ppo_clip strategies, not of "
                              f"--trust-region {args.trust_region}")
        args.eps_low = args.cliprange if args.eps_low is None else args.eps_low
        args.eps_high = args.cliprange if args.eps_high is None else args.eps_high
    if args.generate_max_length is None or args.gamma is None:
        from oat_dppo.envs import get_preset  # cheap: no GEM import

        preset = get_preset(args.env)
        if args.generate_max_length is None:
            args.generate_max_length = preset.max_new_tokens
        if args.gamma is None:
            args.gamma = preset.gamma
    if args.eval_generate_max_length is None:
        args.eval_generate_max_length = args.generate_max_length
    # Checkpointed LM-head blocks recompute the head in backward; under ZeRO-3 a *frozen* head (LoRA)
    # is partitioned again by then, and torch's recompute check fails (deepspeedai/DeepSpeed#8148).
    frozen_partitioned_head = args.zero_stage == 3 and args.lora_rank > 0
    if args.logits_chunk_tokens is None:
        args.logits_chunk_tokens = 0 if frozen_partitioned_head else TrainConfig.logits_chunk_tokens
        if frozen_partitioned_head:
            notes.append("--zero-stage 3 with --lora-rank: the LM head runs in one block (--logits-chunk-tokens 0)")
    elif args.logits_chunk_tokens > 0 and frozen_partitioned_head:
        raise ConfigError(f"--logits-chunk-tokens {args.logits_chunk_tokens} with --zero-stage 3 and --lora-rank "
                          f"{args.lora_rank}: DeepSpeed 0.16.8 cannot recompute a block whose frozen, partitioned LM "
                          "head it has released (deepspeedai/DeepSpeed#8148); use --logits-chunk-tokens 0 or "
                          "--zero-stage 2")
    cfg = to_train_config(args)
    _config.validate(cfg)  # temperature 1 / top_p 1 / top_k -1, math data, ranges (same checks as local)
    from oat_dppo.backends.local import build_trust_region

    tr = build_trust_region(cfg)  # a bad strategy or parameter -> ConfigError
    K = int(getattr(tr, "topk", 0))
    if args.vllm_max_logprobs is None:
        args.vllm_max_logprobs = max(20, K)
    elif K > args.vllm_max_logprobs:
        raise ConfigError(f"--trust-region {args.trust_region} records the top {K} log-probs per token, more than "
                          f"--vllm-max-logprobs {args.vllm_max_logprobs}; raise it to at least {K}")
    if args.tis_c is not None and args.behavior == "rollout":
        raise ConfigError(f"--tis-c {args.tis_c} corrects pi_old/mu, but with --behavior rollout the IS weight is "
                          "already pi/mu; truncate it with --C, or use --behavior recompute for Oat's TIS")
    args.aggregation = aggregation_of(args)
    args.use_fused_lm_head = False  # the learner never calls Oat's get_batch_logps (see OAT_DEFAULT_OVERRIDES)

    # -- batch arithmetic (Oat rounds silently; a mismatch would drop data or straddle rounds) --------
    world = learner_world_size(args) if world_size is None else world_size
    if world < 1:
        raise ConfigError(f"--gpus {args.gpus} leaves no learner GPU")
    if args.episodes_per_iteration is not None:
        if args.episodes_per_iteration % (args.num_samples * world):
            raise ConfigError(f"--episodes-per-iteration {args.episodes_per_iteration} must be a multiple of "
                              f"--group-size {args.num_samples} x {world} learner GPUs")
        args.rollout_batch_size = args.episodes_per_iteration // args.num_samples
        args.rollout_batch_size_per_device = args.rollout_batch_size // world
    per_step = world * args.rollout_batch_size_per_device
    if args.rollout_batch_size % per_step:
        raise ConfigError(f"--rollout-batch-size {args.rollout_batch_size} must be a multiple of {world} learner GPUs x "
                          f"--rollout-batch-size-per-device {args.rollout_batch_size_per_device}")
    update_interval = args.rollout_batch_size // per_step
    per_round = args.rollout_batch_size_per_device * args.num_samples * update_interval  # turns per learner
    if args.pi_buffer_maxlen_per_device is None:
        args.pi_buffer_maxlen_per_device = per_round
    elif args.pi_buffer_maxlen_per_device < per_round:
        raise ConfigError(f"--pi-buffer-maxlen-per-device {args.pi_buffer_maxlen_per_device} would drop data: each "
                          f"learner receives {per_round} turns per learning round (rollout prompts per device "
                          f"{args.rollout_batch_size_per_device} x group size {args.num_samples} x {update_interval} "
                          f"steps); set it to {per_round}")
    mb = args.train_batch_size_per_device
    if args.train_batch_size % (mb * world):
        raise ConfigError(f"--train-batch-size {args.train_batch_size} must be a multiple of "
                          f"--train-batch-size-per-device {mb} x {world} learner GPUs")
    per_update = args.train_batch_size // world  # turns per optimizer step per learner
    if per_round % per_update:
        raise ConfigError(f"--train-batch-size {args.train_batch_size} must divide the {per_round * world} turns of a "
                          f"learning round ({per_round} per learner) so that no optimizer step straddles two rounds")

    # -- what the program needs -------------------------------------------------------------------
    args.algo = "PPO" if isinstance(args.algo, str) else args.algo
    if args.iterations is not None:
        if args.iterations < 1:
            raise ConfigError(f"--iterations must be >= 1, got {args.iterations}")
        args.max_train = 1 << 62  # stop after --iterations learning rounds, not by query count
    return notes


def oat_validate(args) -> None:
    """Oat's own `default_args_validation` (GPU count, ZeRO-3/fused head, bf16+fp16), as one line."""
    from oat.args import default_args_validation

    try:
        default_args_validation(args)
    except (AssertionError, ValueError) as e:
        raise ConfigError(f"Oat rejects the arguments: {e}") from None


def describe(args, notes: list[str] = ()) -> str:
    """The resolved configuration, one `name = value` per line (for --dry-run)."""
    lines = [f"# oat_dppo --backend oat (Oat's options {OAT_ARGS_SOURCE})"]
    lines += [f"# note: {n}" for n in notes]
    lines.append(f"# learners: {learner_world_size(args)} GPU(s); trust region: "
                 f"{_trust_region_repr(args)}")
    for f in dataclasses.fields(args):
        v = getattr(args, f.name)
        if isinstance(v, float) and math.isinf(v):
            v = "inf"
        lines.append(f"{f.name} = {v!r}")
    return "\n".join(lines)


def _trust_region_repr(args) -> str:
    from oat_dppo.backends.local import build_trust_region

    return repr(build_trust_region(to_train_config(args)))


def resolve(argv: list[str]) -> tuple[Any, list[str]]:
    """Parse and finalize (no GPU needed)."""
    args = parse(argv)
    return args, finalize(args)


CONFIG_SEPARATOR = "---"


def main(argv: list[str] | None = None) -> int:
    """`python -m oat_dppo.backends.oat.args ARGS [--- ARGS ...]`: print the resolved configuration of
    each command line (the experiment scripts' --dry-run; one process for all of a script's arms).
    No GPU, vLLM or launchpad needed."""
    argv = sys.argv[1:] if argv is None else argv
    runs, cur = [], []
    for a in argv:
        if a == CONFIG_SEPARATOR:
            runs.append(cur)
            cur = []
        else:
            cur.append(a)
    runs.append(cur)
    for i, run in enumerate(runs):
        try:
            args, notes = resolve(run)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if i:
            print()
        print(describe(args, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
