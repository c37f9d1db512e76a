"""`python -m oat_dppo.evaluate`: score a policy on a named split (`oat_dppo.envs.splits`).

    python -m oat_dppo.evaluate RUN_DIR --split test               # a run's last checkpoint, 256 test episodes
    python -m oat_dppo.evaluate RUN_DIR --split test --best        # the best validation policy (--keep-best)
    python -m oat_dppo.evaluate --policy demo:noisy_bisect --out runs/noisy_bisect_test --split test -- \\
        --env game:GuessTheNumber-v0-easy --response-prefix '\\boxed{' --max-new-tokens 6   # a scripted player

A run's policy plays as the run's own evaluations do (its config: environment options, template, engine,
--eval-temperature); a scripted player (`demo:NAME`, `oat_dppo.agent.demonstrations`) reads each prompt as
the model would. Every evaluation is appended to RUN_DIR/evaluations.jsonl (the scripted one's to --out)
with its split, the iteration whose policy played and the policy, and printed.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

import tyro

from oat_dppo.cli import fail
from oat_dppo.cli import parse as parse_cli
from oat_dppo.config import ConfigError, TrainConfig, from_dict, to_dict, validate
from oat_dppo.rundir import RunDir, RunDirError

PROG = "python -m oat_dppo.evaluate"
DEFAULT_EPISODES = 256  # a success rate near 0.5 then has a standard error of ~0.03


@dataclass
class EvaluateConfig:
    """python -m oat_dppo.evaluate RUN_DIR --split test: score a saved policy (or a scripted one) on a split."""

    run_dir: Annotated[Optional[str], tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")] = None
    """The run whose policy plays (its config.json and last checkpoint; local backend)."""
    split: Literal["validation", "test"] = "test"
    """The split's tasks: validation (what tuning may look at) or test (what nothing is tuned on)."""
    episodes: int = DEFAULT_EPISODES
    """Episodes to play (the same seeds for every policy on test)."""
    best: bool = False
    """Play the run's best validation policy (RUN_DIR/best/, kept by --keep-best) instead of its last one."""
    policy: Optional[str] = None
    """A scripted player instead of a run: demo:NAME (python -m oat_dppo.envs --list shows none; see
    oat_dppo.agent.demonstrations). The options of python -m oat_dppo.main after `--` choose the env, model
    (for its tokenizer and template) and seed."""
    out: Optional[str] = None
    """With --policy: the directory its evaluation is recorded in (created)."""


def _run_policy(cfg: EvaluateConfig) -> dict:
    """Evaluate a run's saved policy: the trainer rebuilt from its config and checkpoint, as --resume does."""
    import torch  # noqa: F401  (after parsing: --help answers at once)

    from oat_dppo.backends.local import checkpoint
    from oat_dppo.backends.local.trainer import LocalTrainer

    run = RunDir(cfg.run_dir, create=False)
    train_cfg = from_dict(run.read_config())
    train_cfg.resume, train_cfg.progress, train_cfg.run_dir = cfg.run_dir, False, cfg.run_dir
    train_cfg.eval_every = max(train_cfg.eval_every, 1)
    if cfg.split == "test":
        train_cfg.test_episodes = cfg.episodes
    else:
        train_cfg.eval_episodes = cfg.episodes
    trainer = LocalTrainer(train_cfg, cfg.run_dir, resume=True, out=sys.stderr)
    try:
        iteration, policy = trainer.start_iteration - 1, "last"
        if cfg.best:
            best = checkpoint.read_best(run.best_path)
            if best is None:
                raise RunDirError(f"{run.path} kept no best policy (it ran without --keep-best)")
            trainer.model.load_state_dict(checkpoint.best_weights(run.best_path), strict=False)
            trainer.sync_engine(full=True)
            iteration, policy = int(best["iteration"]), "best"
        out = trainer.evaluate(iteration, split=cfg.split)
    finally:
        trainer.close()
    prefix = "eval" if cfg.split == "validation" else cfg.split
    metrics = {k[len(prefix) + 1:]: v for k, v in out.items() if k.startswith(prefix + "/")}
    metrics["seconds"] = out[f"time/{prefix}_s"]
    return run.record_evaluation(split=cfg.split, iteration=iteration, policy=policy, metrics=metrics)


