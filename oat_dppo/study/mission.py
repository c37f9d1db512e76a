"""The mission table's study: every cell's arms over seeds, each scored once on the test split.

    python -m oat_dppo.study.mission experiments/mission_table.toml             # run / go on where it stopped
    python -m oat_dppo.study.mission experiments/mission_table.toml --dry-run   # what is done, what is left
    python -m oat_dppo.study.mission experiments/mission_table.toml --report    # the table and figure from the CSV

A cell is an environment, a model and a backend. Its arms (`ARMS`), for each seed:

* `blind`: the best scripted player that ignores the env's replies (`demo:NAME`);
* `demonstrator`: the scripted player the warm start imitates;
* `warm_start`: the model after the warm start's stages alone (each stage a run from the previous one's
  exported policy, the last one scored on test);
* `rl`: the recipe's RL from that warm start's export;
* `control`: the same RL from the same export with the advantages shuffled within each batch.

Each arm's test evaluation is one row of the CSV (`COLUMNS`), appended as soon as it exists; a row present
means that arm and seed are done, so a stopped study (or a fresh clone with the committed CSV) goes on where
it stopped. Each finished run's records (config.json, metrics.jsonl, evaluations.jsonl, warm_start.jsonl)
are copied under `records`; the run directories (checkpoints, exported models) stay under `out`, uncommitted.

The file:

    [table]
    out = "runs/mission_table"                # run directories
    csv = "docs/results/mission_table.csv"
    records = "docs/results/mission_table"
    test_episodes = 256
    jobs = 2                                  # runs at once (give each --threads 1)
    oat_python = ".venv-oat/bin/python"       # runs the Oat cells (Oat's stack: make setup-oat)

    [[cell]]
    name = "gtn_smollm2"
    env = "game:GuessTheNumber-v0-easy"
    env_label = "..."                         # optional: the table's env column, where two cells share an env id
    model = "smollm2"
    backend = "local"
    seeds = [0, 1, 2]
    blind = "demo:blind_sweep"
    demonstrator = "demo:noisy_bisect"
    common = { ... }                          # options of python -m oat_dppo.main for every run of the cell
    warm_start = [{ ... }, { ... }]           # its stages' options
    rl = { ... }                              # the RL's options; keep_best = true scores the best validation policy

    [[cell]]                                  # the same RL on Oat's program ([table] oat_python runs it)
    name = "gtn_smollm2_oat"
    backend = "oat"
    warm_from = "gtn_smollm2"                 # from that local cell's warm start, seed by seed (its rows are ours)
    oat_args = ["--gpus", "2", ...]           # Oat's own flags
    ...                                       # env, model, seeds, common, rl as above (no keep_best on Oat)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (the Oat profile)
    import tomli as tomllib

from oat_dppo.study.spec import FIELDS, option_args

ARMS = ("blind", "demonstrator", "warm_start", "rl", "control")
COLUMNS = ("env", "model", "backend", "arm", "seed", "split", "episodes", "mean", "solved", "std")
RECORDED_FILES = ("config.json", "metrics.jsonl", "evaluations.jsonl", "warm_start.jsonl")
CELL_KEYS = {"name", "env", "env_label", "model", "backend", "seeds", "blind", "demonstrator", "common", "warm_start",
             "rl", "solved", "test_episodes", "warm_from", "oat_args"}
TABLE_KEYS = {"out", "csv", "records", "test_episodes", "jobs", "oat_python"}
BACKENDS = ("local", "oat")


class MissionError(ValueError):
    """A bad mission file: one line each, all of them."""


@dataclass
class Cell:
    name: str
    env: str
    model: str
    backend: str
    seeds: list[int]
    blind: str | None
    demonstrator: str | None
    common: dict[str, Any]
    warm_start: list[dict[str, Any]]
    rl: dict[str, Any]
    solved: bool = True  # the game has a notion of solving (success); False leaves the column empty
    test_episodes: int = 256  # [table] test_episodes unless the cell sets its own (a Sudoku board costs ~20 s)
    env_label: str = ""  # the table's env column: the env id, or what tells two cells of one env id apart
    warm_from: str | None = None  # an Oat cell's RL starts from this local cell's warm start (its export, per seed)
    oat_args: tuple[str, ...] = ()  # Oat's own flags for an Oat cell's runs (--gpus 2 --zero-stage 2 ...)

    def __post_init__(self) -> None:
        self.env_label = self.env_label or self.env


@dataclass
class Mission:
    path: Path
    out: Path
    csv: Path
    records: Path
    test_episodes: int
    jobs: int
    cells: list[Cell] = field(default_factory=list)
    oat_python: str = ".venv-oat/bin/python"  # runs an Oat cell (Oat's stack: Python 3.10, `make setup-oat`)


def is_mission_file(path: str | Path) -> bool:
    """A mission file (`[table]` and `[[cell]]`), not a study file (`[study]`, `[base]`, `[grid]`)."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return "cell" in data and "study" not in data


