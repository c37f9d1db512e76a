"""`python -m oat_dppo.main --env ...`: train an LLM agent with a pluggable trust region.

Parses the command line (tyro, Oat's argument style), picks a backend, and runs. Bad input ends with
one clear line on stderr and exit status 2, before anything is written.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import tyro

from oat_dppo.backends import oat as oat_backend  # cheap: Oat itself is imported by main / program.launch
from oat_dppo.backends.oat.availability import missing, require
from oat_dppo import determinism, precheck
from oat_dppo.cli import fail
from oat_dppo.cli import parse as parse_cli
from oat_dppo.config import Backend, ConfigError, TrainConfig, from_dict, validate
from oat_dppo.rundir import RunDir, RunDirError, checkpoint_exists

PROG = "python -m oat_dppo.main"
# What --resume may change: how long the run goes on, and how it is watched. Everything else would
# make the resumed run another run than the one its checkpoint belongs to.
RESUMABLE = ("iterations", "resume", "run_dir", "threads", "progress", "device", "log", "wandb_project", "eval_every",
             "eval_episodes", "test_episodes", "save_every", "log_episodes", "keep_checkpoint", "keep_best")


@dataclass
class _Route:
    """The two options that decide how the rest of a command line is read."""

    backend: Backend = "auto"
    resume: Optional[str] = None


def route(argv: list[str]) -> _Route:
    """--backend and --resume alone (the other options, and --help, are read afterwards): tyro's
    partial parse, so that a command line with Oat's options reaches Oat's parser whole."""
    args = [a for a in argv if a not in ("-h", "--help")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found, _ = tyro.cli(_Route, args=args, prog=PROG, return_unknown_args=True)
    return found


def parse(argv: list[str]) -> TrainConfig:
    """The config from the command line; with --resume, the saved config with the CLI on top
    (`resumed_config` then refuses options a resume cannot change)."""
    resume = route(argv).resume
    if resume is None:
        return parse_cli(TrainConfig, argv, prog=PROG)
    saved = from_dict(RunDir(resume, create=False).read_config())
    saved.resume = None
    return resumed_config(saved, parse_cli(TrainConfig, argv, prog=PROG, default=dataclasses.replace(saved)))


def resumed_config(saved: TrainConfig, requested: TrainConfig) -> TrainConfig:
    """`requested` (the saved config with the command line on top), refused when it changes an
    option that is not in `RESUMABLE`."""
    changed = [f.name for f in dataclasses.fields(TrainConfig)
               if f.name not in RESUMABLE and getattr(requested, f.name) != getattr(saved, f.name)]
    if changed:
        flags = ", ".join("--" + n.replace("_", "-") for n in changed)
        keeps = ", ".join("--" + n.replace("_", "-") for n in RESUMABLE if n not in ("resume", "run_dir"))
        raise ConfigError(f"--resume continues the run with its saved configuration; {flags} cannot change there "
                          f"(a resume may change {keeps}). Start a new run to change {flags}.")
    return requested


def wants_oat(argv: list[str]) -> bool:
    """Does this command line run on the Oat backend? --backend oat; or auto (the default) where the
    whole stack is installed, except for --resume (a local run directory)."""
    r = route(argv)
    if r.backend == "oat":
        return True
    if r.backend != "auto" or r.resume is not None:
        return False
    return not missing()


def choose_backend(cfg: TrainConfig) -> str:
    if cfg.backend == "local":
        return "local"
    if cfg.backend == "oat":
        require()
        return "oat"
    return "local" if missing() else "oat"


def default_run_dir(cfg: TrainConfig) -> str:
    env = re.sub(r"[^A-Za-z0-9._-]+", "_", cfg.env).strip("_")
    tr = re.sub(r"[^A-Za-z0-9._-]+", "_", cfg.trust_region).strip("_")
    return str(Path("runs") / f"{env}-{tr}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}")


def run(cfg: TrainConfig) -> int:
    """Check `cfg`, then train. A new run's directory is created only once everything that bad input
    can break (strategy, environment, model, engine) has been built."""
    validate(cfg)
    if cfg.resume is None:  # a resumed run's options were checked when it started
        found = precheck.problems(cfg)
        if found:
            raise ConfigError("\nerror: ".join(found))
    if choose_backend(cfg) == "oat":
        from oat_dppo.backends.oat.program import launch  # Oat, DeepSpeed, vLLM: only to launch

        return launch(cfg)
    from oat_dppo.backends.local import LocalTrainer, resolve_engine, resolve_engine_dtype  # torch: not for --help

    cfg.engine = resolve_engine(cfg)
    cfg.engine_dtype = resolve_engine_dtype(cfg)
    resume = cfg.resume is not None
    if resume:
        path = RunDir(cfg.resume, create=False).path
        if not checkpoint_exists(path / "checkpoint"):
            raise RunDirError(f"cannot resume from {path}: it has no checkpoint yet. Start a new run, "
                              "or point --resume at a run that saved one.")
    else:
        path = Path(cfg.run_dir or default_run_dir(cfg)).expanduser()
        if (path / "metrics.jsonl").exists() or checkpoint_exists(path / "checkpoint"):
            raise ConfigError(f"{path} already holds a run; continue it with --resume {path} or choose another --run-dir")
        cfg.run_dir = str(path)
    engine = cfg.engine if cfg.engine_dtype == cfg.dtype else f"{cfg.engine} in {cfg.engine_dtype}"
    print(f"building: backend local, engine {engine}, trust region {cfg.trust_region}, env {cfg.env}, "
          f"model {cfg.model}", file=sys.stderr)
    with determinism.one_line_errors(cfg.deterministic):  # an op with no deterministic kernel: one line
        trainer = LocalTrainer(cfg, path, resume=resume)
        print(f"run dir: {path}", file=sys.stderr)  # only now: bad input stops the build, and leaves no directory
        return trainer.run()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if wants_oat(argv):  # Oat's options are not TrainConfig fields: its own parser (and --help)
            return oat_backend.main(argv)
        return run(parse(argv))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # expected bad-input errors become one line; anything else is a bug
        if _is_bad_input(e):
            return fail(str(e))
        raise


def _is_bad_input(e: Exception) -> bool:
    names = {"ConfigError", "RunDirError", "UnknownEnvError", "DatasetUnavailableError", "ModelNotFoundError"}
    return isinstance(e, (ConfigError, RunDirError)) or type(e).__name__ in names


if __name__ == "__main__":
    sys.exit(main())
