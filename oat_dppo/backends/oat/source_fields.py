"""Dataclass fields read from source text with `ast`: names, annotations, defaults and help.

Why: Oat's `PPOArgs` lives in `oat.algorithms.ppo`, which imports vLLM at module level. On a machine
with oat-llm installed but no vLLM (a CPU CI box after `make setup-oat`, a login node), the class
cannot be imported, yet `python -m oat_dppo.main --backend oat --help` must still list every Oat
option. So the fields are read from the installed Oat sources (found with `find_spec("oat")`, which
does not import the package) and a stand-in dataclass with the same fields is built. A test checks
the stand-in against the real class wherever both exist.

The same reader gives the help text of `oat_dppo.config.TrainConfig`'s fields (their docstrings),
which `make_dataclass` would otherwise lose.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

# Names an Oat annotation or default may use. Evaluated with no builtins beyond these.
_EVAL_NAMESPACE: dict[str, Any] = {
    "__builtins__": {},
    "math": math,
    "Optional": typing.Optional,
    "Union": typing.Union,
    "Literal": typing.Literal,
    "List": typing.List,
    "Dict": typing.Dict,
    "Tuple": typing.Tuple,
    "Any": typing.Any,
    "list": list,
    "dict": dict,
    "tuple": tuple,
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "None": None,
    "True": True,
    "False": False,
}

_MISSING = dataclasses.MISSING


@dataclass
class SourceField:
    name: str
    annotation: str  # source text, e.g. "Optional[float]"
    default: Any = _MISSING
    default_factory: Callable[[], Any] | Any = _MISSING
    help: str = ""

    def type(self) -> Any:
        return eval(self.annotation, dict(_EVAL_NAMESPACE))  # noqa: S307 (restricted namespace)


def _comment_above(lines: list[str], lineno: int) -> str:
    """The contiguous `# ...` lines right above 1-based `lineno` (Oat documents fields this way)."""
    out = []
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        out.append(lines[i].strip().lstrip("#").strip())
        i -= 1
    return " ".join(reversed(out))


def _default_of(value: ast.expr | None) -> tuple[Any, Any, str]:
    """(default, default_factory, help) of a field's right-hand side."""
    if value is None:
        return _MISSING, _MISSING, ""
    if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) == "field":
        default, factory, help_ = _MISSING, _MISSING, ""
        for kw in value.keywords:
            if kw.arg == "default":
                default = _eval(kw.value)
            elif kw.arg == "default_factory":
                factory = _eval(kw.value)
            elif kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
                for k, v in zip(kw.value.keys, kw.value.values):
                    if isinstance(k, ast.Constant) and k.value == "help" and isinstance(v, ast.Constant):
                        help_ = str(v.value)
        return default, factory, help_
    return _eval(value), _MISSING, ""


def _eval(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:  # math.inf, lambda: [...], -1 * x ...
        return eval(compile(ast.Expression(node), "<oat source>", "eval"), dict(_EVAL_NAMESPACE))  # noqa: S307


def read_dataclass(source: str, class_name: str) -> list[SourceField]:
    """The annotated fields of `class_name` in `source`, in order, with help from the field's
    docstring (a string right after it), `metadata={"help": ...}`, or the comment above it."""
    tree = ast.parse(source)
    lines = source.splitlines()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            break
    else:
        raise LookupError(f"class {class_name} not found")
    out: list[SourceField] = []
    body = node.body
    for i, stmt in enumerate(body):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        default, factory, help_ = _default_of(stmt.value)
        nxt = body[i + 1] if i + 1 < len(body) else None
        if not help_ and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            # A docstring directly below the field (no blank line): the field's help, as tyro reads it.
            if nxt.lineno == stmt.end_lineno + 1:
                help_ = " ".join(nxt.value.value.split())
        if not help_:
            help_ = _comment_above(lines, stmt.lineno)
        out.append(SourceField(stmt.target.id, ast.unparse(stmt.annotation), default, factory, help_))
    return out


def oat_source_dir() -> Path | None:
    """The installed `oat` package folder, without importing it (None when oat-llm is absent)."""
    try:
        spec = importlib.util.find_spec("oat")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def oat_ppo_args_fields() -> list[SourceField] | None:
    """`OATArgs` then `PPOArgs` fields, as dataclass inheritance orders them (a redefined field keeps
    its first position, takes the later definition)."""
    root = oat_source_dir()
    if root is None:
        return None
    try:
        base = read_dataclass((root / "args.py").read_text(), "OATArgs")
        ppo = read_dataclass((root / "algorithms" / "ppo.py").read_text(), "PPOArgs")
    except (OSError, LookupError, SyntaxError):
        return None
    merged = {f.name: f for f in base}
    for f in ppo:
        merged[f.name] = f
    return list(merged.values())


def as_dataclass_fields(fields: list[SourceField], annotate: Callable[[SourceField], Any]) -> list[tuple]:
    """`make_dataclass` triples; `annotate(field)` gives the (possibly Annotated) type."""
    out = []
    for f in fields:
        if f.default_factory is not _MISSING:
            spec = dataclasses.field(default_factory=f.default_factory)
        elif f.default is not _MISSING:
            spec = dataclasses.field(default=f.default)
        else:
            spec = dataclasses.field()
        out.append((f.name, annotate(f), spec))
    return out