def _options(where: str, options: Any, errors: list[str]) -> dict[str, Any]:
    if not isinstance(options, dict):
        errors.append(f"{where}: a table of python -m oat_dppo.main options, got {options!r}")
        return {}
    for key in options:
        if key not in FIELDS:
            errors.append(f"{where}: {key!r} is not an option of python -m oat_dppo.main")
    return {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}


def load(path: str | Path) -> Mission:
    """The mission file, checked: every problem at once in a `MissionError`."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise MissionError(f"{path}: {e}") from None
    errors: list[str] = []
    table = data.get("table", {})
    errors += [f"{path}: [table] {k!r}: unknown (one of {sorted(TABLE_KEYS)})" for k in table if k not in TABLE_KEYS]
    mission = Mission(path, Path(table.get("out", "runs/mission_table")),
                      Path(table.get("csv", "docs/results/mission_table.csv")),
                      Path(table.get("records", "docs/results/mission_table")),
                      int(table.get("test_episodes", 256)), int(table.get("jobs", 1)),
                      oat_python=str(table.get("oat_python", ".venv-oat/bin/python")))
    for i, raw in enumerate(data.get("cell", [])):
        where = f"{path}: [[cell]] {raw.get('name', i)}"
        errors += [f"{where}: {k!r}: unknown (one of {sorted(CELL_KEYS)})" for k in raw if k not in CELL_KEYS]
        oat = raw.get("backend", "local") == "oat"
        missing = [k for k in ("name", "env", "model", "seeds", "rl", "warm_from" if oat else "warm_start")
                   if k not in raw]
        if missing:
            errors.append(f"{where}: needs {', '.join(missing)}")
            continue
        for arm in ("blind", "demonstrator"):
            if raw.get(arm) is not None and not str(raw[arm]).startswith("demo:"):
                errors.append(f"{where}: {arm} must be a scripted player demo:NAME, got {raw[arm]!r}")
        mission.cells.append(Cell(
            name=raw["name"], env=raw["env"], model=raw["model"], backend=raw.get("backend", "local"),
            seeds=[int(s) for s in raw["seeds"]], blind=raw.get("blind"), demonstrator=raw.get("demonstrator"),
            common=_options(f"{where} common", raw.get("common", {}), errors),
            warm_start=[_options(f"{where} warm_start[{j}]", s, errors)
                        for j, s in enumerate(raw.get("warm_start", []))],
            rl=_options(f"{where} rl", raw["rl"], errors), solved=bool(raw.get("solved", True)),
            test_episodes=int(raw.get("test_episodes", mission.test_episodes)), env_label=raw.get("env_label", ""),
            warm_from=raw.get("warm_from"), oat_args=tuple(str(a) for a in raw.get("oat_args", ()))))
    errors += _backend_errors(path, mission.cells)
    columns: dict[tuple, str] = {}
    for cell in mission.cells:  # a row is keyed by its env column: two cells writing one would share their rows
        other = columns.setdefault((cell.env_label, cell.model, cell.backend), cell.name)
        if other != cell.name:
            errors.append(f"{path}: cells {other} and {cell.name} would write the same rows ({cell.env_label}, "
                          f"{cell.model}, {cell.backend}): give one an env_label")
    if errors:
        raise MissionError("\n".join(errors))
    return mission


def _backend_errors(path: Path, cells: list[Cell]) -> list[str]:
    """An Oat cell runs RL only, from a local cell's warm start of the same env and model (Oat cannot warm-start,
    resume or keep the best policy: oat_dppo.backends.oat.args.LOCAL_ONLY); its blind, demonstrator and warm start
    rows are that cell's."""
    errors, local = [], {c.name: c for c in cells if c.backend == "local"}
    for cell in cells:
        where = f"{path}: [[cell]] {cell.name}"
        if cell.backend not in BACKENDS:
            errors.append(f"{where}: backend {cell.backend!r} (one of {', '.join(BACKENDS)})")
        elif cell.backend == "local":
            if cell.warm_from is not None or cell.oat_args:
                errors.append(f"{where}: warm_from and oat_args are for backend 'oat' cells")
            if not cell.warm_start:
                errors.append(f"{where}: needs its warm_start stages")
        else:
            source = local.get(cell.warm_from or "")
            if source is None:
                errors.append(f"{where}: warm_from {cell.warm_from!r} names no local cell of this file")
            elif (source.env, source.model) != (cell.env, cell.model) or set(cell.seeds) - set(source.seeds):
                errors.append(f"{where}: warm_from {source.name} has another env, model or seeds")
            for arm in ("blind", "demonstrator", "warm_start"):
                if getattr(cell, arm):
                    errors.append(f"{where}: an Oat cell has no {arm} of its own (its warm_from cell's rows are its)")
            if cell.rl.get("keep_best"):
                errors.append(f"{where}: keep_best is local-backend only (Oat scores its last policy)")
    return errors


