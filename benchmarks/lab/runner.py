"""Running experiments: one (strategy, seed) run per process task, cached as JSONL, merged to CSV."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.lab.config import SimConfig
from benchmarks.lab.experiments import Experiment, StrategySpec
from benchmarks.lab.trainer import run_simulation


def run_key(spec: StrategySpec, cfg: SimConfig, seed: int) -> str:
    blob = json.dumps({"name": spec.name, "params": spec.params, "cfg": cfg.to_dict(), "seed": seed}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _one(args) -> tuple[str, float]:
    spec, cfg, seed, path = args
    t0 = time.perf_counter()
    rows = run_simulation(cfg, spec.name, spec.params, seed=seed)
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps({"meta": {"label": spec.label, "name": spec.name, "params": spec.params, "seed": seed, "config": cfg.to_dict()}}) + "\n")
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)
    return str(path), time.perf_counter() - t0


def load_run(path: Path) -> list[dict]:
    with open(path) as f:
        lines = f.read().splitlines()
    return [json.loads(x) for x in lines[1:]]


def run_experiment(exp: Experiment, cfg: SimConfig, seeds: int, out: Path, workers: int = 1, log=print) -> dict[str, list[list[dict]]]:
    """Runs (or loads from cache) every strategy x seed; returns {label: [rows of seed 0, ...]}."""
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    todo, paths = [], {}
    for spec in exp.strategies:
        for seed in range(seeds):
            path = runs_dir / f"{run_key(spec, cfg, seed)}.jsonl"
            paths[(spec.label, seed)] = path
            if not path.exists():
                todo.append((spec, cfg, seed, path))
    log(f"[{exp.key}] {len(exp.strategies)} strategies x {seeds} seeds, {cfg.iterations} iterations: "
        f"{len(todo)} runs to do, {len(paths) - len(todo)} cached in {runs_dir}")
    t0 = time.perf_counter()
    if todo:
        labels = {str(a[3]): f"{a[0].label} seed {a[2]}" for a in todo}
        if workers > 1:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                for i, (p, dt) in enumerate(pool.map(_one, todo), 1):
                    log(f"  [{exp.key}] {i}/{len(todo)} {labels[p]}: {dt:.1f}s")
        else:
            for i, a in enumerate(todo, 1):
                p, dt = _one(a)
                log(f"  [{exp.key}] {i}/{len(todo)} {labels[p]}: {dt:.1f}s")
    log(f"[{exp.key}] runs done in {time.perf_counter() - t0:.1f}s")
    results = {spec.label: [load_run(paths[(spec.label, s)]) for s in range(seeds)] for spec in exp.strategies}
    write_csv(exp, results, out / f"{exp.key}.csv")
    return results


def write_csv(exp: Experiment, results: dict[str, list[list[dict]]], path: Path) -> None:
    keys: list[str] = []
    for runs in results.values():
        for rows in runs:
            for r in rows:
                keys.extend(k for k in r if k not in keys)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["strategy", "seed", *keys])
        for label, runs in results.items():
            for seed, rows in enumerate(runs):
                for r in rows:
                    w.writerow([label, seed, *[r.get(k, math.nan) for k in keys]])


def summarize(results: dict[str, list[list[dict]]], last: int = 10) -> dict[str, dict[str, float]]:
    """Per strategy: mean over seeds of (mean of the last `last` iterations) for key metrics, plus
    the peak reward and the worst seed's final reward."""
    out = {}
    for label, runs in results.items():
        def final(metric):
            vals = []
            for rows in runs:
                xs = [r[metric] for r in rows[-last:] if r.get(metric) is not None and math.isfinite(r[metric])]
                if xs:
                    vals.append(sum(xs) / len(xs))
            return vals
        fr = final("reward")
        out[label] = {
            "final_reward": sum(fr) / len(fr) if fr else math.nan,
            "final_reward_min_seed": min(fr) if fr else math.nan,
            "peak_reward": sum(max(r["reward"] for r in rows) for rows in runs) / len(runs),
            **{f"final_{m}": (lambda v: sum(v) / len(v) if v else math.nan)(final(m))
               for m in ("mismatch", "prob_diff_mean", "entropy", "kept_frac", "bad_update_frac", "masked_mu_mean")},
        }
    return out
