"""Study files: TOML -> checked, expanded runs (`load_study`).

    [study]                      # how to run it
    name = "smollm2_gtn"         # default: the file name without .toml
    parallel = 1                 # runs at once (local backend)
    out = "runs/studies/smollm2_gtn"
    threshold = 0.5              # for "iterations to reach" in the report
    backend = "local"            # or "oat": write launch_oat.sh instead of running

    [base]                       # any option of `python -m oat_dppo.main` (TrainConfig field names)
    model = "smollm2"

    [grid]                       # lists: the cartesian product of all of them
    trust_region = ["ppo_clip", "dppo_binary_tv"]
    seed = [0, 1, 2]
    variant = [{trust_region = "dppo_binary_tv", delta = 0.2}, {trust_region = "ppo_clip"}]  # bundles

Every problem (unknown key, wrong type, unknown trust region or environment, a combination
`oat_dppo.config.validate` rejects) is reported as `FILE: [table] key: message` with the valid choices,
all of them at once, before anything runs: `StudyError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import hashlib
import itertools
import json
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (the Oat profile): the same parser as a package
    import tomli as tomllib

from oat_dppo.config import ConfigError, TrainConfig, to_dict, trust_region_params, validate
from oat_dppo.plot.data import IGNORED_CONFIG_KEYS

STUDY_KEYS = {
    "name": "the study's name (default: the file name without .toml)",
    "parallel": "how many runs at once on the local backend (default 1)",
    "out": "where the run directories and the report go (default runs/studies/<name>)",
    "threshold": "reward for the 'iterations to reach' column of the report (default: no such column)",
    "final_window": "iterations at the end of a run whose mean reward is its 'final reward' (default 3)",
    "backend": '"local" (run here) or "oat" (write <out>/launch_oat.sh, run nothing) (default "local")',
    "results": "where finished runs are committed as config.json + metrics.jsonl, one directory per run, and "
               "read back from on any clone (default: none)",
}
TABLES = ("study", "base", "grid")
BACKENDS = ("local", "oat")
# Options the study runner sets itself for every run.
RESERVED = {
    "run_dir": "every run's directory is <out>/<run name>",
    "resume": "the runner resumes interrupted runs itself",
    "backend": 'choose it with backend = "local" | "oat" in [study]',
    "progress": "runs log to <run dir>.log without a progress bar",
}
# Always in a run's name (in this order, seed last), whether set in [base] or [grid].
NAME_KEYS = ("model", "env", "trust_region")

FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(TrainConfig)}
_HINTS = typing.get_type_hints(TrainConfig)


class StudyError(ValueError):
    """Bad study input: `errors` holds one `FILE: [table] key: message` per problem, in file order."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("\n".join(self.errors))


@dataclass(frozen=True)
class Origin:
    """Where a value of a run came from: [base] key, or [grid] axis (and a bundle's key)."""

    table: str  # "base" | "grid"
    axis: str  # the key in that table
    key: str | None = None  # inside a bundle's inline table

    def describe(self) -> str:
        return f"[{self.table}] {self.axis}" + (f".{self.key}" if self.key else "")


@dataclass
class RunSpec:
    """One run of a study: its name, directory and resolved configuration."""

    name: str
    run_dir: Path
    config: TrainConfig  # resolved: study options on top of TrainConfig's defaults, run_dir set
    options: dict[str, Any]  # the options the study set ([base] + this grid point), TrainConfig order
    grid: dict[str, Any]  # the options this grid point set (field -> value)
    origins: dict[str, Origin] = field(default_factory=dict, repr=False)
    results_dir: Path | None = None  # its committed copy, <[study] results>/<name> (oat_dppo.study.committed)

    @property
    def seed(self) -> int:
        return self.config.seed


@dataclass
class Study:
    name: str
    path: Path
    out: Path
    parallel: int
    threshold: float | None
    backend: str
    base: dict[str, Any]
    runs: list[RunSpec]
    final_window: int = 3
    results: Path | None = None

    def select(self, patterns: list[str] | None) -> list[RunSpec]:
        """Runs whose name matches any pattern (a glob when it has * ? or [, else a substring)."""
        if not patterns:
            return list(self.runs)
        return [r for r in self.runs if any(name_matches(r.name, p) for p in patterns)]


