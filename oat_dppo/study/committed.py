"""Committed results: a study's finished runs kept as `config.json` + `metrics.jsonl` (and a warm start's
`warm_start.jsonl`) under
`[study] results` (e.g. docs/results/<study>/<run name>/), small enough to commit, with
`responses.jsonl`: the run's logged sample episodes (episodes.jsonl) without their prompts, a few KB
where the prompts take ~100 KB, so that what the policy learned to say can be read on any clone.

A study too long for one sitting or one machine continues from them on any clone: a run whose
committed copy has every iteration counts as done (it is not run again), and the report reads each
run's metrics from whichever of its run directory and its committed copy holds more iterations.
Checkpoints are never committed, so a run cut short on one machine starts over on another.
"""

from __future__ import annotations

import filecmp
import json
import shutil
from pathlib import Path

from oat_dppo.plot.data import read_metrics
from oat_dppo.study.spec import RunSpec

COMMITTED_FILES = ("config.json", "metrics.jsonl")
WARM_START = "warm_start.jsonl"  # a warm-started run's supervised steps, one short line each: committed too
EPISODES = "episodes.jsonl"
RESPONSES = "responses.jsonl"  # EPISODES without the prompts


def _quiet(_msg: str) -> None:
    pass


def logged_iterations(run_dir: Path | None) -> set[int]:
    """The distinct iterations in a directory's metrics.jsonl (empty when it has none)."""
    if run_dir is None or not (run_dir / "metrics.jsonl").is_file():
        return set()
    return {int(i) for i in read_metrics(run_dir / "metrics.jsonl", warn=_quiet).iterations}


def metrics_dir(run: RunSpec) -> Path:
    """The directory to read a run's metrics from: its run directory, or its committed copy where
    that holds more iterations (a clone that has not run it, or a local run started over)."""
    if run.results_dir is not None and len(logged_iterations(run.results_dir)) > len(logged_iterations(run.run_dir)):
        return run.results_dir
    return run.run_dir


def read_episodes(path: Path) -> list[dict]:
    """The episodes of an episodes.jsonl (or responses.jsonl) without the turns' prompts, in
    iteration order. An iteration logged twice (run again after a resume) keeps its last logging; a
    line cut by a kill is skipped."""
    by_iteration: dict[int, list[dict]] = {}
    previous = None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            episode = json.loads(line)
            iteration = int(episode["iteration"])
        except (ValueError, KeyError, TypeError):
            continue
        for turn in episode.get("turns", []):
            turn.pop("prompt", None)
        if iteration != previous:
            by_iteration[iteration] = []  # a new logging of this iteration replaces an older one
            previous = iteration
        by_iteration[iteration].append(episode)
    return [e for i in sorted(by_iteration) for e in by_iteration[i]]


def compact_episodes(episodes: Path, responses: Path) -> None:
    """Write `episodes` (episodes.jsonl) to `responses` as `read_episodes` reads it."""
    tmp = responses.with_name(responses.name + ".tmp")
    tmp.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in read_episodes(episodes)),
                   encoding="utf-8")
    tmp.replace(responses)


def episodes_file(run_dir: Path) -> Path | None:
    """A directory's responses.jsonl (a committed copy), else its episodes.jsonl (a run), else None."""
    for name in (RESPONSES, EPISODES):
        if (run_dir / name).is_file():
            return run_dir / name
    return None


def commit(run: RunSpec) -> bool:
    """Copy a finished run's config.json and metrics.jsonl to its committed directory, unless that
    already holds as many iterations, and its episodes as `responses.jsonl` (also into a committed
    copy made before responses were kept). Returns whether it wrote anything. Unfinished runs are
    not committed."""
    if run.results_dir is None:
        return False
    local = logged_iterations(run.run_dir)
    if not set(range(run.config.iterations)) <= local:
        return False
    wrote = False
    if len(logged_iterations(run.results_dir)) < len(local):
        run.results_dir.mkdir(parents=True, exist_ok=True)
        present = [n for n in (WARM_START,) if (run.run_dir / n).is_file()]
        for name in (*COMMITTED_FILES, *present):  # copyfile: the copy gets the umask's mode, not the source's
            tmp = run.results_dir / (name + ".tmp")
            shutil.copyfile(run.run_dir / name, tmp)
            tmp.replace(run.results_dir / name)
        wrote = True
    # A committed copy without responses gets them only from the run it was copied from.
    backfill = not (run.results_dir / RESPONSES).is_file() and filecmp.cmp(
        run.run_dir / "metrics.jsonl", run.results_dir / "metrics.jsonl", shallow=False)
    if (run.run_dir / EPISODES).is_file() and (wrote or backfill):
        compact_episodes(run.run_dir / EPISODES, run.results_dir / RESPONSES)
        wrote = True
    return wrote
