#!/usr/bin/env python3
"""Land a GPU window's archive (what `setup/gpu_window.sh` packed) into this checkout.

    python3 setup/land_gpu_window.py ARCHIVE [--window YYYY-MM-DD] [--root .]   # = make land-gpu ARCHIVE=...

What it writes (standard library only; nothing is written when a step would overwrite a record):

- every finished run under the archive's docs/results/<study>/<run>/ into the same place here. A run
  already committed there with the same files is left as it is; one committed with *other* files (the
  same grid point run again in another window: a separate draw, not a repeat) is kept beside it in
  docs/results/gpu_window_<window>/<study>/<run>/, and the landing says so. If that place too holds
  other files, nothing is landed and the command exits 1.
- a step's result folder (`STEP_RESULTS`: docs/results/gpu_determinism/, the determinism step's report and
  its runs' config.json and metrics.jsonl) into the same place here, as one unit: left alone when the same
  files are here, kept beside in docs/results/gpu_window_<window>/<folder>/ when other ones are (another
  window's measurement), and nothing is landed when that place holds other files too.
- docs/results/gpu_window_<window>.csv: the rollout reward (and well-formed rate) of every iteration of
  every run the window ran (the archive's runs/studies/<study>/<run>/metrics.jsonl, finished or stopped
  at the deadline): the window's record, which `python -m oat_dppo.study <file> --report` reads as the
  study's draws. An existing file with other content stops the landing (exit 1).
- the rest of the archive (logs, the window's own report, step outputs) into runs/gpu_windows/<window>/
  (ignored by git), to read.

The window's date comes from --window, else from the archive's runs/gpu_window/window.txt
(`window=YYYY-MM-DD`, written by setup/gpu_window.sh), else from the archive's folder name.
"""

from __future__ import annotations

import argparse
import csv
import filecmp
import io
import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from oat_dppo.rundir import metrics_by_iteration

RUN_FILES = ("config.json", "metrics.jsonl", "responses.jsonl")
#: Folders under docs/results/ that a window step writes whole (not a study's runs): landed as one unit.
STEP_RESULTS = ("gpu_determinism",)
CSV_COLUMNS = ("study", "trust_region", "seed", "iteration", "rollout_reward_mean", "rollout_well_formed_rate")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}[A-Za-z0-9_.-]*$")


class LandingError(RuntimeError):
    pass


def window_of(archive: Path, unpacked: Path, given: str | None) -> str:
    if given:
        window = given
    else:
        stamp = unpacked / "runs" / "gpu_window" / "window.txt"
        found = re.search(r"^window=(\S+)", stamp.read_text(), re.M) if stamp.is_file() else None
        window = found.group(1) if found else archive.resolve().parent.name
    if not DATE.match(window):
        raise LandingError(f"cannot tell the window's date from {archive} (got {window!r}): pass --window YYYY-MM-DD")
    return window


def unpack(archive: Path, into: Path) -> None:
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():  # the archive is ours, but a path outside `into` is refused anyway
            outside = member.name.startswith("/") or ".." in Path(member.name).parts
            if outside or not (member.isfile() or member.isdir()):
                raise LandingError(f"{archive}: unexpected member {member.name!r}")
        tar.extractall(into)


read_iterations = metrics_by_iteration  # iteration -> its metrics (oat_dppo.rundir)


def finished_runs(unpacked: Path) -> list[Path]:
    """<study>/<run> paths (relative to docs/results) of the archive's committed runs."""
    base = unpacked / "docs" / "results"
    return sorted(p.relative_to(base) for p in base.glob("*/*")
                  if p.parent.name not in STEP_RESULTS and (p / "config.json").is_file()
                  and (p / "metrics.jsonl").is_file())


