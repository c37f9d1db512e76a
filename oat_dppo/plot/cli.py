"""`python -m oat_dppo.plot RUN_DIR [RUN_DIR ...]`: training curves of runs as PNGs.

Exit status: 0 written; 2 bad input (a path with no run, no data, nothing to plot, a bad flag).
matplotlib is imported only once the input has been checked; torch never.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, Optional, Sequence

import tyro

from oat_dppo.cli import fail, opt, parse
from oat_dppo.plot.data import (
    IGNORED_CONFIG_KEYS,
    METRICS_FILE,
    Run,
    available_metrics,
    find_run_dirs,
    group_runs,
    load_run,
    warn_stderr,
)
from oat_dppo.plot.panels import DEFAULT_PANELS, NAMED_PANELS, resolve_panels

EPILOG = f"""\
panels (--metrics names; any other metrics.jsonl key works too, e.g. train/grad_norm or grad_norm):
{chr(10).join(f"  {p.name:<10} {p.key}{f' (+ {p.dashed} dashed)' if p.dashed else ''}" for p in NAMED_PANELS.values())}

examples:
  python -m oat_dppo.plot runs/                      # every run below runs/, into ./plots
  python -m oat_dppo.plot runs/my-run                # one run, into runs/my-run
  python -m oat_dppo.plot runs/ --metrics reward,success,train/grad_norm --smooth 5 --band minmax
  python -m oat_dppo.plot runs/a runs/b --group-by run_name --x wall_time --out figs