def name_matches(name: str, pattern: str) -> bool:
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


# ---- values --------------------------------------------------------------------------------------


def _type_check(name: str, value: Any) -> tuple[Any, str | None]:
    """(the value converted to the option's type, or an error message)."""
    hint = _HINTS[name]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else hint
        origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value in choices and type(value) is type(choices[0]):
            return value, None
        return value, f"{value!r} is not a valid {name}; valid: {', '.join(map(str, choices))}"
    if hint is bool:
        return (value, None) if isinstance(value, bool) else (value, f"{name} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value, None
        return value, f"{name} must be an integer, got {value!r}"
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), None
        return value, f"{name} must be a number, got {value!r}"
    if hint is str:
        if isinstance(value, str):
            return value, None
        return value, f"{name} must be a string, got {value!r}"
    if origin is tuple:  # a repeatable option (--tr-param, --env-option): a list of NAME=VALUE strings
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value), None
        return value, f"{name} must be a list of strings (each NAME=VALUE), got {value!r}"
    return value, None  # an annotation this checker does not know: left to validate()


def format_value(value: Any) -> str:
    """A value as a command-line word (floats as repr, bools lowercase, a list joined by spaces)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return " ".join(map(format_value, value))
    return repr(value) if isinstance(value, float) else str(value)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "_"


# A run's name is a directory name, and with ".log" a file name: file systems allow 255 bytes. A
# longer name keeps its start and ends in a hash of the whole name and the seed.
MAX_RUN_NAME = 240


def run_name(config: TrainConfig, grid: dict[str, Any]) -> str:
    """`<model>__<env>__<trust region>[__<key>-<value> ...]__s<seed>`: the model, env and trust
    region always, the other options this grid point sets in TrainConfig order, the seed last.
    Depends only on values (not on the order of keys in the file), so it is stable. Over
    MAX_RUN_NAME characters (long prompts in --env-option): `<its start>__h<10 hex of sha1>__s<seed>`."""
    parts = [_slug(str(getattr(config, k))) for k in NAME_KEYS]
    for name in FIELDS:
        if name in grid and name not in NAME_KEYS and name != "seed":
            parts.append(f"{name}-{_slug(format_value(grid[name]))}")
    seed = f"s{config.seed}"
    name = "__".join([*parts, seed])
    if len(name) <= MAX_RUN_NAME:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:10]
    tail = f"__h{digest}__{seed}"
    return name[: MAX_RUN_NAME - len(tail)].rstrip("_") + tail


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def option_args(options: dict[str, Any]) -> list[str]:
    """`python -m oat_dppo.main` arguments for options (TrainConfig field -> value)."""
    args: list[str] = []
    for name in FIELDS:
        if name not in options:
            continue
        value = options[name]
        if isinstance(value, bool):
            args.append(flag(name) if value else "--no-" + name.replace("_", "-"))
            continue
        if isinstance(value, tuple):  # a repeatable option: the flag once per item
            args += [f"{flag(name)}={item}" for item in value]
            continue
        text = format_value(value)
        if not text or text.startswith("-"):
            args.append(f"{flag(name)}={text}")
        else:
            args += [flag(name), text]
    return args


# ---- loading -------------------------------------------------------------------------------------


class _Checker:
    """Collects problems, each located by its key path (`[grid] variant.delta`, `[grid] seed = 3`)."""

    def __init__(self, path: Path, data: dict):
        self.path = path
        self._order = {(t, k): i for t, table in data.items() if isinstance(table, dict) for i, k in enumerate(table)}
        self._found: dict[str, tuple] = {}  # message -> its place in the file

    def error(self, where: str | None, message: str) -> None:
        """`message`, prefixed by `where` unless it names its location itself (starts with "[")."""
        text = message if where is None or message.startswith("[") else f"{where}: {message}"
        self._found.setdefault(f"{self.path}: {text}", self._place(where) + (len(self._found),))

    def _place(self, where: str | None) -> tuple[int, int]:
        """(table, key) ranks of a key path in the file: [study], [base], [grid] in TABLES order."""
        if not where:
            return len(TABLES), 0
        table, _, rest = where.partition("]")
        table = table.lstrip("[")
        key = rest.split(" = ")[0].strip().split(".")[0]
        rank = TABLES.index(table) if table in TABLES else len(TABLES)
        return rank, self._order.get((table, key), len(self._order))

    @property
    def errors(self) -> list[str]:
        """In file order: [study], [base], [grid] (each in the order of its keys), then the rest."""
        return sorted(self._found, key=self._found.__getitem__)

    def at(self, *path: str, key: str | None = None, value: Any = None) -> str:
        """The key path of a table, key, inline-table key, or (in [grid]) one of a key's values."""
        where = f"[{path[0]}]" + (f" {path[1]}" if len(path) > 1 else "") + (f".{key}" if key else "")
        return where + (f" = {format_value(value)}" if value is not None else "")


