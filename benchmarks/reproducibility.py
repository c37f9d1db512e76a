"""`python -m benchmarks.reproducibility`: does `--deterministic` make one seed one run, and what does it cost?

Three runs of one grid point of a study's regime (default: experiments/gpu_decisive.toml's [base], pg_is,
seed 1, 8 iterations), side by side on one machine: two with `--deterministic` (det_a, det_b) and one
without (plain). Then, from their metrics.jsonl, for det_a vs det_b and det_a vs plain: the first
iteration at which any metric other than a timing differs, and the first at which the rollout reward
does; and each run's median seconds per iteration (iteration 0, with its warm-up, left out) and start-up,
so the mode's cost is det's time over plain's. Runs at once by default (--parallel 3): the start-ups
overlap, which keeps the step to about three minutes of a GPU window, and every run has the same
neighbours, so the ratio compares like with like (the decisive study runs six at once too).

Writes <out>/determinism.json, <out>/determinism.md and each run's config.json and metrics.jsonl
(<out>/<run>/); the runs themselves live in <runs-dir>/<run>/ (logs there too). `make gpu-results`
runs it once per checkout (setup/gpu_window.sh: after the float32 control, before the peers' pilot;
skipped once <out>/determinism.json says complete), and `make land-gpu` lands <out>.

Exit status: 0 when the three runs finished (whatever they show), 1 when one failed or ran out of time
(the report says which, from what they logged), 2 bad input.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

from oat_dppo.cli import fail, opt, parse
from oat_dppo.config import ConfigError, assignments
from oat_dppo.rundir import metrics_by_iteration
from oat_dppo.study.spec import FIELDS, option_args, tomllib

PROG = "python -m benchmarks.reproducibility"
RUNS = (("det_a", True), ("det_b", True), ("plain", False))
PAIRS = (("det_a", "det_b"), ("det_a", "plain"))
REWARD = "rollout/reward_mean"


@dataclass
class DeterminismArgs:
    study: str = opt("experiments/gpu_decisive.toml", "the study whose [base] is the regime")
    trust_region: str = opt("pg_is", "the grid point's trust region")
    seed: int = opt(1, "the grid point's seed (pg_is seed 1 parted at iteration 2 between the two windows)")
    iterations: int = opt(8, "iterations of each run")
    set: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = opt(
        (), "an option of the regime overridden, NAME=VALUE, e.g. --set engine=hf")
    parallel: int = opt(3, "runs at once (1: one after another)")
    budget_s: float = opt(180.0, "seconds for all three runs; a run still going then is stopped (SIGINT)")
    threads: int = opt(1, "--threads of each run")
    out: str = opt("docs/results/gpu_determinism", "where the result goes (replaced)")
    runs_dir: str = opt("runs/determinism", "where the runs go (replaced)")
    dry_run: bool = opt(False, "print the three commands and run nothing")


def is_timing(key: str) -> bool:
    """Keys that measure time (wall clock, throughput): they differ between any two runs."""
    return key.startswith(("time/", "perf/")) or key == "wall_time" or key.endswith("_s")


read_metrics = metrics_by_iteration  # iteration -> its row of a run's metrics.jsonl


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare(a: dict[int, dict], b: dict[int, dict], *, shown: int = 6) -> dict:
    """Two runs' rows, iteration by iteration (those both logged): the first iteration where a
    non-timing metric differs (None: none did), the metrics that differ there (up to `shown`, with both
    values), and the first iteration where the rollout reward differs."""
    common = sorted(set(a) & set(b))
    first = first_reward = None
    differing: list[dict] = []
    differing_count = 0
    for i in common:
        ra, rb = a[i], b[i]
        keys = sorted(k for k in set(ra) | set(rb) if not is_timing(k) and not _same(ra.get(k), rb.get(k)))
        if keys and first is None:
            first = i
            differing = [{"key": k, "a": ra.get(k), "b": rb.get(k)} for k in keys[:shown]]
            differing_count = len(keys)
        if first_reward is None and not _same(ra.get(REWARD), rb.get(REWARD)):
            first_reward = i
        if first is not None and first_reward is not None:
            break
    return {"iterations_compared": len(common), "first_differing_iteration": first,
            "differing_metrics_there": differing_count,
            "differing_at_first": differing, "first_reward_differing_iteration": first_reward}


def timing(rows: dict[int, dict], wall_s: float | None) -> dict:
    """Median seconds per iteration (iteration 0 left out where there are others) and start-up: the
    run's wall time not spent in its iterations."""
    its = [rows[i].get("time/iteration_s") for i in sorted(rows)]
    its = [t for t in its if isinstance(t, (int, float))]
    steady = its[1:] or its
    out = {"iteration_s_median": statistics.median(steady) if steady else None,
           "iteration0_s": its[0] if its else None}
    out["startup_s"] = (wall_s - sum(its)) if wall_s is not None and its else None
    return out


