"""The command line of a benchmark: one `--option` per field of its `Config` dataclass."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Mapping


def config_parser(prog: str, doc: str | None, config: Any, helps: Mapping[str, str]) -> argparse.ArgumentParser:
    """A parser with `--field-name` for every field of the dataclass instance `config` (its value is
    the default, shown in --help). Every field needs a line in `helps`: the help explains itself."""
    missing = [f.name for f in dataclasses.fields(config) if f.name not in helps]
    if missing:
        raise ValueError(f"{prog}: no help text for {', '.join(missing)}")
    p = argparse.ArgumentParser(
        prog=prog,
        description=(doc or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for f in dataclasses.fields(config):
        v = getattr(config, f.name)
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=type(v), default=v, help=helps[f.name])
    return p
