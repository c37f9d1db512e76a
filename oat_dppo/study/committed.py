"""Committed results: a study's finished runs kept as `config.json` + `metrics.jsonl` under
`[study] results` (e.g. docs/results/<study>/<run name>/), small enough to commit.

A study too long for one sitting or one machine continues from them on any clone: a run whose
committed copy has every iteration counts as done (it is not run again), and the report reads each
run's metrics from whichever of its run directory and its committed copy holds more iterations.
Checkpoints are never committed, so a run cut short on one machine starts over on another.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from oat_dppo.plot.data import read_metrics
from oat_dppo.study.spec import RunSpec

COMMITTED_FILES = ("config.json", "metrics.jsonl")


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


def commit(run: RunSpec) -> bool:
    """Copy a finished run's config.json and metrics.jsonl to its committed directory, unless that
    already holds as many iterations. Returns whether it copied. Unfinished runs are not committed."""
    if run.results_dir is None:
        return False
    local = logged_iterations(run.run_dir)
    if not set(range(run.config.iterations)) <= local:
        return False
    if len(logged_iterations(run.results_dir)) >= len(local):
        return False
    run.results_dir.mkdir(parents=True, exist_ok=True)
    for name in COMMITTED_FILES:  # copyfile: the copy gets the umask's mode, not the source's
        tmp = run.results_dir / (name + ".tmp")
        shutil.copyfile(run.run_dir / name, tmp)
        tmp.replace(run.results_dir / name)
    return True