def regime(args: DeterminismArgs) -> dict:
    """The runs' options: the study's [base], the grid point, the overrides."""
    path = Path(args.study)
    try:
        base = tomllib.loads(path.read_text()).get("base", {})
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: {e}") from None
    options = dict(base)
    options.update(trust_region=args.trust_region, seed=args.seed, iterations=args.iterations, backend="local",
                   threads=args.threads, progress=False, log="none", keep_checkpoint=False,
                   save_every=args.iterations)
    options.update(assignments(args.set, "--set", example="engine=hf"))
    unknown = sorted(set(options) - set(FIELDS))
    if unknown:
        raise ConfigError(f"{path} / --set: not options of python -m oat_dppo.main: {', '.join(unknown)}")
    options.pop("deterministic", None)  # the runs choose
    return options


def command(name: str, deterministic: bool, options: dict, runs_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "oat_dppo.main", *option_args(options), "--run-dir", str(runs_dir / name)]
    return cmd + ["--deterministic"] if deterministic else cmd


def launch(name: str, deterministic: bool, options: dict, runs_dir: Path) -> tuple[subprocess.Popen, Path]:
    cmd = command(name, deterministic, options, runs_dir)
    log = runs_dir / f"{name}.log"
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGINT (the run saves and ends), then SIGKILL after `grace_s`."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_all(args: DeterminismArgs, options: dict, runs_dir: Path, err=sys.stderr) -> dict[str, dict]:
    """Run RUNS, `args.parallel` at a time, within `args.budget_s`. name -> exit, wall_s, stopped."""
    deadline = time.monotonic() + args.budget_s
    todo = list(RUNS)
    live: dict[str, tuple[subprocess.Popen, float]] = {}
    done: dict[str, dict] = {}
    try:
        while todo or live:
            while todo and len(live) < args.parallel and time.monotonic() < deadline:
                name, det = todo.pop(0)
                proc, log = launch(name, det, options, runs_dir)
                print(f"{name}: started ({'--deterministic' if det else 'plain'}; log {log})", file=err, flush=True)
                live[name] = (proc, time.monotonic())
            if time.monotonic() >= deadline:
                for name, (proc, t0) in live.items():
                    stop(proc)
                    done[name] = {"exit": proc.returncode, "wall_s": time.monotonic() - t0, "stopped": True}
                    print(f"{name}: stopped at the budget ({args.budget_s:.0f} s)", file=err, flush=True)
                live.clear()
                for name, _ in todo:
                    done[name] = {"exit": None, "wall_s": None, "stopped": True}
                todo.clear()
                break
            for name, (proc, t0) in list(live.items()):
                if proc.poll() is not None:
                    done[name] = {"exit": proc.returncode, "wall_s": time.monotonic() - t0, "stopped": False}
                    print(f"{name}: exit {proc.returncode} after {done[name]['wall_s']:.0f} s", file=err, flush=True)
                    del live[name]
            time.sleep(0.5)
    except KeyboardInterrupt:  # the window's deadline: keep what ran
        for name, (proc, t0) in live.items():
            stop(proc)
            done[name] = {"exit": proc.returncode, "wall_s": time.monotonic() - t0, "stopped": True}
        for name, _ in todo:
            done[name] = {"exit": None, "wall_s": None, "stopped": True}
    return done


def summarize(args: DeterminismArgs, options: dict, runs_dir: Path, outcome: dict[str, dict]) -> dict:
    rows = {name: read_metrics(runs_dir / name / "metrics.jsonl") for name, _ in RUNS}
    configs = {}
    for name, _ in RUNS:
        path = runs_dir / name / "config.json"
        configs[name] = json.loads(path.read_text()) if path.is_file() else {}
    runs = {}
    for name, det in RUNS:
        o = outcome.get(name, {"exit": None, "wall_s": None, "stopped": True})
        runs[name] = {"deterministic": det, "iterations_logged": len(rows[name]), **o,
                      **timing(rows[name], o["wall_s"]),
                      "not_pinned": configs[name].get("_deterministic_not_pinned")}
    pairs = {f"{a} vs {b}": compare(rows[a], rows[b]) for a, b in PAIRS}
    det = [runs[n]["iteration_s_median"] for n in ("det_a", "det_b") if runs[n]["iteration_s_median"]]
    plain = runs["plain"]["iteration_s_median"]
    ratio = (statistics.mean(det) / plain) if det and plain else None
    machine = next((c.get("_machine") for c in configs.values() if c.get("_machine")), {})
    complete = all(r["exit"] == 0 and r["iterations_logged"] >= args.iterations for r in runs.values())
    return {"complete": complete, "machine": machine, "parallel": args.parallel, "iterations": args.iterations,
            "study": args.study, "options": options, "runs": runs, "pairs": pairs,
            "iteration_s_ratio_det_over_plain": ratio}