def _suggest(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_option(chk: _Checker, key: str, value: Any, table: str, axis: str, in_bundle: bool) -> tuple[Any, bool]:
    """Check one option name and value; (converted value, ok)."""
    where = (table, axis)
    loc = chk.at(*where, key=key) if in_bundle else chk.at(*where)
    if key not in FIELDS:
        chk.error(
            loc,
            f"{loc}: unknown option {key!r}{_suggest(key, FIELDS)}; valid options (python -m oat_dppo.main "
            f"--help): {', '.join(n for n in FIELDS if n not in RESERVED)}",
        )
        return value, False
    if key in RESERVED:
        chk.error(loc, f"{loc}: {key} is set by the study runner ({RESERVED[key]})")
        return value, False
    converted, problem = _type_check(key, value)
    if problem:
        chk.error(chk.at(*where, key=key if in_bundle else None, value=value) if table == "grid" else loc,
                  f"{loc}: {problem}")
        return value, False
    return converted, True


def _check_study_table(chk: _Checker, table: dict, default_name: str) -> dict:
    out = {"name": default_name, "parallel": 1, "out": None, "threshold": None, "backend": "local", "final_window": 3,
           "results": None}
    for key, value in table.items():
        loc = chk.at("study", key)
        if key not in STUDY_KEYS:
            chk.error(loc, f"[study] unknown key {key!r}{_suggest(key, STUDY_KEYS)}; valid keys: {', '.join(STUDY_KEYS)}")
            continue
        ok = True
        if key in ("name", "out", "results"):
            ok = isinstance(value, str) and value.strip() != ""
            msg = f"[study] {key} must be a non-empty string, got {value!r}"
        elif key in ("parallel", "final_window"):
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            msg = f"[study] {key} must be an integer >= 1, got {value!r}"
        elif key == "threshold":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            msg = f"[study] threshold must be a number (a reward), got {value!r}"
            value = float(value) if ok else value
        else:  # backend
            ok = value in BACKENDS
            msg = f"[study] backend {value!r} is not valid; valid: {', '.join(BACKENDS)}"
        if not ok:
            chk.error(loc, msg)
            continue
        out[key] = value
    if out["name"] != default_name and _slug(out["name"]) != out["name"]:
        chk.error(chk.at("study", "name"), f"[study] name {out['name']!r} must use only letters, digits, '.', '_' and '-'")
    return out


def _check_grid(chk: _Checker, grid: dict) -> list[tuple[str, list[dict[str, Any]]]]:
    """[grid] -> axes: (axis name, its points, each a dict of options)."""
    axes: list[tuple[str, list[dict[str, Any]]]] = []
    owner: dict[str, str] = {}  # option -> the axis that sets it
    for axis, values in grid.items():
        loc = chk.at("grid", axis)
        if not isinstance(values, list):
            hint = f"e.g. {axis} = [{format_value(values) if not isinstance(values, str) else repr(values)}]"
            chk.error(loc, f"[grid] {axis} must be a list of values ({hint}); a fixed value goes in [base]")
            continue
        if not values:
            chk.error(loc, f"[grid] {axis} is an empty list: the study would have no runs")
            continue
        tables = [isinstance(v, dict) for v in values]
        if any(tables) and not all(tables):
            chk.error(loc, f"[grid] {axis} mixes values and tables: give either a list of values or a list of "
                            "inline tables (options that vary together)")
            continue
        points: list[dict[str, Any]] = []
        ok = True
        if all(tables):  # a bundle: options that vary together
            if axis in FIELDS:
                chk.error(loc, f"[grid] {axis} is an option, so it takes a list of values; name a list of inline "
                                "tables something that is not an option, e.g. variant = [{...}, {...}]")
                continue
            keys_here: set[str] = set()
            for i, entry in enumerate(values):
                if not entry:
                    chk.error(loc, f"[grid] {axis}: entry {i + 1} is an empty table")
                    ok = False
                    continue
                point = {}
                for key, value in entry.items():
                    converted, good = _check_option(chk, key, value, "grid", axis, in_bundle=True)
                    ok &= good
                    point[key] = converted
                    keys_here.add(key)
                points.append(point)
            set_keys = keys_here
        else:
            if axis not in FIELDS:
                _check_option(chk, axis, values[0], "grid", axis, in_bundle=False)
                continue
            for value in values:
                converted, good = _check_option(chk, axis, value, "grid", axis, in_bundle=False)
                ok &= good
                points.append({axis: converted})
            set_keys = {axis}
            if ok and len({json.dumps(v) for v in values}) < len(values):
                dup = next(v for i, v in enumerate(values) if v in values[:i])
                chk.error(chk.at("grid", axis, value=dup), f"[grid] {axis} lists {format_value(dup)} twice")
                ok = False
        for key in sorted(set_keys):
            if key in owner:
                chk.error(loc, f"[grid] {axis} sets {key}, which [grid] {owner[key]} already varies: "
                                "vary each option in one place (bundle them if they vary together)")
                ok = False
            owner.setdefault(key, axis)
        if ok:
            axes.append((axis, points))
    return axes


def _flags_in(message: str) -> list[str]:
    """TrainConfig fields named as --flags in an error message."""
    names = []
    for m in re.finditer(r"--([a-z][a-z0-9-]*)", message):
        name = m.group(1).replace("-", "_")
        if name in FIELDS and name not in names:
            names.append(name)
    return names


def _locate(chk: _Checker, run: RunSpec, names: list[str]) -> str | None:
    """Where the study sets the first of `names` for this run (grid first), as a key path."""
    origins = [(n, run.origins[n]) for n in names if n in run.origins]
    origins.sort(key=lambda p: p[1].table != "grid")
    for name, o in origins:
        value = run.options.get(name)
        if o.key is not None:
            return chk.at(o.table, o.axis, key=o.key, value=value)
        return chk.at(o.table, o.axis, value=value if o.table == "grid" else None)
    return None


def _check_runs(chk: _Checker, runs: list[RunSpec], *, cross_checks: bool = True) -> None:
    """Per-run checks. `cross_checks=False` (the file already has errors): only the checks that do
    not depend on other options (trust region and env names), so that a value dropped for being bad
    does not show up as another, made-up problem."""
    from oat_dppo.precheck import env_problem, model_problem, trust_region_problem  # torch (trust regions)

    checked: dict[tuple[str, str], str | None] = {}
    found: dict[tuple[str | None, str], list[str]] = {}  # (where, problem) -> runs with it

    def problem(where: str | None, message: str, run: RunSpec) -> None:
        found.setdefault((where, message), []).append(run.name)

    def once(kind: str, value: str, check) -> str | None:
        if (kind, value) not in checked:
            checked[kind, value] = check()
        return checked[kind, value]

    for run in runs:
        cfg = run.config
        if cross_checks:
            try:
                validate(cfg)
            except ConfigError as e:
                problem(_locate(chk, run, _flags_in(str(e))), str(e), run)
        try:
            params = trust_region_params(cfg)
        except ConfigError as e:  # a parameter given twice
            problem(_locate(chk, run, _flags_in(str(e)) + ["tr_param"]), str(e), run)
            continue
        tr_key = cfg.trust_region + repr(sorted(params.items()))
        message = once("trust_region", tr_key, lambda: trust_region_problem(cfg))
        if message:
            field_of = {"C": "clip_c"}
            keys = ["trust_region"] if message.startswith("unknown trust region") else (
                [field_of.get(p, p) for p in params] + ["trust_region"])
            problem(_locate(chk, run, keys), message, run)
        message = once("env", cfg.env, lambda: env_problem(cfg.env))
        if message:
            problem(_locate(chk, run, ["env"]), message, run)
        message = once("model", cfg.model, lambda: model_problem(cfg.model))
        if message:
            problem(_locate(chk, run, ["model"]), message, run)
    for (where, message), names_hit in found.items():
        more = f" (and {len(names_hit) - 1} more)" if len(names_hit) > 1 else ""
        chk.error(where, f"run {names_hit[0]}{more}: {message}")


def load_study(path: str | Path, *, parallel: int | None = None) -> Study:
    """Read, check and expand a study file. Raises StudyError listing every problem found.

    `parallel` overrides [study] parallel (and so the default --threads of every run)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise StudyError([f"{path}: cannot read the study file ({e.strerror or e})"]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:  # its message names the line and column
        raise StudyError([f"{path}: not valid TOML: {e}"]) from None
    chk = _Checker(path, data)
    for key, value in data.items():
        if key not in TABLES:
            chk.error(chk.at(key), f"unknown table or key {key!r}{_suggest(key, TABLES)}; a study file has the "
                                   f"tables {', '.join(f'[{t}]' for t in TABLES)}")
        elif not isinstance(value, dict):
            chk.error(chk.at(key), f"{key} must be a table: [{key}]")
    get = lambda t: data.get(t) if isinstance(data.get(t), dict) else {}  # noqa: E731
    study = _check_study_table(chk, get("study"), path.stem)
    if parallel is not None:
        study["parallel"] = parallel
    base: dict[str, Any] = {}
    for key, value in get("base").items():
        converted, ok = _check_option(chk, key, value, "base", key, in_bundle=False)
        if ok:
            base[key] = converted
    axes = _check_grid(chk, get("grid"))
    # Problems so far do not stop the checks: the runs are expanded without the bad values, and their
    # names are checked too, so that a file's every problem is reported at once.
    cross_checks = not chk.errors

    out = Path(study["out"] or Path("runs") / "studies" / study["name"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // study["parallel"])
    runs: list[RunSpec] = []
    for combo in itertools.product(*[[(axis, p) for p in points] for axis, points in axes]):
        grid: dict[str, Any] = {}
        origins = {k: Origin("base", k) for k in base}
        for axis, point in combo:
            grid.update(point)
            for k in point:
                origins[k] = Origin("grid", axis, k if axis not in FIELDS else None)
        merged = {**base, **grid}
        options = {n: merged[n] for n in FIELDS if n in merged}
        cfg = TrainConfig(**options)
        name = run_name(cfg, grid)
        cfg.run_dir = str(out / name)
        cfg.backend = study["backend"]
        if study["backend"] == "local":  # N runs share the cores; their output goes to a log file
            cfg.threads = options.get("threads", threads)
            cfg.progress = False
        results_dir = Path(study["results"]) / name if study["results"] else None
        runs.append(RunSpec(name, out / name, cfg, options, grid, origins, results_dir))
    by_name: dict[str, RunSpec] = {}
    for run in runs if cross_checks else []:  # with axes dropped for bad values, names may repeat
        if run.name in by_name:
            other = by_name[run.name]
            chk.error(_locate(chk, run, list(run.grid)) or chk.at("grid"),
                      f"two grid points give the same run {run.name} ({_describe(other.grid)} and "
                      f"{_describe(run.grid)}): the grid repeats a combination")
        by_name.setdefault(run.name, run)
    _check_runs(chk, runs, cross_checks=cross_checks)
    if chk.errors:
        raise StudyError(chk.errors)
    return Study(study["name"], path, out, study["parallel"], study["threshold"], study["backend"], base, runs,
                 final_window=study["final_window"], results=Path(study["results"]) if study["results"] else None)


def _describe(grid: dict[str, Any]) -> str:
    return ", ".join(f"{k}={format_value(v)}" for k, v in grid.items()) or "no grid values"


def config_differences(saved: dict, run: RunSpec) -> list[str]:
    """Options in which an existing run directory's config.json differs from the study's run
    (bookkeeping keys such as seed-independent paths, threads or iterations aside)."""
    ignore = (set(IGNORED_CONFIG_KEYS) - {"seed"}) | {"backend"}
    want = json.loads(json.dumps(to_dict(run.config)))
    diffs = []
    for key, value in want.items():
        if key in ignore or key not in saved or value in (None, "auto"):
            continue  # None / "auto": the run records what the default resolved to
        if saved[key] != value:
            diffs.append(f"{key}: {format_value(saved[key])} in the run, {format_value(value)} in the study")
    return diffs