"""


DESCRIPTION = (
    "Plot training curves (reward, kept fraction, |pi - mu|, entropy, ...) of one or more runs as PNGs: one "
    "<panel>.png per metric and overview.png with all of them. Runs are grouped by a config key (trust_region "
    "by default); runs of a group that differ only by seed are drawn as their mean with a shaded band over the "
    "seeds, a group of one run as a plain line.\n\n" + EPILOG
)


@dataclass
class PlotArgs:
    paths: Annotated[tyro.conf.Positional[tuple[str, ...]], tyro.conf.arg(metavar="RUN_DIR ...")] = field(
        metadata={"help": f"run directories (with {METRICS_FILE} and config.json), or directories searched for them"})
    out: Annotated[Optional[str], tyro.conf.arg(metavar="DIR")] = opt(
        None, "where the PNGs go (created; default: the run directory when there is one run, else ./plots)")
    x: Literal["iteration", "wall_time"] = opt("iteration", "x axis: training iteration, or wall time since the run "
                                                             "started (mean over seeds)")
    metrics: str = opt(",".join(DEFAULT_PANELS), "comma-separated panel names or metric keys, one panel each; a "
                                                 "metric no run logged is skipped with a warning")
    group_by: str = opt("trust_region", "config.json key whose value labels and groups the runs, e.g. env, model, "
                                        "delta, or run_name (falls back to the directory name)")
    band: Literal["std", "minmax"] = opt("std", "shaded band over seeds: mean +/- population std, or min-max")
    smooth: int = opt(1, "trailing moving average over each run's last N logged points, before averaging seeds "
                         "(1: none)")
    ignore_keys: str = opt("", "more config keys (comma-separated) in which runs of a group may differ and still be "
                               f"averaged as seeds (always: {', '.join(sorted(IGNORED_CONFIG_KEYS))}); '*' averages "
                               "every run of a group")
    title: Optional[str] = opt(None, "figure title (default: shared env and model, band, smoothing)")
    list_metrics: bool = opt(False, "print the metric keys the runs logged, and exit")


def _discover(paths: Sequence[str]) -> tuple[list[Path], list[str], list[str]]:
    """(run dirs, error lines for bad paths, lines for good paths)."""
    run_dirs: list[Path] = []
    seen: set[Path] = set()
    bad: list[str] = []
    ok: list[str] = []
    for raw in paths:
        path = Path(raw)
        found = find_run_dirs(path)
        if not found:
            if not path.exists():
                why = "does not exist"
            elif path.is_file():
                why = f"is a file, not a run directory (one with {METRICS_FILE})"
            else:
                why = f"has no {METRICS_FILE}, in it or in any directory below it"
            bad.append(f"  {raw}: {why}")
            continue
        ok.append(f"  {raw}: " + ("run directory" if found == [path] else f"{len(found)} run directories"))
        for d in found:
            key = d.resolve()
            if key not in seen:
                seen.add(key)
                run_dirs.append(d)
    return run_dirs, bad, ok


def _auto_title(runs: Sequence[Run], band: str, smooth: int, any_band: bool) -> str:
    parts = []
    for key in ("env", "model"):
        values = {str(r.config.get(key)) for r in runs}
        if len(values) == 1 and all(key in r.config for r in runs):
            parts.append(f"{key} {values.pop()}")
    if any_band:
        parts.append("mean ± std over seeds" if band == "std" else "mean, min–max over seeds")
    if smooth > 1:
        parts.append(f"moving average of {smooth}")
    return " · ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(PlotArgs, None if argv is None else list(argv), prog="python -m oat_dppo.plot",
                 description=DESCRIPTION)
    if not args.paths:
        return fail("give at least one RUN_DIR (a run directory, or a directory searched for them)")
    if args.smooth < 1:
        return fail(f"--smooth must be >= 1, got {args.smooth}")

    run_dirs, bad, ok = _discover(args.paths)
    if bad:
        lines = ["not a run directory (no metrics.jsonl):", *bad]
        if ok:
            lines += ["these paths were fine:", *ok]
        return fail("\n".join(lines))

    runs: list[Run] = []
    for d in run_dirs:
        try:
            run = load_run(d, warn=warn_stderr)
        except OSError as e:
            return fail(f"{d / METRICS_FILE}: cannot read: {e}")
        if len(run.metrics) == 0:
            f = d / METRICS_FILE
            empty = not f.read_text(encoding="utf-8", errors="replace").strip()
            why = "is empty (the run has logged no iteration yet)" if empty else "has no parseable iteration line"
            warn_stderr(f"{f} {why}: skipped")
            continue
        runs.append(run)
    if not runs:
        where = ", ".join(str(d) for d in run_dirs)
        return fail(f"nothing to plot: every {METRICS_FILE} is empty or unparseable ({where})")

    available = available_metrics(runs)
    if args.list_metrics:
        print("\n".join(available))
        return 0

    # The default panels skip quietly what older runs did not log (train/mismatch_mean is newer).
    quiet_default = args.metrics == ",".join(DEFAULT_PANELS)
    panels = resolve_panels(args.metrics.split(","), available, warn=(lambda _m: None) if quiet_default else warn_stderr)
    if not panels:
        return fail(f"none of --metrics {args.metrics} is in any run; the runs logged: {', '.join(available)}")
    if args.x == "wall_time":
        without = [r for r in runs if not r.metrics.has("wall_time")]
        if len(without) == len(runs):
            return fail("--x wall_time: no run logged wall_time; use --x iteration")
        for r in without:
            warn_stderr(f"{r.path}: no wall_time logged: left out of the --x wall_time plots")

    ignore = set(IGNORED_CONFIG_KEYS) | {k.strip() for k in args.ignore_keys.split(",") if k.strip()}
    series = group_runs(runs, by=args.group_by, ignore=ignore, warn=warn_stderr)
    out = Path(args.out) if args.out is not None else run_dirs[0] if len(run_dirs) == 1 else Path("plots")
    title = args.title
    if title is None:
        title = _auto_title(runs, args.band, args.smooth, any(len(s.runs) > 1 for s in series))

    from oat_dppo.plot.figures import write_figures  # matplotlib: only now

    for path in write_figures(series, panels, out, x=args.x, band=args.band, smooth=args.smooth, title=title):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
