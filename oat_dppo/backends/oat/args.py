"""`DPPOArgs`: Oat's own argument class plus the local backend's options, under the same names.

One command line works on both backends. `DPPOArgs` is a dataclass over Oat's real
`oat.algorithms.ppo.PPOArgs` (it imports vLLM; where vLLM is missing `oat.args.OATArgs` stands in, and
without Oat an empty class, so that `--help` still works and a run is refused). Its fields, declared below:

* Oat's, under the local name too where it differs (`OAT_NAMES`: `--model` is `--pretrain`, `--group-size`
  is `--num-samples`, ...), some with the project's default (the learning rate, the seed, ...);
* the local backend's options that Oat lacks (`--env`, `--template`, `--trust-region`, ...), with the same
  default and help (`_ours`);
* local only (`LOCAL_ONLY`): accepted so that a local command line parses, then ignored with a note or
  refused with a reason.

`to_train_config` and `from_train_config` convert between the two. `finalize` resolves the derived settings
and checks the combination; every violation is one `ConfigError` line (exit status 2 from the command line).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import warnings
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

import tyro

from oat_dppo import config as _config
from oat_dppo.cli import fail
from oat_dppo.components import build_trust_region
from oat_dppo.config import ConfigError, TrainConfig
from oat_dppo.engine.vllm import cpu_has_native_bf16
from oat_dppo.envs import get_preset
from oat_dppo.trust_region import requirements

# ---------------------------------------------------------------------------------------------
# The mapping
# ---------------------------------------------------------------------------------------------

#: TrainConfig name -> the Oat field that means the same thing.
OAT_NAMES: dict[str, str] = {
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
#: Local-backend options with no Oat counterpart: option -> (refused?, what to say).
LOCAL_ONLY: dict[str, tuple[bool, str]] = {
    "device": (False, "Oat places every process on its GPUs"),
    "progress": (False, "Oat logs to stdout"),
    "log_episodes": (False, "Oat logs no sample episodes"),
    "engine_dtype": (False, "Oat's vLLM follows --bf16 / --fp16"),
    "vllm_enforce_eager": (False, "Oat's vLLM always captures CUDA graphs"),
    "vllm_head_dtype": (True, "Oat 0.2.4's vLLM 0.8.4 has no head_dtype override"),
    "keep_checkpoint": (False, "Oat keeps its checkpoints by --save-steps / --max-save-num"),
    "lr_schedule": (True, "on Oat use --lr-scheduler and --lr-warmup-ratio"),
    "lr_warmup_iterations": (True, "on Oat use --lr-warmup-ratio"),
    "trainable_layers": (True, "on Oat use --lora-rank (or full fine-tuning)"),
    "resume": (True, "Oat resumes DeepSpeed checkpoints with --resume-dir DIR"),
    "engine": (True, "Oat's actors always sample with vLLM"),
    "warm_start": (True, "warm-start on the local backend (--warm-start ... --iterations 1), export it (python -m "
                         "oat_dppo.export), then --model the exported directory here"),
    "deterministic": (True, "Oat's actors (vLLM 0.8.4, which has no batch-invariant kernels) and DeepSpeed "
                            "learners run in processes Oat launches, and nothing here pins their kernels"),
}

# ---------------------------------------------------------------------------------------------
# The class
# ---------------------------------------------------------------------------------------------


def _oat_base() -> tuple[type, str | None]:
    """(Oat's argument class, why it is not PPOArgs): PPOArgs, else OATArgs, else an empty class."""
    try:
        from oat.algorithms.ppo import PPOArgs  # imports vLLM (and torch, deepspeed)

        return PPOArgs, None
    except ImportError as e:  # vLLM missing: OATArgs (torch + tyro only) keeps Oat's general options
        why = f"{type(e).__name__}: {e}"
    try:
        from oat.args import OATArgs  # torch + tyro only

        return OATArgs, f"oat.algorithms.ppo does not import here ({why})"
    except ImportError as e:
        return dataclasses.make_dataclass("NoOat", []), f"oat-llm is not installed ({type(e).__name__}: {e})"


OatArgs, OAT_ARGS_MISSING = _oat_base()
_LOCAL = {f.name: f for f in dataclasses.fields(TrainConfig)}
_SAME = object()


def _ours(name: str, default: Any = _SAME, help: str | None = None) -> Any:
    """The local option `name` as a field of DPPOArgs: its default (unless `default`: None derives it from
    Oat's settings in `finalize`) and its help, marked where the option is local-backend only."""
    f = _LOCAL[name]
    help = help or f.metadata["help"]
    if name in LOCAL_ONLY:
        refused, why = LOCAL_ONLY[name]
        help = f"[local backend only: {'refused' if refused else 'ignored'} here: {why}] " + help
    if default is _SAME and f.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=f.default_factory, metadata={"help": help})
    return dataclasses.field(default=f.default if default is _SAME else default, metadata={"help": help})