def _it(i) -> str:
    return "never" if i is None else str(i)


def markdown(result: dict) -> str:
    o = result["options"]
    m = result["machine"] or {}
    lines = [
        "# One seed, one run: `--deterministic` measured",
        "",
        f"Written by `{PROG}` ({'complete' if result['complete'] else 'INCOMPLETE: see the runs'}). Regime: "
        f"{result['study']}'s [base], {o.get('trust_region')} seed {o.get('seed')}, {result['iterations']} "
        f"iterations, {result['parallel']} run(s) at once. Machine: {m.get('gpu') or m.get('cpu') or '?'}; "
        f"{m.get('torch', '?')}; {m.get('vllm') or 'no vLLM'}.",
        "",
        "| run | --deterministic | iterations | exit | s / iteration (median, from 1) | iteration 0 s | start-up s |",
        "|---|---|---|---|---|---|---|",
    ]

    def num(x, digits=2):
        return "-" if x is None else f"{x:.{digits}f}"

    for name, r in result["runs"].items():
        exit_ = "stopped" if r["stopped"] else str(r["exit"])
        lines.append(f"| {name} | {'yes' if r['deterministic'] else 'no'} | {r['iterations_logged']} | {exit_} | "
                     f"{num(r['iteration_s_median'])} | {num(r['iteration0_s'])} | {num(r['startup_s'], 0)} |")
    lines += ["", "| pair | iterations compared | first iteration any metric differs | first iteration the reward "
              "differs | metrics differing there (first few) |", "|---|---|---|---|---|"]
    for pair, c in result["pairs"].items():
        shown = ", ".join(f"`{d['key']}` {d['a']!r} / {d['b']!r}" for d in c["differing_at_first"][:3])
        more = c["differing_metrics_there"] - min(3, len(c["differing_at_first"]))
        lines.append(f"| {pair} | {c['iterations_compared']} | {_it(c['first_differing_iteration'])} | "
                     f"{_it(c['first_reward_differing_iteration'])} | {shown or '-'}"
                     f"{f' and {more} more' if more > 0 else ''} |")
    ratio = result["iteration_s_ratio_det_over_plain"]
    not_pinned = next((r["not_pinned"] for r in result["runs"].values() if r["not_pinned"]), None)
    lines += ["", f"Cost: a deterministic iteration takes {num(ratio)} x a plain one (median seconds per iteration, "
              "the runs side by side)." if ratio else "Cost: not measured (a run logged too few iterations).",
              "", "Not pinned, by the runs' own account: " + ("; ".join(not_pinned) if not_pinned else "-") + "."]
    aa = result["pairs"]["det_a vs det_b"]
    if aa["iterations_compared"]:
        verdict = ("the two deterministic runs are identical in every metric but timings over "
                   f"{aa['iterations_compared']} iterations: on this machine the mode pins the run"
                   if aa["first_differing_iteration"] is None else
                   f"the two deterministic runs part at iteration {aa['first_differing_iteration']}: the mode does "
                   "not pin this run here")
        lines += ["", f"Verdict: {verdict}."]
    return "\n".join(lines) + "\n"


def write(result: dict, out: Path, runs_dir: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name, _ in RUNS:
        for f in ("config.json", "metrics.jsonl"):
            src = runs_dir / name / f
            if src.is_file():
                (out / name).mkdir(exist_ok=True)
                shutil.copyfile(src, out / name / f)
    (out / "determinism.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    (out / "determinism.md").write_text(markdown(result))


def main(argv: list[str] | None = None) -> int:
    args = parse(DeterminismArgs, argv, prog=PROG, description=__doc__.split("\n\n")[0])
    if args.iterations < 1 or args.parallel < 1 or args.budget_s <= 0:
        return fail("--iterations and --parallel must be >= 1, --budget-s > 0")
    try:
        options = regime(args)
    except ConfigError as e:
        return fail(str(e))
    runs_dir, out = Path(args.runs_dir), Path(args.out)
    if args.dry_run:
        for name, det in RUNS:
            print(f"{name}: {shlex.join(command(name, det, options, runs_dir))}")
        return 0
    if runs_dir.exists():
        shutil.rmtree(runs_dir)
    runs_dir.mkdir(parents=True)
    outcome = run_all(args, options, runs_dir)
    result = summarize(args, options, runs_dir, outcome)
    write(result, out, runs_dir)
    print(markdown(result))
    print(f"written: {out}/determinism.json, determinism.md", file=sys.stderr)
    return 0 if result["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["compare", "is_timing", "main", "markdown", "read_metrics", "regime", "summarize", "timing"]