# ---- the CSV: one row an arm and seed -----------------------------------------------------------------

def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def row_key(row: dict) -> tuple:
    return (row["env"], row["model"], row["backend"], row["arm"], str(row["seed"]), row["split"])


_CSV_LOCK = threading.Lock()
_SAY_LOCK = threading.Lock()


def append_row(path: Path, row: dict) -> None:
    with _CSV_LOCK:
        new = not path.is_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            if new:
                writer.writeheader()
            writer.writerow({k: row.get(k, "") for k in COLUMNS})


def csv_number(value: float) -> str:
    """A number as the CSV holds it: 6 decimals."""
    return f"{value:.6f}"


def same_recorded_mean(recorded: dict, evaluation: dict) -> bool:
    """Whether a test evaluation's mean is a CSV row's, compared as the CSV writes it: a warm start made again that
    scores 0.11328125 is the recorded 0.113281."""
    return recorded["mean"] == csv_number(evaluation["reward_mean"])


def table_row(cell: Cell, arm: str, seed: int, evaluation: dict) -> dict:
    """A CSV row from a test evaluation (`RunDir.record_evaluation`'s row)."""
    return {"env": cell.env_label, "model": cell.model, "backend": cell.backend, "arm": arm, "seed": seed,
            "split": evaluation["split"], "episodes": int(evaluation["episodes"]),
            "mean": csv_number(evaluation["reward_mean"]),
            "solved": csv_number(evaluation["success_rate"]) if cell.solved else "",
            "std": csv_number(evaluation.get("reward_std", float("nan")))}


# ---- the work: runs and evaluations -------------------------------------------------------------------

@dataclass
class Work:
    """What one (cell, arm, seed) needs done: `steps` in order, then its row."""
    cell: Cell
    arm: str
    seed: int
    after: tuple[str, ...] = ()  # keys of the work that must finish first

    @property
    def key(self) -> str:
        return f"{self.cell.name}/{self.arm}/s{self.seed}"