def _theirs(default: Any, help: str = "", ours: str | None = None) -> Any:
    """An Oat field re-declared with the project's default, or with the local option `ours` as an alias (whose
    help it takes unless `help` is given)."""
    return dataclasses.field(default=default, metadata={"help": help or _LOCAL[ours].metadata["help"]})


def _alias(name: str):
    return tyro.conf.arg(aliases=(name,))


_Append = tyro.conf.UseAppendAction


@dataclass
class DPPOArgs(OatArgs):
    """The Oat backend's command line: Oat's PPO options and the local backend's, under the same names."""

    # ---- Oat's fields, under the local backend's names too, some with the project's defaults ----------
    gpus: Optional[int] = _theirs(None, "GPUs in all (split between vLLM actors and DeepSpeed learners as Oat "
                                  "splits them: half and half, one actor per learner). Default: every visible GPU. "
                                  "Without CUDA it counts processes on this machine's cores instead (default 2: one "
                                  "actor, one learner); see docs/oat.md.")
    pretrain: Annotated[str, _alias("--model")] = _theirs(
        "Qwen/Qwen3-1.7B-Base", "Policy: a Hugging Face id or local path (vLLM loads it too).")
    learning_rate: float = _theirs(TrainConfig.learning_rate, "Learning rate, the same default as the local "
                                   "backend's (Oat's own default is 5e-7): one command line, one run.")
    generate_max_length: Annotated[Optional[int], _alias("--max-new-tokens")] = _theirs(
        None, "Response token budget per turn (default: the environment's preset, 4096 for GEM ids).")
    eval_generate_max_length: Optional[int] = _theirs(None, "Token budget per evaluation turn (default: "
                                                      "--generate-max-length).")
    gamma: Optional[float] = _theirs(None, "Discount over turns (default: the environment's preset: 0.9 for "
                                     "games, 1.0 otherwise).")
    num_samples: Annotated[int, _alias("--group-size")] = _theirs(
        1, "Episodes per start state (same seed), as --group-size on the local backend; >1 enables group "
        "baselines (--advantage group).")
    tis_c: Optional[float] = _theirs(None, "Oat's truncated IS (pi_old/mu clamped at tis_c). Off for DPPO: with "
                                     "--mu-source rollout the weight is already pi/mu (truncate it with --C); only "
                                     "meaningful with --mu-source recompute.")
    beta: float = _theirs(0.0, "KL-to-reference coefficient. Must be 0: the DPPO learner has no reference model "
                          "(the paper's runs use 0).")
    cliprange: Optional[float] = _theirs(None, "Oat's PPO clip: for ppo_clip strategies, sets --eps-low and "
                                         "--eps-high when they are not given.")
    use_fused_lm_head: bool = _theirs(False, "Unused by the DPPO learner: it computes log pi (and pi on mu's "
                                      "top-K ids) with the LM head applied only at response positions, in "
                                      "checkpointed blocks of --logits-chunk-tokens: never a [B, T, V] tensor.")
    pi_buffer_maxlen_per_device: Optional[int] = _theirs(
        None, "Episodes a learner buffers per learning round (default: exactly one round: "
        "rollout-batch-size-per-device x group size x steps per update).")
    lr_scheduler: Literal["cosine_with_min_lr", "polynomial", "constant"] = _theirs(
        "constant", "Learning-rate schedule (constant: as the local backend and GEM's/Oat's RL scripts; Oat sizes "
        "decaying schedules by prompt count, not by optimizer steps).")
    seed: int = _theirs(TrainConfig.seed, "Random seed, the local backend's default (Oat's own is 42): the same "
                        "command line starts from the same tiny model and the same episodes' seeds on both backends.")
    eval_temperature: float = _theirs(TrainConfig.eval_temperature, "Sampling temperature of held-out "
                                      "evaluations, the local backend's default and meaning: 1 samples the policy as "
                                      "it is trained; 0 is greedy (Oat's own default).")
    algo: str = _theirs("PPO", "Fixed to PPO for this backend.")
    oracle: str = _theirs("", "Unused: rewards come from the environments.")
    prompt_data: str = _theirs("", "Unused: prompts come from the environments.")
    train_batch_size: Annotated[int, _alias("--mini-batch-size")] = _theirs(
        128, "Turns (or episodes: --mini-batch-unit) per optimizer step over all learners.")
    train_batch_size_per_device: Annotated[int, _alias("--micro-batch-size")] = _theirs(
        1, "Turns per forward/backward on each learner; gradients accumulate up to the step.")
    max_norm: Annotated[float, _alias("--max-grad-norm")] = _theirs(1.0, ours="max_grad_norm")
    save_path: Annotated[str, _alias("--run-dir")] = _theirs("./oat-output", "Where Oat writes the run: logs, "
                                                             "metrics.jsonl, config.json, checkpoints.")
    eval_steps: Annotated[int, _alias("--eval-every")] = _theirs(20, ours="eval_every")
    save_steps: Annotated[int, _alias("--save-every")] = _theirs(-1, "Checkpoint every N learning rounds "
                                                                 "(-1: never).")
    wb_project: Annotated[str, _alias("--wandb-project")] = _theirs("oat-llm", ours="wandb_project")
    vllm_gpu_ratio: Annotated[float, _alias("--vllm-gpu-memory-utilization")] = _theirs(
        0.25, "Share of each actor GPU's memory vLLM takes.")

    # ---- the local backend's options that Oat lacks (same names, defaults and help) -------------------
    env: str = _ours("env")
    math_data: Optional[str] = _ours("math_data")
    math_question_key: str = _ours("math_question_key")
    math_answer_key: str = _ours("math_answer_key")
    max_turns: Optional[int] = _ours("max_turns")
    format_penalty: float = _ours("format_penalty")
    env_option: Annotated[tuple[str, ...], _Append] = _ours("env_option")
    template: str = _ours("template")
    system_prompt: Optional[str] = _ours("system_prompt")
    response_prefix: str = _ours("response_prefix")
    dtype: Optional[Literal["float32", "bfloat16", "float16"]] = _ours(
        "dtype", None, "bfloat16 / float16 / float32: sets Oat's --bf16 / --fp16 (default: Oat's --bf16 on GPUs and "
        "on CPUs with native bf16; float32 on other CPUs, as the local backend).")
    trainable_layers: int = _ours("trainable_layers")
    episodes_per_iteration: Optional[int] = _ours(
        "episodes_per_iteration", None, "Episodes per learning round over all actors: sets --rollout-batch-size to "
        "this / --group-size, split evenly over the learners (default: --rollout-batch-size x --group-size).")
    engine: _config.EngineChoice = _ours("engine", "vllm")
    engine_dtype: Annotated[_config.EngineDtype, _alias("--vllm-dtype")] = _ours("engine_dtype")
    vllm_head_dtype: Optional[Literal["float32"]] = _ours("vllm_head_dtype")
    vllm_enforce_eager: bool = _ours("vllm_enforce_eager")
    trust_region: str = _ours("trust_region")
    delta: Optional[float] = _ours("delta")
    eps_low: Optional[float] = _ours("eps_low")
    eps_high: Optional[float] = _ours("eps_high")
    alpha: Optional[float] = _ours("alpha")
    direction: Optional[_config.Direction] = _ours("direction")
    clip_c: Annotated[Optional[float], _alias("--C")] = _ours("clip_c")
    anchor: Optional[_config.AnchorChoice] = _ours("anchor")
    topk: Optional[int] = _ours("topk")
    tr_param: Annotated[tuple[str, ...], _Append] = _ours("tr_param")
    mu_source: Literal["rollout", "recompute"] = _ours("mu_source")
    lr_schedule: Literal["constant", "linear", "cosine"] = _ours("lr_schedule")
    lr_warmup_iterations: int = _ours("lr_warmup_iterations")
    mini_batch_unit: Literal["turns", "episodes"] = _ours("mini_batch_unit")
    logits_chunk_tokens: Optional[int] = _ours(
        "logits_chunk_tokens", None, "Response tokens per LM-head block: a block's [tokens, vocab] logits are "
        "recomputed in backward (activation checkpointing) instead of kept for the whole micro-batch; 0: one block. "
        f"Default {TrainConfig.logits_chunk_tokens}, but 0 with --zero-stage 3 and --lora-rank: DeepSpeed 0.16.8 "
        "partitions the frozen LM head again before the recompute (deepspeedai/DeepSpeed#8148).")
    aggregation: Optional[_config.Aggregation] = _ours(
        "aggregation", None, "Loss aggregation (default: from --critic-type: drgrpo -> seq_sum_constant_length, "
        "Oat's masked_sum / generate_max_length; grpo -> seq_mean_token_mean).")
    advantage: _config.AdvantageMode = _ours("advantage")
    warm_start: Optional[str] = _ours("warm_start")
    warm_start_episodes: int = _ours("warm_start_episodes")
    warm_start_steps: int = _ours("warm_start_steps")
    warm_start_batch: int = _ours("warm_start_batch")
    warm_start_lr: float = _ours("warm_start_lr")
    iterations: Optional[int] = _ours("iterations", None, "Learning rounds (rollout + update); default: until "
                                      "Oat's --max-train episodes.")
    deterministic: bool = _ours("deterministic")
    resume: Optional[str] = _ours("resume")
    eval_episodes: int = _ours("eval_episodes", help="Held-out episodes per evaluation (every --eval-steps "
                               "steps), split over the actors; 0: none.")
    keep_checkpoint: bool = _ours("keep_checkpoint")
    log_episodes: int = _ours("log_episodes")
    log: Optional[_config.LogTo] = _ours("log", None, "wandb: log to Weights & Biases (as --use-wb). Oat always "
                                         "logs to stdout.")
    backend: _config.Backend = _ours("backend")
    device: str = _ours("device")
    threads: int = _ours("threads", help="Torch CPU threads of each node process on a machine without CUDA (0: the "
                         "cores split evenly between the actors and learners).")
    progress: bool = _ours("progress")

    # ---- this backend's own --------------------------------------------------------------------------
    vllm_max_logprobs: Optional[int] = dataclasses.field(default=None, metadata={"help": (
        "vLLM's max_logprobs (top-K strategies record K log-probs per token; default max(20, K)).")})
    check_sync: Literal["auto", "on", "off"] = dataclasses.field(default="auto", metadata={"help": (
        "After every weight sync, check it (learner rank 0, one sequence of the round): the first actor's "
        "log-probs of the sequence's response before and after the sync against the learner's, and a digest of "
        "the actor's weights; logged as sync/... auto: on where the learner runs without CUDA (the CPU "
        "verification run; the digest reads every weight), off on GPUs. Not with --zero-stage 3 or "
        "--asynchronous.")})