def _scripted_policy(cfg: EvaluateConfig, train_cfg: TrainConfig) -> dict:
    """Evaluate a scripted player (`demo:NAME`) on the split, through the same agent loop and prompts."""
    import torch

    from oat_dppo.agent.demonstrations import DEMONSTRATORS, ScriptedEngine
    from oat_dppo.agent.loop import PromptFormat, play_episodes
    from oat_dppo.agent.metrics import episode_metrics
    from oat_dppo.backends.local.trainer import build_policy
    from oat_dppo.components import build_envs, resolve_template
    from oat_dppo.envs.splits import split_seeds
    from oat_dppo.seeds import derive_seed
    from oat_dppo.warm_start import end_of_turn_ids

    name = cfg.policy[len("demo:"):]
    envs = build_envs(train_cfg, cfg.episodes, split=cfg.split)
    try:
        model, tokenizer = build_policy(train_cfg, torch.device("cpu"))
        prompt = PromptFormat(tokenizer, resolve_template(train_cfg, model), train_cfg.system_prompt,
                              train_cfg.response_prefix)
        player = ScriptedEngine(DEMONSTRATORS[name], prompt, end_of_turn_ids(prompt),
                                seed=derive_seed(train_cfg.seed, "scripted-eval", cfg.split))
        preset = envs[0].preset
        max_new_tokens = train_cfg.max_new_tokens or preset.max_new_tokens
        episodes, stats = play_episodes(player, envs, split_seeds(cfg.split, len(envs), train_cfg.seed), prompt,
                                        max_new_tokens=max_new_tokens)
    finally:
        for env in envs:
            env.close()
    run = RunDir(cfg.out, create=True)
    run.write_config({**to_dict(train_cfg), "_policy": cfg.policy})
    metrics = {**episode_metrics(episodes), "env_errors": stats.env_errors}
    return run.record_evaluation(split=cfg.split, iteration=-1, policy=cfg.policy, metrics=metrics)


def parse(argv: list[str]) -> tuple[EvaluateConfig, TrainConfig | None]:
    """The evaluation's own options, and with --policy the run options after `--` (python -m oat_dppo.main's)."""
    own, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    cfg = parse_cli(EvaluateConfig, own, prog=PROG, description=__doc__)
    if cfg.episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {cfg.episodes}")
    if cfg.policy is None:
        if cfg.run_dir is None:
            raise ConfigError("give a RUN_DIR to evaluate, or --policy demo:NAME --out DIR with the run's options")
        if rest:
            raise ConfigError(f"options after --: {' '.join(rest)} (a run is evaluated with its own config.json)")
        return cfg, None
    from oat_dppo.agent.demonstrations import DEMONSTRATORS  # noqa: PLC0415

    if cfg.run_dir is not None or not cfg.out:
        raise ConfigError("--policy scores a scripted player: give --out DIR for its record, no RUN_DIR, and the "
                          "run options after -- (--policy demo:NAME --out DIR -- --env ...)")
    if not cfg.policy.startswith("demo:") or cfg.policy[len("demo:"):] not in DEMONSTRATORS:
        raise ConfigError(f"--policy {cfg.policy}: one of {', '.join('demo:' + n for n in DEMONSTRATORS)}")
    train_cfg = parse_cli(TrainConfig, rest, prog=f"{PROG} --policy {cfg.policy}")
    validate(train_cfg)
    return cfg, train_cfg


def summary(row: dict) -> str:
    solved = row.get("success_rate", math.nan)
    return (f"{row['split']}: reward {row['reward_mean']:.3f} (std {row.get('reward_std', math.nan):.3f}), success "
            f"{solved:.3f} over {int(row['episodes'])} episodes; policy {row['policy']} at iteration {row['iteration']}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg, train_cfg = parse(argv)
        row = _scripted_policy(cfg, train_cfg) if train_cfg is not None else _run_policy(cfg)
    except (ConfigError, RunDirError) as e:
        return fail(str(e))
    where = Path(cfg.out or cfg.run_dir) / "evaluations.jsonl"
    print(f"{summary(row)} (recorded in {where})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
