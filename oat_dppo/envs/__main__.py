"""`python -m oat_dppo.envs --list`: the environment ids `make_env` accepts."""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, fields
from typing import Annotated, Optional

import tyro

from oat_dppo.cli import opt, parse
from oat_dppo.config import TrainConfig
from oat_dppo.envs.presets import FIRST_CLASS_ENV_IDS, HUB_FAMILIES, family_of, get_preset, known_env_ids

_FAMILY_ORDER = ("game", "rg", "math", "eval", "code", "qa", "logic")


def _print_ids() -> None:
    groups: dict[str, list[str]] = defaultdict(list)
    for env_id in known_env_ids():
        groups[family_of(env_id)].append(env_id)
    print("Environment ids for `--env` / make_env (* = first-class: preset, tested offline)")
    for family in sorted(groups, key=lambda f: (_FAMILY_ORDER + (f,)).index(f)):
        ids = sorted(groups[family], key=lambda i: (i not in FIRST_CLASS_ENV_IDS, i))
        if family in ("math", "eval"):
            note = "  (unmarked ids download an HF hub dataset; math ones run offline with --math-data FILE)"
        else:
            note = "  (downloads an HF hub dataset)" if family in HUB_FAMILIES else ""
        print(f"\n{family} ({len(ids)}){note}")
        for env_id in ids:
            print(f"  {'*' if env_id in FIRST_CLASS_ENV_IDS else ' '} {env_id}")
    print("\nYour own gymnasium-style text env: --env package.module:ClassOrFactory")


def _print_preset(env_id: str, model: str) -> None:
    preset = get_preset(env_id)
    for f in fields(preset):
        value = getattr(preset, f.name)
        if f.name == "template":  # the preset's is a hint (the paper's Qwen3); a run's follows its model
            print(_template_line(model))
            continue
        print(f"{f.name:18} {dict(value) if f.name == 'env_kwargs' else value!r}")


def _template_line(model: str) -> str:
    """The prompt template a run with `--model model` uses (--template auto), resolved as the trainer
    resolves it: from the model's name, or a local model's chat template file; no weights are loaded."""
    from oat_dppo.components import resolve_template  # noqa: PLC0415 (torch, transformers: only for --show)

    template = resolve_template(TrainConfig(model=model), model)
    return (f"{'template':18} {template!r}  (the run's prompt template with --model {model}: its family's; "
            "another --model can get another, --template sets one)")


# The main command's --model default: --show answers for the model a run gets without --model.
DEFAULT_MODEL = next(f.default for f in fields(TrainConfig) if f.name == "model")


PROG = "python -m oat_dppo.envs"
DESCRIPTION = "Text environments of oat_dppo: list the ids (--list), show an id's preset (--show ENV_ID)."


@dataclass
class EnvsArgs:
    list: bool = opt(False, "print every known environment id, by family")
    show: Annotated[Optional[str], tyro.conf.arg(metavar="ENV_ID")] = opt(
        None, "print the preset (defaults) of this environment id")
    model: Annotated[str, tyro.conf.arg(metavar="MODEL")] = opt(
        DEFAULT_MODEL, "with --show: the model (as `python -m oat_dppo.main --model`) whose prompt template to "
                       "show: the template follows the model's family")


def main(argv: list[str] | None = None) -> int:
    args = parse(EnvsArgs, argv, prog=PROG, description=DESCRIPTION)
    if args.list:
        _print_ids()
    if args.show:
        _print_preset(args.show, args.model)
    if not (args.list or args.show):
        parse(EnvsArgs, ["--help"], prog=PROG, description=DESCRIPTION)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `--list | head`: the reader left; not an error
        sys.stderr.close()
        sys.exit(0)