#: Options whose default here differs from the local one (None: derived from Oat's settings in `finalize`).
OWN_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(DPPOArgs)
                                if f.name in _LOCAL and f.default != _LOCAL[f.name].default
                                and f.default_factory is dataclasses.MISSING}


def parse(argv: list[str]) -> Any:
    """`DPPOArgs` from a command line (prints help and exits on --help)."""
    description = ("Train an LLM agent with a pluggable trust region on Oat (vLLM actors, DeepSpeed learners).\n\n"
                   "The local backend's options (env, template, trust region) keep their names; Oat's own options "
                   "follow. See docs/gpu.md.")
    if OAT_ARGS_MISSING:
        description += f"\n\nNote: PPO's own options appear where Oat's PPO module imports: {OAT_ARGS_MISSING}."
    with warnings.catch_warnings():
        # Oat annotates some fields `str` with default None; tyro warns about each. Not ours to fix.
        warnings.filterwarnings("ignore", message="The field .* is annotated with type", category=UserWarning)
        return tyro.cli(DPPOArgs, args=argv, prog="python -m oat_dppo.main --backend oat", description=description)


# ---------------------------------------------------------------------------------------------
# Conversion, both ways, by the tables above
# ---------------------------------------------------------------------------------------------

_CRITIC_AGGREGATION = {"drgrpo": "seq_sum_constant_length", "grpo": "seq_mean_token_mean"}


