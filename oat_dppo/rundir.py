"""A run directory: what a run leaves behind to inspect, plot and resume.

    RUN_DIR/config.json        the resolved configuration
    RUN_DIR/metrics.jsonl      one line per iteration (NaN written as null)
    RUN_DIR/episodes.jsonl     sample episodes (prompts, responses, rewards)
    RUN_DIR/events/            TensorBoard events (with --log tensorboard)
    RUN_DIR/checkpoint/        the latest checkpoint (backends/local/checkpoint.py: safetensors + JSON)
    RUN_DIR/best/              with --keep-best: the policy of the best held-out evaluation (weights + best.json)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterable

# A checkpoint directory's files (written by oat_dppo/backends/local/checkpoint.py); the pickled
# state.pt is oat_dppo 0.1's format, still read (safely).
CHECKPOINT_STATE, CHECKPOINT_LEGACY = "state.json", "state.pt"


def checkpoint_exists(checkpoint_dir: Path) -> bool:
    """A checkpoint (or the one a crashed save left as `.prev`) is there to resume from."""
    return any((p / name).is_file() for p in (checkpoint_dir, checkpoint_dir.with_name(checkpoint_dir.name + ".prev"))
               for name in (CHECKPOINT_STATE, CHECKPOINT_LEGACY))


def checkpoint_iteration(checkpoint_dir: Path) -> int | None:
    """The last completed iteration of the checkpoint a resume would load (the directory, else the
    `.prev` copy a crashed save left), read from its JSON state without torch; None when there is
    none or it cannot be read that way (oat_dppo 0.1's pickled state.pt)."""
    for path in (checkpoint_dir, checkpoint_dir.with_name(checkpoint_dir.name + ".prev")):
        if (path / CHECKPOINT_STATE).is_file():
            try:
                return int(json.loads((path / CHECKPOINT_STATE).read_text())["iteration"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
        if (path / CHECKPOINT_LEGACY).is_file():
            return None
    return None


class RunDirError(RuntimeError):
    """The run directory cannot be used (unwritable, missing, or its checkpoint is unreadable)."""


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _umask() -> int:
    # Read where the OS shows it (Linux): os.umask() reads it only by setting it, and a thread creating
    # a file in between would get the value set meanwhile (here the most private one).
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode `open()` gives a new file under the current umask (0o644 under 0o022)."""
    return 0o666 & ~_umask()


def give_new_file_mode(*paths: str | os.PathLike) -> None:
    """Give files the mode `open()` would have given them: writers that go through a private
    temporary file (tempfile.mkstemp; safetensors' save_file since 0.8) leave them 0600."""
    mode = new_file_mode()
    for p in paths:
        os.chmod(p, mode)


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file renamed over it: a reader sees the old text or
    the new, never part of it. The file gets the mode `open()` gives (an existing file keeps its own)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            mode = new_file_mode()
        os.chmod(tmp, mode)  # mkstemp's file is 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_jsonl(path: Path, rows: Iterable[dict]) -> None:
    """Append one JSON line per row (NaN/inf written as null)."""
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(_clean(row)) + "\n")
        f.flush()


def metrics_by_iteration(path: Path) -> dict[int, dict]:
    """iteration -> its row of a metrics.jsonl (the last of an iteration logged twice, as a resumed run
    does; a line cut short by a kill skipped); {} where the file is missing."""
    rows: dict[int, dict] = {}
    if not Path(path).is_file():
        return rows
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            rows[int(row["iteration"])] = row
        except (ValueError, KeyError, TypeError):
            continue
    return rows


class RunDir:
    def __init__(self, path: str | os.PathLike, *, create: bool = True):
        self.path = Path(path).expanduser()
        if create:
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                probe = self.path / ".write_test"
                probe.write_text("ok")
                probe.unlink()
            except OSError as e:
                raise RunDirError(f"cannot write to run directory {self.path}: {e.strerror or e}") from e
        elif not self.path.is_dir():
            raise RunDirError(f"run directory {self.path} does not exist")

    # -- files -------------------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def episodes_path(self) -> Path:
        return self.path / "episodes.jsonl"

    @property
    def evaluations_path(self) -> Path:
        """One line per evaluation on a named split, by the run or by `python -m oat_dppo.evaluate`."""
        return self.path / "evaluations.jsonl"

    @property
    def checkpoint_path(self) -> Path:
        return self.path / "checkpoint"

    @property
    def best_path(self) -> Path:
        return self.path / "best"

    @property
    def events_path(self) -> Path:
        return self.path / "events"

    def discard(self) -> None:
        """Remove what a run writes here (config, metrics, episodes, events, checkpoints), then the
        directory itself if nothing else is left in it."""
        for path in (self.config_path, self.metrics_path, self.episodes_path, self.evaluations_path):
            path.unlink(missing_ok=True)
        for path in (self.events_path, self.checkpoint_path, self.checkpoint_path.with_name("checkpoint.prev"),
                     self.best_path):
            shutil.rmtree(path, ignore_errors=True)
        try:
            self.path.rmdir()
        except OSError:  # the user's own files are there: keep them
            pass

    def write_config(self, config: dict) -> None:
        atomic_write_text(self.config_path, json.dumps(_clean(config), indent=2, sort_keys=True) + "\n")

    def read_config(self) -> dict:
        try:
            return json.loads(self.config_path.read_text())
        except FileNotFoundError:
            raise RunDirError(f"{self.path} has no config.json: it is not a run directory") from None
        except json.JSONDecodeError as e:
            raise RunDirError(f"{self.config_path} is not valid JSON ({e})") from e

    def append_jsonl(self, path: Path, rows: Iterable[dict]) -> None:
        append_jsonl(path, rows)

    def log_metrics(self, row: dict) -> None:
        self.append_jsonl(self.metrics_path, [row])

    def record_evaluation(self, *, split: str, iteration: int, policy: str, metrics: dict) -> dict:
        """Append one evaluation: its split, the iteration whose policy played (-1: before any RL update),
        which policy ("last", "best", or an exported model's path) and its metrics (`reward_mean`, ...,
        unprefixed). Returns the row."""
        row = {"split": split, "iteration": iteration, "policy": policy, **metrics}
        self.append_jsonl(self.evaluations_path, [row])
        return row

    def evaluations(self, split: str | None = None) -> list[dict]:
        """The recorded evaluations (of one split), oldest first; [] where none."""
        if not self.evaluations_path.is_file():
            return []
        rows = []
        for line in self.evaluations_path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if split is None or row.get("split") == split:
                rows.append(row)
        return rows

    def truncate_jsonl(self, path: Path, keep) -> None:
        """Keep the lines of a JSONL file whose row `keep(row)` accepts (unreadable lines are dropped)."""
        if not path.exists():
            return
        kept = []
        for line in path.read_text().splitlines():
            try:
                if keep(json.loads(line)):
                    kept.append(line)
            except json.JSONDecodeError:
                continue
        atomic_write_text(path, "".join(k + "\n" for k in kept))

    def truncate_metrics(self, last_iteration: int) -> None:
        """Drop metric lines after `last_iteration` (written after the checkpoint a resume starts
        from), so the file reads as one uninterrupted run."""
        for path in (self.metrics_path, self.episodes_path):
            self.truncate_jsonl(path, lambda row: row.get("iteration", -1) <= last_iteration)
