"""The one way every entry point reads its command line: `python -m oat_dppo.<name> ...`.

An entry point describes its options as a dataclass: field `some_name` is `--some-name`, its help
is `opt(default, "help")` (or a docstring under the field), `tyro.conf.Positional[...]` makes a
positional argument. `parse` reads the command line with tyro, shows `python -m oat_dppo.<name>` in
the usage line and the module docstring as the description. Bad input ends with `fail`: one line on
stderr, exit status 2. Importing this module is cheap (tyro only), so `--help` stays instant.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from typing import IO, Any, TypeVar

import tyro

EXIT_BAD_INPUT = 2
T = TypeVar("T")


def opt(default: Any, help: str) -> Any:
    """A dataclass field with its help text (tyro shows it; Oat's argument class copies it)."""
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def parse(config: type[T], argv: list[str] | None, *, prog: str, description: str | None = None,
          default: T | None = None) -> T:
    """`config` from `argv` (None: sys.argv[1:]); --help prints and exits 0, bad options exit 2."""
    with stdout_may_close():
        return tyro.cli(config, args=argv, prog=prog, description=description, default=default)


@contextlib.contextmanager
def stdout_may_close():
    """Output into a pipe its reader closed (`--help | head`) ends quietly, with status 0: the reader
    has what it wanted. Stdout then points at /dev/null, so the interpreter's final flush does not
    print a second BrokenPipeError (the recipe of Python's `signal` documentation)."""
    try:
        try:
            yield
        finally:  # --help ends in SystemExit: its text is flushed here, not at interpreter exit
            sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(0) from None


def python_command() -> str:
    """This interpreter as a command to copy: `python` where that is what PATH finds (an activated
    venv), else its path, relative to the working directory when inside it (`.venv/bin/python`)."""
    import shutil  # noqa: PLC0415

    found = shutil.which("python")
    if found and os.path.abspath(found) == os.path.abspath(sys.executable):
        return "python"
    relative = os.path.relpath(sys.executable)
    return relative if not relative.startswith("..") else sys.executable


def fail(message: str, *, err: IO | None = None) -> int:
    """Report bad input as one line and return the exit status for it."""
    print(f"error: {message}", file=err or sys.stderr)
    return EXIT_BAD_INPUT


__all__ = ["EXIT_BAD_INPUT", "fail", "opt", "parse", "python_command", "stdout_may_close"]