def aggregation_of(args) -> str:
    """--aggregation, or the aggregation Oat's --critic-type implies (drgrpo: masked_sum over the
    response budget, Oat's default; grpo: per-sequence token mean)."""
    if args.aggregation is not None:
        return args.aggregation
    return _CRITIC_AGGREGATION.get(args.critic_type, "seq_sum_constant_length")


def to_train_config(args) -> TrainConfig:
    """The same run as a `TrainConfig`, for the shared components (environments, trust region,
    template). Local-only options keep their local defaults; Oat-derived ones are resolved."""
    values = {}
    for f in dataclasses.fields(TrainConfig):
        if f.name in LOCAL_ONLY:
            continue
        values[f.name] = getattr(args, OAT_NAMES.get(f.name, f.name))
    values.update(
        episodes_per_iteration=args.episodes_per_iteration or args.rollout_batch_size * max(args.num_samples, 1),
        iterations=args.iterations or 1,
        aggregation=aggregation_of(args),
        eval_every=max(0, args.eval_steps),
        save_every=max(0, args.save_steps),
        logits_chunk_tokens=TrainConfig.logits_chunk_tokens if args.logits_chunk_tokens is None else args.logits_chunk_tokens,
        log=args.log or TrainConfig.log,
        dtype=args.dtype or ("bfloat16" if args.bf16 else "float16" if args.fp16 else "float32"),
        backend="oat",
    )
    return TrainConfig(**values)