class Runner:
    def __init__(self, mission: Mission, *, python: str = sys.executable, out=sys.stdout,
                 arms: tuple[str, ...] = ARMS, cells: tuple[str, ...] | None = None,
                 seeds: tuple[int, ...] | None = None):
        self.mission, self.python, self.out, self.arms, self.seeds = mission, python, out, arms, seeds
        self.by_name = {c.name: c for c in mission.cells}  # an Oat cell's warm_from source, chosen or not
        if cells is not None:
            unknown = set(cells) - {c.name for c in mission.cells}
            if unknown:
                raise MissionError(f"no cell {', '.join(sorted(unknown))} in {mission.path}")
            mission.cells = [c for c in mission.cells if c.name in cells]
        unknown_seeds = set(seeds or ()) - {s for c in mission.cells for s in c.seeds}
        if unknown_seeds:
            raise MissionError(f"no chosen cell has seed {', '.join(map(str, sorted(unknown_seeds)))}")
        self.rows = {row_key(r): r for r in read_rows(mission.csv)}
        self.done = set(self.rows)

    def say(self, text: str) -> None:
        with _SAY_LOCK:  # runs finish on their own threads: print writes the text and its newline apart
            print(f"[{time.strftime('%H:%M:%S')}] {text}", file=self.out, flush=True)

    # -- plan --------------------------------------------------------------------------------------
    def _key(self, cell: Cell, arm: str, seed: int) -> tuple:
        return (cell.env_label, cell.model, cell.backend, arm, str(seed), "test")

    def plan(self) -> list[Work]:
        """Every arm and seed not in the CSV yet, scripted arms first (minutes), then the warm starts, then RL
        (of the chosen arms and seeds; RL brings its warm start along where that is not made yet)."""
        everything = [w for w in self._plan() if self.seeds is None or w.seed in self.seeds]
        needed = {a for w in everything if w.arm in self.arms for a in w.after}
        return [w for w in everything if w.arm in self.arms or w.key in needed]

    def _plan(self) -> list[Work]:
        work = []
        for cell in self.mission.cells:
            for seed in cell.seeds:
                for arm in ("blind", "demonstrator"):
                    if getattr(cell, arm) and self._key(cell, arm, seed) not in self.done:
                        work.append(Work(cell, arm, seed))
        warm_keys: set[str] = set()
        for cell in self.mission.cells:
            source = self._source(cell)
            for seed in cell.seeds:
                rl_left = [a for a in ("rl", "control") if self._key(cell, a, seed) not in self.done]
                warm = Work(source, "warm_start", seed)
                row_left = cell is source and self._key(cell, "warm_start", seed) not in self.done
                export_left = rl_left and not self._export(source, seed).joinpath("config.json").is_file()
                if (row_left or export_left) and warm.key not in warm_keys:
                    work.append(warm)  # (again where a later session lacks its exported policy)
                    warm_keys.add(warm.key)
                work += [Work(cell, a, seed, after=(warm.key,) if warm.key in warm_keys else ()) for a in rl_left]
        return work

    def _source(self, cell: Cell) -> Cell:
        """The cell whose warm start `cell`'s RL starts from: itself, or an Oat cell's `warm_from`."""
        return self.by_name[cell.warm_from] if cell.warm_from else cell

    # -- paths and commands ------------------------------------------------------------------------
    def _dir(self, cell: Cell, seed: int, name: str) -> Path:
        return self.mission.out / cell.name / f"s{seed}" / name

    def _export(self, cell: Cell, seed: int, stage: int | None = None) -> Path:
        """The exported policy of a warm start stage (default: the last, the one RL starts from)."""
        return self._dir(cell, seed, f"warm{stage or len(cell.warm_start)}") / "model"

    def _main(self, run_dir: Path, options: dict[str, Any]) -> list[str]:
        if (run_dir / "config.json").is_file() and (run_dir / "checkpoint").exists():
            return [self.python, "-m", "oat_dppo.main", "--resume", str(run_dir), "--threads", "1", "--no-progress"]
        return ([self.python, "-m", "oat_dppo.main"] + option_args(options)
                + ["--run-dir", str(run_dir), "--threads", "1", "--no-progress"])

    def _call(self, cmd: list[str], log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n")
            f.flush()
            code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
        if code != 0:
            raise RuntimeError(f"{' '.join(cmd[:4])} ... exited with {code}; its log: {log}")

    def _test_row(self, run_dir: Path, policy: str = "last") -> dict:
        rows = [json.loads(line) for line in (run_dir / "evaluations.jsonl").read_text().splitlines() if line.strip()]
        tests = [r for r in rows if r.get("split") == "test" and r.get("policy") == policy]
        if not tests:
            raise RuntimeError(f"{run_dir}: no test evaluation of its {policy} policy")
        return tests[-1]

    def _record(self, cell: Cell, seed: int, run_dir: Path, arm_dir: str | None = None) -> None:
        """Copy the run's records to records/<cell>/s<seed>/<arm_dir, default the run directory's name>."""
        target = self.mission.records / cell.name / f"s{seed}" / (arm_dir or run_dir.name)
        target.mkdir(parents=True, exist_ok=True)
        for name in RECORDED_FILES:
            if (run_dir / name).is_file():
                shutil.copyfile(run_dir / name, target / name)

    def _base(self, cell: Cell, seed: int) -> dict[str, Any]:
        return {"env": cell.env, **cell.common, "seed": seed}

    # -- each arm ------------------------------------------------------------------------------------
    def _scripted(self, work: Work) -> dict:
        cell, seed = work.cell, work.seed
        run_dir = self._dir(cell, seed, work.arm)
        policy = getattr(cell, work.arm)
        options = {**self._base(cell, seed), "model": cell.model}
        self._call([self.python, "-m", "oat_dppo.evaluate", "--policy", policy, "--out", str(run_dir), "--split",
                    "test", "--episodes", str(work.cell.test_episodes), "--"] + option_args(options),
                   run_dir.with_suffix(".log"))
        self._record(cell, seed, run_dir)
        return self._test_row(run_dir, policy)

    def _warm_start(self, work: Work) -> dict:
        cell, seed = work.cell, work.seed
        model = cell.model
        for stage, options in enumerate(cell.warm_start, 1):
            run_dir, export = self._dir(cell, seed, f"warm{stage}"), self._export(cell, seed, stage)
            last = stage == len(cell.warm_start)
            if not (export / "config.json").is_file():
                scored = {"test_episodes": work.cell.test_episodes} if last else {"test_episodes": 0}
                self._call(self._main(run_dir, {**self._base(cell, seed), "model": model, **options, **scored,
                                                "iterations": 0}), run_dir.with_suffix(".log"))
                self._call([self.python, "-m", "oat_dppo.export", str(run_dir), str(export), "--overwrite"],
                           run_dir.with_suffix(".log"))
            self._record(cell, seed, run_dir)
            model = str(export)
        row = self._test_row(self._dir(cell, seed, f"warm{len(cell.warm_start)}"))
        recorded = self.rows.get(self._key(cell, "warm_start", seed))
        if recorded is not None and not same_recorded_mean(recorded, row):
            self.say(f"warning: {work.key}: the warm start made again scores {row['reward_mean']:.4f} on test, the "
                     f"recorded one {float(recorded['mean']):.4f}: RL starts from another policy than the row's")
        return row

    def _rl(self, work: Work) -> dict:
        cell, seed = work.cell, work.seed
        run_dir = self._dir(cell, seed, work.arm)
        options = {**self._base(cell, seed), "model": str(self._export(self._source(cell), seed)), **cell.rl,
                   "test_episodes": work.cell.test_episodes, "shuffle_advantages": work.arm == "control"}
        log = run_dir.with_suffix(".log")
        if cell.backend == "oat":
            return self._rl_on_oat(work, run_dir, options, log)
        self._call(self._main(run_dir, options), log)
        policy = "last"
        if options.get("keep_best"):  # the policy validation chose, scored on test
            policy = "best"
            if not any(r.get("policy") == "best" for r in _evaluations(run_dir)):
                self._call([self.python, "-m", "oat_dppo.evaluate", str(run_dir), "--split", "test", "--best",
                            "--episodes", str(work.cell.test_episodes)], log)
        self._record(cell, seed, run_dir)
        return self._test_row(run_dir, policy)

    def _rl_on_oat(self, work: Work, run_dir: Path, options: dict[str, Any], log: Path) -> dict:
        """The RL arm on Oat's program (`oat_python`): Oat writes the run under run_dir/<its run name>/; it cannot
        resume, so a stopped run starts over, and it keeps no best policy, so its last one is scored."""
        finished = _oat_finished(run_dir)
        if finished is None and shutil.which(self.mission.oat_python) is None:
            raise RuntimeError(f"no Oat stack at {self.mission.oat_python} ([table] oat_python): make setup-oat "
                               f"(Python 3.10) runs this cell")
        if finished is None:
            if run_dir.exists():
                self.say(f"{work.key}: an unfinished Oat run starts over (Oat cannot resume): {run_dir}")
                shutil.rmtree(run_dir)
            self._call([self.mission.oat_python, "-m", "oat_dppo.main"] + option_args({**options, "backend": "oat"})
                       + ["--run-dir", str(run_dir), *work.cell.oat_args], log)
            finished = _oat_finished(run_dir)
            if finished is None:
                raise RuntimeError(f"{run_dir}: the Oat run ended without a test evaluation; its log: {log}")
        self._record(work.cell, work.seed, finished, arm_dir=run_dir.name)
        return self._test_row(finished)

    def _do(self, work: Work) -> dict:
        do: Callable[[Work], dict] = {"blind": self._scripted, "demonstrator": self._scripted,
                                      "warm_start": self._warm_start}.get(work.arm, self._rl)
        self.say(f"start {work.key}")
        evaluation = do(work)
        row = table_row(work.cell, work.arm, work.seed, evaluation)
        if self._key(work.cell, work.arm, work.seed) not in self.done:
            append_row(self.mission.csv, row)
            self.done.add(self._key(work.cell, work.arm, work.seed))
        self.say(f"done {work.key}: test mean {row['mean']} over {row['episodes']} episodes")
        return row

    def run(self) -> int:
        """Every arm left, `jobs` at a time, each as soon as what it starts from exists."""
        todo = self.plan()
        finished: set[str] = set()
        failed: list[str] = []
        running: dict[Future, Work] = {}
        with ThreadPoolExecutor(max_workers=max(1, self.mission.jobs)) as pool:
            while todo or running:
                for work in [w for w in todo if all(a in finished for a in w.after)]:
                    if len(running) >= max(1, self.mission.jobs):
                        break
                    todo.remove(work)
                    running[pool.submit(self._do, work)] = work
                if not running:  # what is left waits on work that failed
                    failed += [w.key for w in todo]
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    work = running.pop(future)
                    try:
                        future.result()
                        finished.add(work.key)
                    except Exception as e:  # one arm's failure leaves the others going
                        self.say(f"failed {work.key}: {e}")
                        failed.append(work.key)
        if failed:
            self.say(f"not done: {', '.join(failed)} (run the same command again to retry)")
            return 1
        self.say(f"every arm done: {self.mission.csv}")
        return 0


def _oat_finished(run_dir: Path) -> Path | None:
    """The directory Oat wrote a finished run into (run_dir/<run name>/, with its test evaluation), or None."""
    done = [d for d in sorted(run_dir.glob("*/")) if any(r.get("split") == "test" for r in _evaluations(d))]
    return done[-1] if done else None


def _evaluations(run_dir: Path) -> list[dict]:
    path = run_dir / "evaluations.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oat_dppo.study.mission", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", help="the mission file (experiments/mission_table.toml)")
    parser.add_argument("--dry-run", action="store_true", help="print what is done and what is left; run nothing")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help=f"only these arms, comma-separated (default: all, {','.join(ARMS)})")
    parser.add_argument("--cells", default=None, help="only these cells (their names), comma-separated")
    parser.add_argument("--seeds", default=None,
                        help="only these seeds, comma-separated (a seed's warm start, RL and control fit one session "
                             "where a cell's every seed does not)")
    parser.add_argument("--report", action="store_true",
                        help="write the table (markdown) and its figure from the CSV; run nothing")
    args = parser.parse_args(argv)
    try:
        mission = load(args.file)
    except MissionError as e:
        print(e, file=sys.stderr)
        return 2
    if args.report:
        from oat_dppo.study.mission_table import write_report  # noqa: PLC0415 (matplotlib only here)

        for path in write_report(mission.csv):
            print(f"wrote {path}")
        return 0
    arms = tuple(a for a in args.arms.split(",") if a)
    if set(arms) - set(ARMS):
        print(f"--arms: unknown {', '.join(sorted(set(arms) - set(ARMS)))} (one of {', '.join(ARMS)})", file=sys.stderr)
        return 2
    try:
        seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip()) if args.seeds else None
    except ValueError:
        print(f"--seeds: whole numbers, comma-separated (got {args.seeds!r})", file=sys.stderr)
        return 2
    try:
        runner = Runner(mission, arms=arms, cells=tuple(args.cells.split(",")) if args.cells else None, seeds=seeds)
    except MissionError as e:
        print(e, file=sys.stderr)
        return 2
    if args.dry_run:
        print(f"{len(runner.done)} rows in {mission.csv}; left, in order:")
        for work in runner.plan():
            print(f"  {work.key}" + (f" (after {', '.join(work.after)})" if work.after else ""))
        return 0
    return runner.run()


if __name__ == "__main__":
    sys.exit(main())
