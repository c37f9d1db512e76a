"""`DPPOArgs`: Oat's own argument class plus the local backend's options, under the same names.

`class DPPOArgs(PPOArgs, TrainConfig)`: one command line works on both backends. It inherits Oat's fields
(where `oat.algorithms.ppo` does not import, an empty class: `--help` still works, a run is refused) and
every local option with its local default and help, and re-declares only the eleven Oat fields that mean a
local option (`OAT_NAMES`: Oat's field holds the value, the local name is its alias on the command line
and as an attribute: `args.model` is `args.pretrain`) and fields whose default is the project's or is
derived in `finalize` (None). Local-backend-only options (`LOCAL_ONLY`) parse, then are ignored with a note
or refused with a reason. `to_train_config` gives the run as a `TrainConfig`; `finalize` resolves and
checks; every violation is one `ConfigError` line (exit status 2).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

import tyro

from oat_dppo import config as _config
from oat_dppo.components import build_trust_region
from oat_dppo.config import ConfigError, TrainConfig
from oat_dppo.engine.vllm import cpu_has_native_bf16
from oat_dppo.envs import get_preset
from oat_dppo.envs.presets import plays_turns
from oat_dppo.trust_region import requirements

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
    "keep_best": (True, "the best evaluation's policy is kept on the local backend; Oat saves by --save-steps"),
    "lr_schedule": (True, "on Oat use --lr-scheduler and --lr-warmup-ratio"),
    "lr_warmup_iterations": (True, "on Oat use --lr-warmup-ratio"),
    "resume": (True, "Oat resumes DeepSpeed checkpoints with --resume-dir DIR"),
    "engine": (True, "Oat's actors always sample with vLLM"),
    "warm_start": (True, "warm-start on the local backend (--warm-start ... --iterations 0), export it (python -m "
                         "oat_dppo.export), then --model the exported directory here"),
    "deterministic": (True, "Oat's actors (vLLM 0.8.4, which has no batch-invariant kernels) and DeepSpeed "
                            "learners run in processes Oat launches, and nothing here pins their kernels"),
}


def _oat_base() -> tuple[type, str | None]:
    """(Oat's argument class, why it is missing): PPOArgs (it imports vLLM), else an empty class."""
    try:
        from oat.algorithms.ppo import PPOArgs

        return PPOArgs, None
    except ImportError as e:
        return dataclasses.make_dataclass("NoOat", []), f"Oat's PPO module does not import ({type(e).__name__}: {e})"


OatArgs, OAT_ARGS_MISSING = _oat_base()


def _field(default: Any, help: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": help})


def _help_of(name: str) -> str:
    return TrainConfig.__dataclass_fields__[name].metadata["help"]


def _also(name: str):
    """The local option `name` as another spelling of an Oat option."""
    return tyro.conf.arg(aliases=("--" + name.replace("_", "-"),))


def _alias_attribute() -> Any:
    """The local name of an Oat field: not an option of its own (see the loop after the class)."""
    return dataclasses.field(default=None, init=False, repr=False, compare=False)


@dataclass
class DPPOArgs(OatArgs, TrainConfig):
    """The Oat backend's command line: Oat's PPO options and the local backend's, under the same names."""

    # ---- Oat's fields that are local options (OAT_NAMES), some with the project's defaults -------------
    pretrain: Annotated[str, _also("model")] = _field(
        "Qwen/Qwen3-1.7B-Base", "Policy: a Hugging Face id or local path (vLLM loads it too).")
    generate_max_length: Annotated[Optional[int], _also("max_new_tokens")] = _field(
        None, "Response token budget per turn (default: the environment's preset, 4096 for GEM ids).")
    num_samples: Annotated[int, _also("group_size")] = _field(
        1, "Episodes per start state (same seed), as --group-size on the local backend; >1 enables group "
        "baselines (--advantage group).")
    train_batch_size: Annotated[int, _also("mini_batch_size")] = _field(
        128, "Turns (or episodes: --mini-batch-unit) per optimizer step over all learners.")
    train_batch_size_per_device: Annotated[int, _also("micro_batch_size")] = _field(
        1, "Turns per forward/backward on each learner; gradients accumulate up to the step.")
    max_norm: Annotated[float, _also("max_grad_norm")] = _field(1.0, _help_of("max_grad_norm"))
    save_path: Annotated[str, _also("run_dir")] = _field(
        "./oat-output", "Where Oat writes the run: logs, metrics.jsonl, config.json, checkpoints.")
    eval_steps: Annotated[int, _also("eval_every")] = _field(20, _help_of("eval_every"))
    save_steps: Annotated[int, _also("save_every")] = _field(-1, "Checkpoint every N learning rounds (-1: never).")
    wb_project: Annotated[str, _also("wandb_project")] = _field("oat-llm", _help_of("wandb_project"))
    vllm_gpu_ratio: Annotated[float, _also("vllm_gpu_memory_utilization")] = _field(
        0.25, "Share of each actor GPU's memory vLLM takes.")
    model: str = _alias_attribute()
    max_new_tokens: Optional[int] = _alias_attribute()
    group_size: int = _alias_attribute()
    mini_batch_size: int = _alias_attribute()
    micro_batch_size: int = _alias_attribute()
    max_grad_norm: float = _alias_attribute()
    run_dir: str = _alias_attribute()
    eval_every: int = _alias_attribute()
    save_every: int = _alias_attribute()
    wandb_project: str = _alias_attribute()
    vllm_gpu_memory_utilization: float = _alias_attribute()

    # ---- Oat's other fields with the project's defaults, or unused --------------------------------------
    gpus: Optional[int] = _field(None, "GPUs in all (split between vLLM actors and DeepSpeed learners as Oat "
                                 "splits them: half and half, one actor per learner). Default: every visible GPU. "
                                 "Without CUDA it counts processes on this machine's cores instead (default 2: one "
                                 "actor, one learner); see docs/oat.md.")
    learning_rate: float = _field(TrainConfig.learning_rate, "Learning rate, the same default as the local "
                                  "backend's (Oat's own default is 5e-7): one command line, one run.")
    seed: int = _field(TrainConfig.seed, "Random seed, the local backend's default (Oat's own is 42): the same "
                       "command line starts from the same tiny model and the same episodes' seeds on both backends.")
    eval_temperature: float = _field(TrainConfig.eval_temperature, _help_of("eval_temperature"))
    eval_generate_max_length: Optional[int] = _field(None, "Token budget per evaluation turn (default: "
                                                     "--generate-max-length).")
    gamma: Optional[float] = _field(None, _help_of("gamma"))
    tis_c: Optional[float] = _field(None, "Oat's truncated IS (pi_old/mu clamped at tis_c). Off for DPPO: with "
                                    "--mu-source rollout the weight is already pi/mu (truncate it with --C); only "
                                    "meaningful with --mu-source recompute.")
    beta: float = _field(0.0, "KL-to-reference coefficient. Must be 0: the DPPO learner has no reference model "
                         "(the paper's runs use 0).")
    cliprange: Optional[float] = _field(None, "Oat's PPO clip: for ppo_clip strategies, sets --eps-low and "
                                        "--eps-high when they are not given.")
    use_fused_lm_head: bool = _field(False, "Unused by the DPPO learner: it computes log pi (and pi on mu's top-K "
                                     "ids) with the LM head applied only at response positions, in checkpointed "
                                     "blocks of --logits-chunk-tokens: never a [B, T, V] tensor.")
    pi_buffer_maxlen_per_device: Optional[int] = _field(
        None, "Episodes a learner buffers per learning round (default: exactly one round: "
        "rollout-batch-size-per-device x group size x steps per update).")
    lr_scheduler: Literal["cosine_with_min_lr", "polynomial", "constant"] = _field(
        "constant", "Learning-rate schedule (constant: as the local backend and GEM's/Oat's RL scripts; Oat sizes "
        "decaying schedules by prompt count, not by optimizer steps).")
    algo: str = _field("PPO", "Fixed to PPO for this backend.")
    oracle: str = _field("", "Unused: rewards come from the environments.")
    prompt_data: str = _field("", "Unused: prompts come from the environments.")

    # ---- local options whose default is derived from Oat's settings here (None), or differs ------------
    dtype: Optional[Literal["float32", "bfloat16", "float16"]] = _field(
        None, "bfloat16 / float16 / float32: sets Oat's --bf16 / --fp16 (default: Oat's --bf16 on GPUs and on CPUs "
        "with native bf16; float32 on other CPUs, as the local backend).")
    episodes_per_iteration: Optional[int] = _field(
        None, "Episodes per learning round over all actors: sets --rollout-batch-size to this / --group-size, split "
        "evenly over the learners (default: --rollout-batch-size x --group-size).")
    iterations: Optional[int] = _field(None, "Learning rounds (rollout + update); default: until Oat's --max-train "
                                       "episodes.")
    engine: _config.EngineChoice = _field("vllm", _help_of("engine"))
    logits_chunk_tokens: Optional[int] = _field(
        None, "Response tokens per LM-head block: a block's [tokens, vocab] logits are recomputed in backward "
        "(activation checkpointing) instead of kept for the whole micro-batch; 0: one block. Default "
        f"{TrainConfig.logits_chunk_tokens}, but 0 with --zero-stage 3 and --lora-rank: DeepSpeed 0.16.8 partitions "
        "the frozen LM head again before the recompute (deepspeedai/DeepSpeed#8148).")
    aggregation: Optional[_config.Aggregation] = _field(
        None, "Loss aggregation (default: from --critic-type: drgrpo -> seq_sum_constant_length, Oat's masked_sum / "
        "generate_max_length; grpo -> seq_mean_token_mean).")
    log: Optional[_config.LogTo] = _field(None, "wandb: log to Weights & Biases (as --use-wb). Oat always logs to "
                                          "stdout.")

    # ---- this backend's own ------------------------------------------------------------------------------
    print_config: bool = _field(False, "Print the resolved configuration (every option, with the notes) and exit: "
                                "no GPU is needed, nothing is launched.")
    vllm_max_logprobs: Optional[int] = _field(
        None, "vLLM's max_logprobs (top-K strategies record K log-probs per token; default max(20, K)).")
    check_sync: Literal["auto", "on", "off"] = _field(
        "auto", "After every weight sync, check it (learner rank 0, one sequence of the round): the first actor's "
        "log-probs of the sequence's response before and after the sync against the learner's, and a digest of "
        "the actor's weights; logged as sync/... auto: on where the learner runs without CUDA (the CPU "
        "verification run; the digest reads every weight), off on GPUs. Not with --zero-stage 3 or "
        "--asynchronous.")


for _local, _oat in OAT_NAMES.items():  # args.model reads and writes args.pretrain, ...
    setattr(DPPOArgs, _local, property(lambda self, n=_oat: getattr(self, n),
                                       lambda self, value, n=_oat: setattr(self, n, value)))


def parse(argv: list[str]) -> Any:
    """`DPPOArgs` from a command line (prints help and exits on --help)."""
    ignored = ", ".join("--" + n.replace("_", "-") for n, (refused, _) in LOCAL_ONLY.items() if not refused)
    refused = ", ".join("--" + n.replace("_", "-") for n, (refused, _) in LOCAL_ONLY.items() if refused)
    description = ("Train an LLM agent with a pluggable trust region on Oat (vLLM actors, DeepSpeed learners).\n\n"
                   "The local backend's options (env, template, trust region) keep their names; Oat's own options "
                   f"follow. Local-backend only: ignored here {ignored}; refused {refused}. See docs/gpu.md.")
    if OAT_ARGS_MISSING:
        description += f"\n\nNote: Oat's own options are not listed here: {OAT_ARGS_MISSING}."
    with warnings.catch_warnings():
        # Oat annotates some fields `str` with default None; tyro warns about each. Not ours to fix.
        warnings.filterwarnings("ignore", message="The field .* is annotated with type", category=UserWarning)
        return tyro.cli(DPPOArgs, args=argv, prog="python -m oat_dppo.main --backend oat", description=description)


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
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if f.name not in LOCAL_ONLY}
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
    """A `DPPOArgs` carrying every option of a `TrainConfig` (Oat's defaults for Oat's own)."""
    args = DPPOArgs()
    for f in dataclasses.fields(cfg):
        setattr(args, f.name, getattr(cfg, f.name))
    return args



def learners_per_group(args) -> int:
    """Learner ranks of one node group (one launcher), as `oat.interface.get_program` splits its GPUs
    (all when collocated, else the second half; an odd count shares one GPU)."""
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
        raise ConfigError(f"--backend oat: {OAT_ARGS_MISSING}; the install guide is docs/gpu.md")
    ignored = []
    for name, (refused, why) in LOCAL_ONLY.items():
        if getattr(args, name) == getattr(DPPOArgs, name):  # the default here
            continue
        flag = "--" + name.replace("_", "-")
        if refused:
            raise ConfigError(f"{flag} is local-backend only: {why}")
        ignored.append(flag)
    if ignored:
        notes.append(f"ignored on the Oat backend: {', '.join(ignored)}")
    if args.mini_batch_unit == "groups":  # (one of TrainConfig's values, so not in LOCAL_ONLY's by-default check)
        raise ConfigError("--mini-batch-unit groups is local-backend only: Oat's learner receives episodes without "
                          "the group they were played in; --mini-batch-unit episodes counts the same steps")
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
    # ZeRO-3 partitions a frozen LM head again before a checkpointed block is recomputed (DeepSpeed#8148)
    frozen = "--lora-rank" if args.lora_rank > 0 else "--trainable-layers" if args.trainable_layers > 0 else None
    frozen_partitioned_head = args.zero_stage == 3 and frozen is not None
    if args.logits_chunk_tokens is None:
        args.logits_chunk_tokens = 0 if frozen_partitioned_head else TrainConfig.logits_chunk_tokens
        if frozen_partitioned_head:
            notes.append(f"--zero-stage 3 with {frozen}: the LM head runs in one block (--logits-chunk-tokens 0)")
    elif args.logits_chunk_tokens > 0 and frozen_partitioned_head:
        raise ConfigError(f"--logits-chunk-tokens {args.logits_chunk_tokens} with --zero-stage 3 and {frozen}: "
                          "DeepSpeed 0.16.8 cannot recompute a block whose frozen, partitioned LM head it has "
                          "released (deepspeedai/DeepSpeed#8148); use --logits-chunk-tokens 0 or --zero-stage 2")
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
    args.use_fused_lm_head = False  # the learner never calls Oat's get_batch_logps

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
    counts_episodes = args.mini_batch_unit == "episodes" or not plays_turns(args.env, _config.env_options(args))
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
    """Settings that depend on the node's own machine (not the launcher's), resolved in the node: flash-attention
    needs CUDA; --check-sync auto is on without CUDA, else off (--check-sync's help). Returns notes."""
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
    """The resolved configuration, one `name = value` per line (--print-config)."""
    lines = ["# oat_dppo --backend oat"]
    lines += [f"# note: {n}" for n in notes]
    lines.append(f"# learners: {learner_world_size(args)} GPU(s); trust region: "
                 f"{build_trust_region(to_train_config(args))!r}")
    for f in dataclasses.fields(args):
        if f.name in OAT_NAMES:  # the local name of an Oat field, printed under Oat's
            continue
        v = getattr(args, f.name)
        if isinstance(v, float) and math.isinf(v):
            v = "inf"
        lines.append(f"{f.name} = {v!r}")
    return "\n".join(lines)