def from_train_config(cfg: TrainConfig):
    """A `DPPOArgs` carrying every option of a `TrainConfig` that Oat has (Oat's defaults for the rest)."""
    args = DPPOArgs()
    names = {f.name for f in dataclasses.fields(DPPOArgs)}
    for f in dataclasses.fields(cfg):
        target = OAT_NAMES.get(f.name, f.name)
        if target in names:
            setattr(args, target, getattr(cfg, f.name))
    return args


# ---------------------------------------------------------------------------------------------
# Resolution and validation
# ---------------------------------------------------------------------------------------------


def learners_per_group(args) -> int:
    """Learner ranks of one node group (one launcher), as `oat.interface.get_program` splits its GPUs
    (all of them when collocated, else the second half; an odd count shares one GPU)."""
    return args.gpus if args.collocate else args.gpus - args.gpus // 2


def learner_world_size(args) -> int:
    """Learner ranks of the whole run: every node group's (`--num-groups`)."""
    return learners_per_group(args) * args.num_groups


def finalize(args, *, world_size: int | None = None) -> list[str]:
    """Resolve derived settings in place and check the combination. Returns notes (ignored options);
    raises `ConfigError` (one line) on the first violation. Needs no GPU and no Oat import.
    `world_size` overrides the learner count derived from --gpus (CPU tests run one rank, gpus=0)."""
    notes: list[str] = []
    # -- the machine: GPUs, or processes on a CPU ----------------------------------------------------
    import torch  # installed wherever Oat is

    cuda = torch.cuda.is_available()
    if args.gpus is None:
        args.gpus = torch.cuda.device_count() if cuda else 2
    # -- options of the local backend ------------------------------------------------------------
    if OAT_ARGS_MISSING:
        raise ConfigError(f"--backend oat needs Oat's PPO module, and {OAT_ARGS_MISSING}; the GPU install guide is "
                          "docs/gpu.md")
    ignored = []
    for name, (refused, why) in LOCAL_ONLY.items():
        value, default = getattr(args, name), OWN_DEFAULTS.get(name, getattr(TrainConfig, name))
        if value == default:
            continue
        flag = "--" + name.replace("_", "-")
        if refused:
            raise ConfigError(f"{flag} is local-backend only: {why}")
        ignored.append(flag)
    if ignored:
        notes.append(f"ignored on the Oat backend: {', '.join(ignored)}")
    if args.log == "wandb":
        args.use_wb = True
    elif args.log == "tensorboard":
        notes.append("--log tensorboard: Oat logs to stdout and to wandb (--use-wb); no tensorboard files")
    if args.dtype is not None:
        args.bf16, args.fp16 = args.dtype == "bfloat16", args.dtype == "float16"
    elif args.bf16 and not cuda and not cpu_has_native_bf16():  # as the local backend: float32 there
        args.bf16 = False
        notes.append("no CUDA and no native bf16 on this CPU: float32 (bf16 would emulate, ~5x slower to train); "
                     "--dtype bfloat16 to choose it")

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
        preset = get_preset(args.env)
        if args.generate_max_length is None:
            args.generate_max_length = preset.max_new_tokens
        if args.gamma is None:
            args.gamma = preset.gamma
    if args.eval_generate_max_length is None:
        args.eval_generate_max_length = args.generate_max_length
    # Checkpointed LM-head blocks recompute the head in backward; under ZeRO-3 a *frozen* head (LoRA)
    # is partitioned again by then, and torch's recompute check fails (deepspeedai/DeepSpeed#8148;
    # reproduced in tests/test_oat_backend_learner.py).
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
    _config.env_options(cfg)  # --env-option syntax and reserved names, before any node would trip on them
    needs = requirements(build_trust_region(cfg))  # a bad strategy or parameter -> ConfigError
    K = needs.topk
    if args.vllm_max_logprobs is None:
        args.vllm_max_logprobs = max(20, K)
    elif K > args.vllm_max_logprobs:
        raise ConfigError(f"--trust-region {args.trust_region} records the top {K} log-probs per token, more than "
                          f"--vllm-max-logprobs {args.vllm_max_logprobs}; raise it to at least {K}")
    if args.tis_c is not None and args.mu_source == "rollout":
        raise ConfigError(f"--tis-c {args.tis_c} corrects pi_old/mu, but with --mu-source rollout the IS weight is "
                          "already pi/mu; truncate it with --C, or use --mu-source recompute for Oat's TIS")
    if args.check_sync == "on" and args.zero_stage == 3:
        raise ConfigError("--check-sync runs the policy on learner rank 0 alone, which ZeRO-3 cannot (every rank "
                          "holds a shard); use --zero-stage 2 or --check-sync off")
    if args.check_sync == "on" and args.asynchronous:
        raise ConfigError("--check-sync asks the actor's vLLM for log-probs between rounds, which --asynchronous "
                          "actors are still sampling with; use --check-sync off (or drop --asynchronous)")
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
    per_round = args.rollout_batch_size_per_device * args.num_samples * update_interval  # episodes per learner
    if args.pi_buffer_maxlen_per_device is None:
        args.pi_buffer_maxlen_per_device = per_round
    elif args.pi_buffer_maxlen_per_device < per_round:
        raise ConfigError(f"--pi-buffer-maxlen-per-device {args.pi_buffer_maxlen_per_device} would drop data: each "
                          f"learner receives {per_round} episodes per learning round (rollout prompts per device "
                          f"{args.rollout_batch_size_per_device} x group size {args.num_samples} x {update_interval} "
                          f"steps); set it to {per_round}")
    mb = args.train_batch_size_per_device
    if args.train_batch_size % (mb * world):
        raise ConfigError(f"--train-batch-size {args.train_batch_size} must be a multiple of "
                          f"--train-batch-size-per-device {mb} x {world} learner GPUs")
    per_update = args.train_batch_size // world  # turns (or episodes) per optimizer step per learner
    counts_episodes = args.mini_batch_unit == "episodes" or not get_preset(args.env).multi_turn
    if counts_episodes and per_round % per_update:  # a round's turns vary in a multi-turn env: no divisor
        raise ConfigError(f"--train-batch-size {args.train_batch_size} must divide the {per_round * world} episodes of "
                          f"a learning round ({per_round} per learner) so that every optimizer step is full")

    # -- what the program needs -------------------------------------------------------------------
    args.algo = "PPO" if isinstance(args.algo, str) else args.algo
    if args.launch_type != "local_mp":
        raise ConfigError(f"--launch-type {args.launch_type}: only local_mp is supported, the launch whose nodes this "
                          "launcher watches (an end, a crash or a stop signal ends every node with its own exit status); "
                          "on several machines start one launcher per machine with --group-rank, --num-groups, "
                          "--master-addr and --master-port (docs/oat.md)")
    if args.iterations is not None:
        if args.iterations < 1:
            raise ConfigError(f"--iterations must be >= 1, got {args.iterations}")
        args.max_train = 1 << 62  # stop after --iterations learning rounds, not by query count
    return notes


