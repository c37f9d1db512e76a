"""`python -m oat_dppo.main --env ...`: train an LLM agent with a pluggable trust region.

Parses the command line (tyro, Oat's argument style), picks a backend, and runs. Bad input ends with
one clear line on stderr and exit status 2.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import tyro

from oat_dppo.config import ConfigError, TrainConfig, from_dict, to_dict, validate

EXIT_BAD_INPUT = 2
GPU_GUIDE = "docs/gpu.md"


def _resume_dir(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a == "--resume" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--resume="):
            return a.split("=", 1)[1]
    return None


def parse(argv: list[str]) -> TrainConfig:
    """The config from the command line; with --resume, the saved config with the CLI on top."""
    resume = _resume_dir(argv)
    if resume is None:
        return tyro.cli(TrainConfig, args=argv)
    from oat_dppo.rundir import RunDir

    saved = from_dict(RunDir(resume, create=False).read_config())
    saved.resume = None
    return tyro.cli(TrainConfig, args=argv, default=saved)


def missing_for_oat() -> list[str]:
    """What the Oat backend needs that this machine lacks (by installed distributions: the test
    suite's vllm/launchpad import fakes make `find_spec` lie)."""
    from oat_dppo.backends.oat.availability import missing

    return missing()


def _backend_in_argv(argv: list[str]) -> str:
    for i, a in enumerate(argv):
        if a == "--backend" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--backend="):
            return a.split("=", 1)[1]
    return "auto"


def wants_oat(argv: list[str]) -> bool:
    """Does this command line run on the Oat backend? --backend oat; or auto (the default) where the
    whole stack is installed, except for --resume (a local run directory)."""
    backend = _backend_in_argv(argv)
    if backend == "oat":
        return True
    if backend != "auto" or _resume_dir(argv) is not None:
        return False
    from oat_dppo.backends.oat.availability import missing_packages

    return not missing_packages() and not missing_for_oat()  # packages first: no torch import otherwise


def choose_backend(cfg: TrainConfig) -> str:
    if cfg.backend == "local":
        return "local"
    missing = missing_for_oat()
    if cfg.backend == "oat":
        if missing:
            raise ConfigError(
                f"--backend oat needs {', '.join(missing)}, which this machine lacks. "
                f"The GPU install guide is {GPU_GUIDE}; --backend local runs here."
            )
        return "oat"
    return "local" if missing else "oat"


def default_run_dir(cfg: TrainConfig) -> str:
    env = re.sub(r"[^A-Za-z0-9._-]+", "_", cfg.env).strip("_")
    tr = re.sub(r"[^A-Za-z0-9._-]+", "_", cfg.trust_region).strip("_")
    return str(Path("runs") / f"{env}-{tr}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}")


def run(cfg: TrainConfig) -> int:
    from oat_dppo.rundir import RunDir, RunDirError

    validate(cfg)
    backend = choose_backend(cfg)
    if backend == "oat":
        from oat_dppo.backends.oat import launch  # noqa: PLC0415 (GPU only)

        return launch(cfg)
    from oat_dppo.backends.local import resolve_engine

    cfg.engine = resolve_engine(cfg)  # before anything is written: the run records the engine it used
    resume = cfg.resume is not None
    if resume:
        run_dir = RunDir(cfg.resume, create=False)
    else:
        run_dir = RunDir(cfg.run_dir or default_run_dir(cfg))
        if run_dir.checkpoint_path.exists() or run_dir.metrics_path.exists():
            raise ConfigError(
                f"{run_dir.path} already holds a run; continue it with --resume {run_dir.path} or choose another --run-dir"
            )
        cfg.run_dir = str(run_dir.path)
        run_dir.write_config(to_dict(cfg))
    if resume:
        if not any((run_dir.path / d / "state.pt").exists() for d in ("checkpoint", "checkpoint.prev")):
            raise RunDirError(
                f"cannot resume from {run_dir.path}: it has no checkpoint yet. Start a new run, "
                "or point --resume at a run that saved one."
            )
        saved = run_dir.read_config()
        saved["iterations"] = cfg.iterations  # the one option a resume may change (train longer)
        run_dir.write_config(saved)
    print(f"run dir: {run_dir.path}  (backend local, engine {cfg.engine}, trust region {cfg.trust_region}, "
          f"env {cfg.env}, model {cfg.model})",
          file=sys.stderr)
    from oat_dppo.backends.local import LocalTrainer

    trainer = LocalTrainer(cfg, run_dir, resume=resume)
    return trainer.run()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if wants_oat(argv):  # Oat's options are not TrainConfig fields: its own parser (and --help)
            from oat_dppo.backends.oat import main as oat_main  # noqa: PLC0415

            return oat_main(argv)
        cfg = parse(argv)
        return run(cfg)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # expected bad-input errors become one line; anything else is a bug
        if _is_bad_input(e):
            print(f"error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise


def _is_bad_input(e: Exception) -> bool:
    from oat_dppo.rundir import RunDirError

    names = {"ConfigError", "RunDirError", "UnknownEnvError", "DatasetUnavailableError", "ModelNotFoundError"}
    return isinstance(e, (ConfigError, RunDirError)) or type(e).__name__ in names


if __name__ == "__main__":
    sys.exit(main())
