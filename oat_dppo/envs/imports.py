"""`package.module:Name` -> the object it names: users' environments, the presets' feedback probes.

A leaf module (it imports nothing of the package), so the registry, the presets and the adapter can
all use it without importing each other.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable


class ImportPathError(LookupError):
    """The path names nothing: no such module, or no such attribute in it (the message says which)."""


def load_object(path: str) -> Any:
    """The object `package.module:Attr.sub` names. A module that exists but fails on one of ITS
    imports raises that error as it is (the user's code is broken, not the path)."""
    module_name, _, attr_path = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ImportPathError(f"no module named {missing!r}") from None
        raise
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise ImportPathError(f"module {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, part)
    return obj


def accepts_keyword(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` takes a keyword argument `name` (by name or through **kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
