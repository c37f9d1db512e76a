"""Run directories -> metric tables -> seed-aggregated curves. numpy only (no matplotlib, no torch).

A run directory holds `config.json` (the flat resolved config) and `metrics.jsonl` (one JSON object
per training iteration with `iteration`, `wall_time` and namespaced floats such as
`rollout/reward_mean`). Reading is forgiving, because runs are plotted while they train and after
they were killed or resumed:

* a repeated `iteration` (a resumed run re-logs the iterations after its checkpoint): the last line
  in the file wins, whole (its keys replace the earlier line's, they are not merged);
* an unparseable line (typically the last one, cut by a killed process), a line that is not an
  object or has no integer `iteration`: skipped with a warning;
* `null` (NaN is written as null), a missing key, or a non-numeric value: NaN.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Literal, Sequence

import numpy as np

Warn = Callable[[str], None]
XAxis = Literal["iteration", "wall_time"]
BandKind = Literal["std", "minmax"]

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"

# Config keys that do not change what is trained: runs of one group that differ only in these are
# replicates and are averaged (the rest of the config must match, else the group is split).
IGNORED_CONFIG_KEYS = frozenset(
    {
        "seed",
        "run_name",
        "run_dir",
        "resume",
        "iterations",
        "device",
        "threads",
        "progress",
        "log",
        "wandb_project",
        "save_every",
        "log_episodes",
        "eval_every",
        "eval_episodes",
    }
)


def warn_stderr(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr)


# ---- one run ------------------------------------------------------------------------------------


@dataclass
class MetricTable:
    """One run's metrics, one row per iteration (sorted, unique).

    columns[key][i] is the value of `key` at iterations[i] (NaN where null, absent or not a number).
    `iteration` itself is not a column; `wall_time` is.
    """

    iterations: np.ndarray  # int64 [N]
    columns: dict[str, np.ndarray] = field(default_factory=dict)  # float64 [N] each

    def __len__(self) -> int:
        return len(self.iterations)

    def column(self, key: str) -> np.ndarray:
        """The column, or all-NaN when the run never logged `key`."""
        col = self.columns.get(key)
        return np.full(len(self.iterations), np.nan) if col is None else col

    def has(self, key: str) -> bool:
        """True when `key` has at least one finite value."""
        col = self.columns.get(key)
        return col is not None and bool(np.isfinite(col).any())

    def keys(self) -> list[str]:
        """Keys with at least one finite value, sorted."""
        return sorted(k for k in self.columns if self.has(k))


def _number(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    return float(v)


def _glued_record(text: str) -> dict | None:
    """The complete JSON object that ends `text` after a cut-off prefix, if there is one."""
    decoder = json.JSONDecoder()
    start = text.find("{", 1)
    while start > 0:
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            pass
        else:
            if end == len(text) and isinstance(obj, dict) and "iteration" in obj:
                return obj
        start = text.find("{", start + 1)
    return None


# Metrics renamed since older runs were committed: old name -> the name they are read under.
RENAMED_METRICS = {
    # it measures agreement with the hint's direction (a blind ascending sweep reaches 1.0), not feedback use
    "rollout/feedback_follow_rate": "rollout/hint_direction_agreement",
    "eval/feedback_follow_rate": "eval/hint_direction_agreement",
}


def parse_metrics(lines: Iterable[str], source: str = METRICS_FILE, warn: Warn | None = None) -> MetricTable:
    """Parse metrics.jsonl lines (see the module docstring for what is forgiven)."""
    warn = warn or warn_stderr
    rows: dict[int, dict] = {}  # iteration -> the last line logged for it
    lines = list(lines)
    last = max((i for i, line in enumerate(lines, 1) if line.strip()), default=0)
    for lineno, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            obj = _glued_record(text)
            if obj is not None:  # a cut-off line, then the resumed run appended to it without a newline
                warn(f"{source}: line {lineno}: dropped a cut-off record glued in front of the next one")
            else:
                where = "last line, probably cut by a killed process" if lineno == last else f"line {lineno}"
                warn(f"{source}: skipped unparseable {where} ({e.msg}): {text[:60]!r}")
                continue
        if not isinstance(obj, dict):
            warn(f"{source}: skipped line {lineno}: not a JSON object")
            continue
        it = obj.get("iteration")
        if isinstance(it, bool) or not isinstance(it, (int, float)) or not math.isfinite(it) or it != int(it):
            warn(f"{source}: skipped line {lineno}: no integer 'iteration' (got {it!r})")
            continue
        # a later line for the same iteration replaces it; metrics renamed since read under their new names
        rows[int(it)] = {RENAMED_METRICS.get(k, k): v for k, v in obj.items()}
    iterations = np.array(sorted(rows), dtype=np.int64)
    keys: set[str] = set()
    for obj in rows.values():
        keys.update(obj)
    keys.discard("iteration")
    columns = {
        k: np.array([_number(rows[int(i)].get(k)) for i in iterations], dtype=np.float64) for k in sorted(keys)
    }
    return MetricTable(iterations, columns)


def read_metrics(path: str | os.PathLike, warn: Warn | None = None) -> MetricTable:
    """Read a metrics.jsonl file (or the one in a run directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_metrics(f.read().splitlines(), source=str(path), warn=warn)


@dataclass
class Run:
    path: Path
    config: dict
    metrics: MetricTable

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def seed(self) -> object:
        return self.config.get("seed")


def read_config(run_dir: Path, warn: Warn | None = None) -> dict:
    warn = warn or warn_stderr
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        warn(f"{run_dir}: no {CONFIG_FILE}; the run is labelled by its directory name")
        return {}
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        warn(f"{path}: unreadable ({e}); the run is labelled by its directory name")
        return {}
    if not isinstance(cfg, dict):
        warn(f"{path}: not a JSON object; the run is labelled by its directory name")
        return {}
    return cfg


def load_run(run_dir: str | os.PathLike, warn: Warn | None = None) -> Run:
    run_dir = Path(run_dir)
    return Run(run_dir, read_config(run_dir, warn), read_metrics(run_dir / METRICS_FILE, warn))


# ---- finding run directories --------------------------------------------------------------------


def is_run_dir(path: Path) -> bool:
    return (path / METRICS_FILE).is_file()


def find_run_dirs(path: str | os.PathLike) -> list[Path]:
    """`path` itself when it is a run directory, else every run directory below it (sorted).

    A run directory is one with a metrics.jsonl; the search does not descend into run directories
    (their checkpoints are not runs) nor into hidden directories.
    """
    path = Path(path)
    if path.is_file() and path.name == METRICS_FILE:
        return [path.parent]
    if not path.is_dir():
        return []
    if is_run_dir(path):
        return [path]
    found: list[Path] = []
    for root, dirs, _files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        here = Path(root)
        if here != path and is_run_dir(here):
            found.append(here)
            dirs[:] = []
    return sorted(found)


# ---- grouping -----------------------------------------------------------------------------------


def _fmt(v: object) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def group_label(run: Run, key: str) -> str:
    """The legend label of a run's group: the config value of `key` (strings bare, others key=value).

    `run_name` falls back to the directory name; any other missing key gives `key=?`.
    """
    v = run.config.get(key)
    if key == "run_name" and not v:
        return run.name
    if key not in run.config:
        return f"{key}=?"
    return v if isinstance(v, str) else f"{key}={_fmt(v)}"


@dataclass
class Series:
    """Runs drawn as one curve: one run, or replicates (seeds) averaged with a band."""

    label: str
    runs: list[Run]

    @property
    def seeds_note(self) -> str:
        seeds = [r.seed for r in self.runs]
        if len(self.runs) == 1:
            return "" if seeds[0] is None else f"seed {_fmt(seeds[0])}"
        if all(s is not None for s in seeds):
            return f"{len(self.runs)} seeds"
        return f"{len(self.runs)} runs"

    @property
    def legend(self) -> str:
        note = self.seeds_note
        return f"{self.label} ({note})" if note else self.label


def is_provenance(key: str) -> bool:
    """config.json keys that start with "_" record what ran the run (code, machine), not an option:
    seeds run at other commits or on other machines are still seeds of one group."""
    return key.startswith("_")


def group_runs(
    runs: Sequence[Run], by: str = "trust_region", ignore: Iterable[str] = IGNORED_CONFIG_KEYS, warn: Warn | None = None
) -> list[Series]:
    """Group runs by the config key `by`; within a group, runs whose configs match apart from the
    `ignore` keys (seed, run dir, ...) and the provenance keys are one Series. A group whose runs
    differ in other keys is split, each part labelled with the keys that tell them apart. `ignore`
    containing "*" never splits.
    """
    warn = warn or warn_stderr
    ignore = set(ignore)
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(group_label(run, by), []).append(run)
    if by != "run_name" and runs and all(by not in r.config for r in runs):
        keys = sorted({k for r in runs for k in r.config})
        warn(f"--group-by {by}: no run has this config key; config keys: {', '.join(keys) or '(none)'}")
    out: list[Series] = []
    for label, members in groups.items():
        if "*" in ignore or len(members) == 1:
            out.append(Series(label, list(members)))
            continue

        def signature(r: Run) -> str:
            return json.dumps({k: v for k, v in r.config.items() if k not in ignore and not is_provenance(k)},
                              sort_keys=True, default=str)

        parts: dict[str, list[Run]] = {}
        for r in members:
            parts.setdefault(signature(r), []).append(r)
        if len(parts) == 1:
            out.append(Series(label, list(members)))
            continue
        all_keys = {k for r in members for k in r.config if not is_provenance(k)} - ignore
        differing = sorted(k for k in all_keys if len({_fmt(r.config.get(k)) for r in members}) > 1)
        warn(
            f"group {label!r}: runs differ in {', '.join(differing)} (not only the seed): drawn as {len(parts)} "
            "curves; add the keys to --ignore-keys to average them anyway"
        )
        for part in parts.values():
            cfg = part[0].config
            suffix = ", ".join(f"{k}={_fmt(cfg.get(k, '?'))}" for k in differing)
            out.append(Series(f"{label} [{suffix}]", part))
    out.sort(key=lambda s: s.label)
    return _without_shared_fields(out)


def _without_shared_fields(series: list[Series], sep: str = "__") -> list[Series]:
    """Labels without the `sep`-joined fields every label starts or ends with (a study's run names
    share the model, env and seed fields): what tells the curves apart is what is left."""
    fields = [s.label.split(sep) for s in series]
    shortest = min((len(f) for f in fields), default=0)
    if len(series) < 2 or shortest < 2:
        return series
    head = 0  # at least one field of the shortest label stays
    while head < shortest - 1 and len({f[head] for f in fields}) == 1:
        head += 1
    tail = 0
    while tail < shortest - head - 1 and len({f[-1 - tail] for f in fields}) == 1:
        tail += 1
    for s, f in zip(series, fields):
        s.label = sep.join(f[head:len(f) - tail])
    return series


# ---- curves -------------------------------------------------------------------------------------


def trailing_mean(y: np.ndarray, n: int) -> np.ndarray:
    """Moving average over the last `n` points (fewer at the start). y must be finite."""
    y = np.asarray(y, dtype=np.float64)
    if n <= 1 or len(y) == 0:
        return y.copy()
    c = np.concatenate([[0.0], np.cumsum(y)])
    idx = np.arange(1, len(y) + 1)
    lo = np.maximum(idx - n, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def run_points(
    table: MetricTable, metric: str, x: XAxis = "iteration", smooth: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(iterations, x values, y values) of one run's finite points of `metric`, smoothed.

    Smoothing is over the run's own logged points (so a metric logged every 5 iterations, such as
    eval/*, is averaged over its last `smooth` evaluations, not over gaps).
    """
    y = table.column(metric)
    xs = table.column("wall_time") if x == "wall_time" else table.iterations.astype(np.float64)
    ok = np.isfinite(y) & np.isfinite(xs)
    return table.iterations[ok], xs[ok], trailing_mean(y[ok], smooth)


@dataclass
class Curve:
    """A metric across runs, per iteration (only iterations where at least one run has a value).

    x: the iteration, or the mean wall_time of the runs at that iteration. mean: mean over the runs
    with a value there; lo/hi: the band (mean -/+ population std, or min/max); n: how many runs.
    """

    iterations: np.ndarray
    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    n: np.ndarray

    def __len__(self) -> int:
        return len(self.iterations)


def aggregate(
    tables: Sequence[MetricTable],
    metric: str,
    x: XAxis = "iteration",
    band: BandKind = "std",
    smooth: int = 1,
) -> Curve:
    """Mean and band of `metric` over runs (seeds), aligned by iteration.

    Each run is smoothed first (trailing mean over its last `smooth` points), then at each
    iteration the runs that have a finite value are averaged; runs missing there (shorter, or a
    null) are left out of that iteration's mean and band, never counted as 0.
    """
    if band not in ("std", "minmax"):
        raise ValueError(f"band must be 'std' or 'minmax', got {band!r}")
    pts = [run_points(t, metric, x, smooth) for t in tables]
    its = np.unique(np.concatenate([p[0] for p in pts])) if pts else np.array([], dtype=np.int64)
    if len(its) == 0:
        e = np.array([], dtype=np.float64)
        return Curve(its.astype(np.int64), e, e, e, e, np.array([], dtype=np.int64))
    Y = np.full((len(pts), len(its)), np.nan)
    X = np.full((len(pts), len(its)), np.nan)
    for r, (it, xs, ys) in enumerate(pts):
        cols = np.searchsorted(its, it)
        Y[r, cols] = ys
        X[r, cols] = xs
    n = np.isfinite(Y).sum(axis=0)
    mean = np.nanmean(Y, axis=0)
    if band == "std":
        sd = np.nanstd(Y, axis=0)
        lo, hi = mean - sd, mean + sd
    else:
        lo, hi = np.nanmin(Y, axis=0), np.nanmax(Y, axis=0)
    xs = its.astype(np.float64) if x == "iteration" else np.nanmean(X, axis=0)
    return Curve(its, xs, mean, lo, hi, n)


def available_metrics(runs: Sequence[Run]) -> list[str]:
    return sorted({k for r in runs for k in r.metrics.keys()} - {"wall_time"})
