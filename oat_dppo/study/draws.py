"""A study's draws: every GPU window's runs of its grid points, how many of them ended stuck at the
format-failure floor, and the comparison with its control study; the lines summary.md shows of them.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from oat_dppo.study import significance
from oat_dppo.study.run_results import REWARD, Stat, at_floor, format_failure_floor, load_runs, mean, num
from oat_dppo.study.spec import RunSpec, Study, load_study

# A GPU does not repeat a run from its seed, so a grid point run in two GPU windows is two draws, not
# one run twice. setup/land_gpu_window.py keeps each window's record beside the study's committed
# results (`WINDOW_RECORDS`: per iteration, the rollout reward and well-formed rate of every run the
# window ran, finished or stopped at its deadline); the report counts collapses over all of them.
# A study `X.toml` with a file `X_control.toml` beside it (the same regime, rollouts without the
# mismatch) is compared with it arm by arm.
WINDOW_RECORDS = "gpu_window_*.csv"
Z95 = 1.959964  # the normal quantile of a two-sided 95% interval


@dataclass
class Draw:
    """One run of one grid point in one window (or, for a study no window ran, in this checkout)."""

    window: str
    trust_region: str
    seed: int
    iterations: int  # logged
    planned: int  # the grid point's iterations
    collapsed: int  # iterations at the format-failure floor
    stuck_from: int | None  # the first of the floor iterations that last to its end, when there are >= final_window
    final: float  # mean reward over the last final_window logged iterations

    @property
    def finished(self) -> bool:
        return self.iterations >= self.planned


def make_draw(window: str, run: RunSpec, iterations: np.ndarray, reward: np.ndarray, final_window: int) -> Draw:
    """A draw's floor is judged from its reward alone, the environment's own verdict: the turns'
    well-formed flag calls an empty `\\boxed{}` well formed where GuessTheNumber scores it as a format
    failure (-0.1). (In an env whose wrong answers earn the floor, a batch of them counts here too; the
    GPU windows' studies play GuessTheNumber, where a well-formed guess earns at least 0.)"""
    floor = at_floor(reward, np.full_like(reward, np.nan), format_failure_floor(run))
    streak = len(floor) - int(np.flatnonzero(~floor)[-1]) - 1 if not floor.all() else len(floor)
    stuck = int(iterations[-streak]) if streak >= final_window else None
    return Draw(window, run.config.trust_region, run.seed, len(iterations), run.config.iterations, int(floor.sum()),
                stuck, mean(reward[-final_window:]))


def study_draws(study: Study, runs: Sequence[RunSpec]) -> tuple[list[Draw], bool]:
    """The study's draws from the window records beside its committed results (rows of its name;
    a grid point is told by its trust region and seed), or, where no window ran it, from its runs
    with metrics; and whether they came from window records."""
    by_point = {(r.config.trust_region, r.seed): r for r in runs}
    draws: list[Draw] = []
    if study.results is not None and len(by_point) == len(runs):
        for path in sorted(study.results.parent.glob(WINDOW_RECORDS)):
            rows: dict[tuple[str, int], list[dict]] = {}
            with open(path, newline="", encoding="utf-8") as f:
                for row in csv.DictReader(f):
                    if row["study"] == study.name and (row["trust_region"], int(row["seed"])) in by_point:
                        rows.setdefault((row["trust_region"], int(row["seed"])), []).append(row)
            for point, its in rows.items():
                its.sort(key=lambda r: int(r["iteration"]))
                iterations, reward = (np.array([float(r[k]) for r in its]) for k in ("iteration", "rollout_reward_mean"))
                draws.append(make_draw(path.stem.removeprefix("gpu_window_"), by_point[point], iterations, reward,
                                       study.final_window))
    if draws:
        return draws, True
    loaded = load_runs(runs)
    for run in runs:
        table = loaded[run.name].metrics if run.name in loaded else None
        if table is not None and len(table):
            draws.append(make_draw("-", run, table.iterations, table.column(REWARD), study.final_window))
    return draws, False


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n (NaN, NaN for n = 0)."""
    if n == 0:
        return math.nan, math.nan
    p, z2 = k / n, z * z
    center, half = (p + z2 / (2 * n)) / (1 + z2 / n), z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, center - half), min(1.0, center + half)


def _arm_cells(draws: Sequence[Draw]) -> list[str]:
    """Finished draws: stuck k/n [Wilson 95%], iterations at the floor, final reward; stopped ones apart."""
    done = [d for d in draws if d.finished]
    stopped = [d for d in draws if not d.finished]
    if not done and not stopped:
        return ["not run yet"] * 5
    k = sum(d.stuck_from is not None for d in done)
    lo, hi = wilson(k, len(done))
    early = ", ".join(f"{d.iterations}/{d.planned}" + (" (stuck)" if d.stuck_from is not None else "") for d in stopped)
    return [f"{k}/{len(done)}" if done else "-", f"{lo:.2f}-{hi:.2f}" if done else "-",
            cell_of([d.collapsed for d in done], "collapsed"), cell_of([d.final for d in done], "final"), early or "-"]


def cell_of(values: Sequence[float], metric: str) -> str:
    s = Stat.of(values)
    if s.n == 0:
        return "-"
    return num(s.mean, metric) if s.n == 1 else f"{num(s.mean, metric)} ± {num(s.std, metric)}"


def _stuck_p(a: Sequence[Draw], b: Sequence[Draw]) -> str:
    """Two-sided exact p of the stuck shares of two sets of finished draws (permutation test on the
    0/1 outcomes: Fisher's exact test, ordered by the difference of the shares)."""
    x = [float(d.stuck_from is not None) for d in a if d.finished]
    y = [float(d.stuck_from is not None) for d in b if d.finished]
    return f"{significance.permutation_p(x, y):.3f}" if x and y else "-"


def _rollouts(run: RunSpec) -> str:
    cfg = run.config
    dtype = cfg.engine_dtype if cfg.engine_dtype not in (None, "auto") else cfg.dtype
    return f"{cfg.engine} {dtype}"


def draws_markdown(study: Study, runs: Sequence[RunSpec]) -> list[str]:
    """Report lines: every window's draws (where window records exist) and the comparison of each arm
    with its control (where `<study>_control.toml` exists); [] when neither does."""
    draws, windowed = study_draws(study, runs)
    control_path = study.path.with_name(f"{study.path.stem}_control.toml")
    control = load_study(control_path) if control_path.is_file() else None
    if not windowed and control is None:
        return []
    arms = list(dict.fromkeys(r.config.trust_region for r in runs))
    lines: list[str] = []
    if windowed:
        lines += [
            "Every GPU window's runs (`" + WINDOW_RECORDS + "` beside the committed results; a seed does not "
            "repeat a run on a GPU, so a grid point run in two windows is two draws; the tables above hold one "
            "committed run per grid point). **Stuck at the floor from**: the first of the iterations at the "
            f"format-failure floor that last to the run's end, when there are at least {study.final_window}; "
            f"**final reward**: the mean of its last {study.final_window} logged iterations.",
            "",
            "| window | trust region | seed | iterations | stuck at the floor from | iterations at the floor | "
            "final reward |",
            "|---|---|---|---|---|---|---|",
        ]
        for d in sorted(draws, key=lambda d: (arms.index(d.trust_region), d.seed, d.window)):
            its = str(d.iterations) if d.finished else f"{d.iterations} of {d.planned} (stopped)"
            lines.append(f"| {d.window} | {d.trust_region} | {d.seed} | {its} | "
                         f"{'-' if d.stuck_from is None else d.stuck_from} | {d.collapsed} | {d.final:.2f} |")
        lines.append("")
    control_draws = study_draws(control, control.runs)[0] if control is not None else []
    control_label = _rollouts(control.runs[0]) + " (control)" if control is not None else ""
    lines += [
        "Collapses per arm" + (f", beside the control (`{control_path.name}`)" if control is not None else "") +
        ": over the finished draws, how many ended stuck at the floor (k/n, with the Wilson 95% interval), "
        "their iterations at the floor and final reward (mean ± std); draws stopped early apart (iterations "
        "logged of those planned).",
        "",
        "| trust region | rollouts | stuck at the floor | 95% interval | iterations at the floor | final reward | "
        "stopped early |",
        "|---|---|---|---|---|---|---|",
    ]
    by_arm = {a: [d for d in draws if d.trust_region == a] for a in arms}
    control_by_arm = {a: [d for d in control_draws if d.trust_region == a] for a in arms}
    for arm in arms:
        lines.append(f"| {arm} | {_rollouts(runs[0])} | " + " | ".join(_arm_cells(by_arm[arm])) + " |")
        if control is not None:
            lines.append(f"| {arm} | {control_label} | " + " | ".join(_arm_cells(control_by_arm[arm])) + " |")
    lines.append("")
    tests = [f"{a} vs {b}: p = {_stuck_p(by_arm[a], by_arm[b])}" for i, a in enumerate(arms) for b in arms[i + 1:]]
    if control is not None:
        tests += [f"{a} vs its control: " + ("not run yet" if not control_by_arm[a] else
                                             f"p = {_stuck_p(by_arm[a], control_by_arm[a])}") for a in arms]
    if tests:
        lines += ["Stuck or not, two-sided exact p over the finished draws (a permutation test on the 0/1 "
                  "outcomes, Fisher's exact test ordered by the difference of the shares; one p per comparison, "
                  "no correction): " + "; ".join(tests) + ".", ""]
    return lines