def files_of(folder: Path) -> dict[str, bytes]:
    """relative path -> content of every file under `folder`."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def same_run(a: Path, b: Path) -> bool:
    return all(filecmp.cmp(a / f, b / f, shallow=False) for f in ("config.json", "metrics.jsonl"))


def window_csv(unpacked: Path) -> tuple[str, list[str]]:
    """The window's record (CSV text) and one line per run it holds."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    lines = []
    rows = []
    for metrics in sorted((unpacked / "runs" / "studies").glob("*/*/metrics.jsonl")):
        run = metrics.parent
        cfg = json.loads((run / "config.json").read_text())
        its = read_iterations(metrics)
        if not its:
            continue
        for i, m in sorted(its.items()):
            wf = m.get("rollout/well_formed_rate")
            rows.append((run.parent.name, cfg["trust_region"], int(cfg["seed"]), i, round(m["rollout/reward_mean"], 4),
                         "" if wf is None else round(wf, 4)))
        done = "finished" if len(its) >= cfg["iterations"] else "stopped"
        lines.append(f"{run.parent.name}/{run.name}: {len(its)} of {cfg['iterations']} iterations ({done}), "
                     f"reward {its[min(its)]['rollout/reward_mean']:.3f} -> {its[max(its)]['rollout/reward_mean']:.3f}")
    for row in sorted(rows, key=lambda r: r[:4]):
        w.writerow(row)
    return (buf.getvalue() if rows else ""), lines


def land(archive: Path, root: Path, window: str | None = None, out=sys.stdout) -> int:
    archive, root = Path(archive), Path(root)
    with tempfile.TemporaryDirectory() as tmp:
        unpacked = Path(tmp)
        unpack(archive, unpacked)
        window = window_of(archive, unpacked, window)
        results = root / "docs" / "results"
        plan: list[tuple[Path, Path, str]] = []  # (from, to, what)
        problems = []
        for rel in finished_runs(unpacked):
            src, dest = unpacked / "docs" / "results" / rel, results / rel
            alt = results / f"gpu_window_{window}" / rel
            if not dest.exists():
                plan.append((src, dest, "landed"))
            elif same_run(src, dest):
                print(f"already here: {dest}", file=out)
            elif not alt.exists():
                why = f"{dest} holds another window's run of this grid point"
                plan.append((src, alt, f"kept as a separate draw ({why})"))
            elif same_run(src, alt):
                print(f"already here: {alt}", file=out)
            else:
                problems.append(f"{rel}: both {dest} and {alt} hold other runs of it")
        steps: list[tuple[Path, Path, str]] = []  # (from, to, what): step result folders, whole
        for name in STEP_RESULTS:
            src, dest = unpacked / "docs" / "results" / name, results / name
            alt = results / f"gpu_window_{window}" / name
            if not src.is_dir():
                continue
            if not dest.exists():
                steps.append((src, dest, "landed"))
            elif files_of(src) == files_of(dest):
                print(f"already here: {dest}", file=out)
            elif not alt.exists():
                steps.append((src, alt, f"kept beside {dest}, which holds another window's result"))
            elif files_of(src) == files_of(alt):
                print(f"already here: {alt}", file=out)
            else:
                problems.append(f"{name}: both {dest} and {alt} hold other results")
        record, ran = window_csv(unpacked)
        csv_path = results / f"gpu_window_{window}.csv"
        if record and csv_path.exists() and csv_path.read_text() != record:
            problems.append(f"{csv_path} exists with other content (another archive of this window?)")
        if problems:
            raise LandingError("nothing landed: " + "; ".join(problems) + ". Land it under another name with "
                               f"--window (e.g. --window {window}-b) or move those aside.")
        for src, dest, what in plan:
            dest.mkdir(parents=True, exist_ok=True)
            for f in RUN_FILES:
                if (src / f).is_file():
                    shutil.copyfile(src / f, dest / f)
            print(f"{what}: {dest} ({len(read_iterations(dest / 'metrics.jsonl'))} iterations)", file=out)
        for src, dest, what in steps:
            shutil.copytree(src, dest)
            print(f"{what}: {dest} ({len(files_of(dest))} files)", file=out)
        if record:
            csv_path.parent.mkdir(parents=True, exist_ok=True)
            csv_path.write_text(record)
            print(f"window {window}: {len(ran)} runs, each iteration's reward in {csv_path}:", file=out)
            for line in ran:
                print(f"  {line}", file=out)
        if (unpacked / "runs").is_dir():
            keep = root / "runs" / "gpu_windows" / window
            shutil.copytree(unpacked / "runs", keep, dirs_exist_ok=True)
            print(f"logs and the window's own reports: {keep}/", file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("archive", type=Path)
    p.add_argument("--window", help="the window's date, YYYY-MM-DD (default: the archive's window.txt or folder name)")
    p.add_argument("--root", type=Path, default=Path("."), help="the checkout to land into (default: .)")
    args = p.parse_args(argv)
    try:
        return land(args.archive, args.root, args.window)
    except LandingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