def resolve_on_node(args, *, cuda: bool) -> list[str]:
    """Settings that depend on the machine a node runs on, resolved in the node process itself (what the
    launcher's machine has says nothing about a node's): flash-attention exists only with CUDA; --check-sync
    auto is on without CUDA (the CPU verification run; its digest reads every weight) and off on GPUs,
    under ZeRO-3 and with --asynchronous actors. Returns notes."""
    notes = []
    if args.flash_attn and not cuda:  # Oat's default
        args.flash_attn = False
        notes.append("no CUDA on this node: the learner uses eager attention (--no-flash-attn)")
    if args.check_sync == "auto":
        args.check_sync = "off" if cuda or args.zero_stage == 3 or args.asynchronous else "on"
    return notes


def oat_validate(args) -> None:
    """Oat's own `default_args_validation` (GPU count, ZeRO-3/fused head, bf16+fp16), as one line."""
    from oat.args import default_args_validation  # Oat: deferred with the argument class (see _oat_base)

    try:
        default_args_validation(args)
    except (AssertionError, ValueError) as e:
        raise ConfigError(f"Oat rejects the arguments: {e}") from None


def describe(args, notes: list[str] = ()) -> str:
    """The resolved configuration, one `name = value` per line (for --dry-run)."""
    lines = ["# oat_dppo --backend oat"]
    lines += [f"# note: {n}" for n in notes]
    lines.append(f"# learners: {learner_world_size(args)} GPU(s); trust region: "
                 f"{build_trust_region(to_train_config(args))!r}")
    for f in dataclasses.fields(args):
        v = getattr(args, f.name)
        if isinstance(v, float) and math.isinf(v):
            v = "inf"
        lines.append(f"{f.name} = {v!r}")
    return "\n".join(lines)


def resolve(argv: list[str]) -> tuple[Any, list[str]]:
    """Parse and finalize (no GPU needed)."""
    args = parse(argv)
    return args, finalize(args)


CONFIG_SEPARATOR = "---"


def main(argv: list[str] | None = None) -> int:
    """`python -m oat_dppo.backends.oat.args ARGS [--- ARGS ...]`: print the resolved configuration of
    each command line (the experiment scripts' --dry-run; one process for all of a script's arms).
    No GPU or launchpad needed; Oat's PPO module is (it imports vLLM)."""
    runs: list[list[str]] = [[]]
    for a in sys.argv[1:] if argv is None else argv:
        if a == CONFIG_SEPARATOR:
            runs.append([])
        else:
            runs[-1].append(a)
    for i, run in enumerate(runs):
        try:
            args, notes = resolve(run)
        except ConfigError as e:
            return fail(str(e))
        print(("\n" if i else "") + describe(args, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
