"""`python -m oat_dppo.export RUN_DIR OUT_DIR [--best]`: a run's trained policy (its last checkpoint, or with
`--best` the best held-out policy `--keep-best` kept) as a Hugging Face model directory.

The policy is rebuilt as the run built it (its config.json: model, LoRA, trainable layers), the
checkpoint's trained weights are loaded (safely: safetensors, or a 0.1 checkpoint as tensors only),
LoRA adapters are merged into the weights, and OUT_DIR gets `save_pretrained` safetensors, the
tokenizer and the generation config: `transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)` and
`vllm.LLM(OUT_DIR)` load it like any checkpoint (e.g. to evaluate it, or to start another run with
`--model OUT_DIR`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from oat_dppo.cli import fail, parse
from oat_dppo.config import ConfigError, from_dict
from oat_dppo.rundir import RunDir, RunDirError, give_new_file_mode

PROG = "python -m oat_dppo.export"


@dataclass
class ExportConfig:
    """python -m oat_dppo.export RUN_DIR OUT_DIR: save a run's trained policy as a Hugging Face model."""

    run_dir: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="RUN_DIR")]
    """The run directory (with config.json and a checkpoint)."""
    out_dir: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="OUT_DIR")]
    """Where the model directory goes (created; must be empty unless --overwrite)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """The saved weights' dtype (auto: the run's --dtype)."""
    overwrite: bool = False
    """Write into an OUT_DIR that already holds files."""
    best: bool = False
    """Export the policy of the run's best held-out evaluation (RUN_DIR/best/, kept by --keep-best), not its
    last checkpoint."""


def export(run_dir: str | Path, out_dir: str | Path, *, dtype: str = "auto", overwrite: bool = False,
           best: bool = False) -> Path:
    """Write the trained policy of `run_dir` (`best`: its best held-out one) to `out_dir`; returns `out_dir`. Bad input raises
    `ConfigError` / `RunDirError` (one line)."""
    # torch and transformers after the arguments are parsed: `--help` and bad input answer at once
    import torch

    from oat_dppo.backends.local.checkpoint import CheckpointError, best_weights, trained_weights
    from oat_dppo.backends.local.trainer import build_policy
    from oat_dppo.models.common import save_config_for_both, save_tokenizer

    run = RunDir(run_dir, create=False)
    out = Path(out_dir).expanduser()
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{out} is not empty; choose another OUT_DIR or pass --overwrite")
    cfg = from_dict(run.read_config())
    try:
        weights = best_weights(run.best_path) if best else trained_weights(run.checkpoint_path)
    except CheckpointError as e:
        raise RunDirError(f"cannot export {run.path}: no usable {'best policy' if best else 'checkpoint'} ({e})") from None
    cfg.gradient_checkpointing = False
    model, tokenizer = build_policy(cfg, torch.device("cpu"))
    result = model.load_state_dict(weights, strict=False)
    if result.unexpected_keys:
        raise RunDirError(f"{run.path}: its checkpoint does not fit the policy its config.json builds "
                          f"(unexpected {result.unexpected_keys[:3]})")
    if hasattr(model, "merge_and_unload"):  # LoRA: fold B A into the base weights
        model = model.merge_and_unload()
    if dtype != "auto":
        model = model.to(getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    give_new_file_mode(*out.glob("*.safetensors"))  # safetensors leaves 0600, not what open() gives
    save_config_for_both(out)  # config and tokenizer loadable by transformers 4 (Oat) and 5
    save_tokenizer(tokenizer, out)
    return out


def main(argv: list[str] | None = None) -> int:
    cfg = parse(ExportConfig, argv, prog=PROG, description=__doc__)
    try:
        out = export(cfg.run_dir, cfg.out_dir, dtype=cfg.dtype, overwrite=cfg.overwrite, best=cfg.best)
    except (ConfigError, RunDirError) as e:
        return fail(str(e))
    print(f"exported {cfg.run_dir} to {out} (load with transformers' from_pretrained, or --model {out})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
