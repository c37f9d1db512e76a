"""`python -m oat_dppo.study experiments/<name>.toml`: run a grid of training runs and report on it.

Exit status: 0 done; 1 some runs failed (the others ran); 2 bad input (nothing ran); 130 Ctrl-C.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Annotated, Optional

import tyro

from oat_dppo.cli import EXIT_BAD_INPUT, opt, parse, python_command
from oat_dppo.study.spec import StudyError, load_study

LOCK_NAME = ".study.lock"

EPILOG = """\
examples:
  python -m oat_dppo.study experiments/tiny_smoke.toml            # run (resumable: re-run to continue)
  python -m oat_dppo.study experiments/smollm2_gtn.toml --dry-run  # the runs and their commands
  python -m oat_dppo.study experiments/smollm2_gtn.toml --only dppo_binary_tv --only '*__s0'
  python -m oat_dppo.study experiments/smollm2_gtn.toml --report   # tables and figures of what exists
  python -m oat_dppo.study experiments/model_families.toml        # backend "oat": writes launch_oat.sh

file format and report: docs/studies.md
"""


DESCRIPTION = (
    "Run a study: the grid of `python -m oat_dppo.main` runs a TOML file describes ([study], [base], [grid]), "
    "sequentially or N at a time, resumable (finished runs are skipped, interrupted ones resumed), then a report: "
    "<out>/summary.md, summary.csv, runs.csv, reward.png, kept.png, mismatch.png, drift.png, entropy.png.\n\n" + EPILOG
)


@dataclass
class StudyArgs:
    study: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="STUDY.toml")] = field(
        metadata={"help": "the study file"})
    dry_run: bool = opt(False, "print the runs (state, name, command) and run nothing")
    only: Annotated[tuple[str, ...], tyro.conf.UseAppendAction, tyro.conf.arg(metavar="PATTERN")] = opt(
        (), "only the runs whose name matches (a glob with * ? [...], else a substring); repeatable")
    report: bool = opt(False, "only aggregate the existing runs (no training)")
    parallel: Annotated[Optional[int], tyro.conf.arg(metavar="N")] = opt(
        None, "runs at once, overriding [study] parallel")


def main(argv: list[str] | None = None, *, out: IO | None = None, err: IO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    argv = sys.argv[1:] if argv is None else list(argv)
    from oat_dppo.study.mission import is_mission_file  # noqa: PLC0415

    if argv and not argv[0].startswith("-") and is_mission_file(argv[0]):  # the mission table's own runner
        from oat_dppo.study.mission import main as mission_main  # noqa: PLC0415

        return mission_main(argv)
    args = parse(StudyArgs, argv, prog="python -m oat_dppo.study", description=DESCRIPTION)

    def bad(lines: list[str]) -> int:
        for line in lines:
            print(f"error: {line}", file=err)
        print(f"{len(lines)} problem{'s' if len(lines) > 1 else ''} in {args.study}; nothing was run", file=err)
        return EXIT_BAD_INPUT

    if args.parallel is not None and args.parallel < 1:
        return bad([f"--parallel must be >= 1, got {args.parallel}"])
    try:
        study = load_study(args.study, parallel=args.parallel)
    except StudyError as e:
        return bad(e.errors)
    runs = study.select(args.only)
    if not runs:
        names = ", ".join(r.name for r in study.runs[:20]) + (" ..." if len(study.runs) > 20 else "")
        return bad([f"--only {' --only '.join(args.only)} matches none of the {len(study.runs)} runs: {names}"])

    if args.report:
        return _report(study, runs, out, err, empty_is_error=True)

    from oat_dppo.provenance import machine
    from oat_dppo.study.runner import (  # numpy
        LocalRunner,
        clock,
        commit_finished,
        conflicts,
        print_plan,
        run_state,
        time_left,
        write_oat_script,
    )

    problems = conflicts(runs)
    if problems:
        return bad([f"{study.path}: {p}" for p in problems])
    if not args.dry_run:
        for run in commit_finished(runs):
            print(f"committed {run.name} to {run.results_dir}", file=out)
    states = {r.name: run_state(r) for r in runs}
    counts = {s: sum(1 for st in states.values() if st.status == s) for s in ("done", "resume", "restart", "new")}
    print(f"study {study.name}: {len(runs)} runs{f' (of {len(study.runs)})' if len(runs) < len(study.runs) else ''}, "
          f"backend {study.backend}, out {study.out}", file=out)
    if study.backend == "local":
        threads = sorted({r.config.threads for r in runs})
        print(f"  {counts['done']} done (skipped), {counts['resume']} to resume, "
              f"{counts['new'] + counts['restart']} to start; {study.parallel} at a time, "
              f"--threads {'/'.join(map(str, threads))} each", file=out)
        left = time_left(runs, states, study.parallel, here=machine())
        if left is not None and left.seconds > 0:
            where = "on this machine" if left.this_machine else "on other machines"
            print(f"  ~{clock(left.seconds)} left at the pace the runs logged {where} (time/iteration_s of "
                  f"{left.timed_runs} run{'s' * (left.timed_runs != 1)}; a run's own grid point where it has one)",
                  file=out)
    if args.dry_run:
        print_plan(runs, states, backend=study.backend, out=out)
        return 0
    if study.backend == "oat":
        path = write_oat_script(study, runs)
        print(f"wrote {path} ({len(runs)} commands; nothing was run)", file=out)
        print(f"run it on the GPU machine: bash {path}", file=out)
        return 0

    todo = [r for r in runs if states[r.name].status != "done"]
    hint = f"{python_command()} -m oat_dppo.study " + shlex.join(argv)
    code = 0
    if todo:
        with _exclusive(study.out) as locked:
            if not locked:
                return bad([f"another `python -m oat_dppo.study` is running the runs in {study.out} "
                            f"(it holds {study.out / LOCK_NAME}); wait for it, or use --report"])
            runner = LocalRunner(study, todo, parallel=study.parallel, out=out, continue_hint=hint)
            code = runner.run()
        if code == 130:
            return code
    else:
        print("every run is done: nothing to run", file=out)
    rc = _report(study, runs, out, err, empty_is_error=False)
    return code or rc


def _report(study, runs, out: IO, err: IO, *, empty_is_error: bool) -> int:
    from oat_dppo.study.report import write_report  # numpy; matplotlib once figures are drawn
    from oat_dppo.study.runner import commit_finished, conflicts

    problems = conflicts(runs)
    for problem in problems:
        print(f"warning: {problem}; reported anyway", file=err)
    if not problems:
        for run in commit_finished(runs):
            print(f"committed {run.name} to {run.results_dir}", file=out)

    report = write_report(study, runs)
    if not report.runs_with_metrics:
        print(f"no run of {study.name} has metrics yet in {study.out}", file=err if empty_is_error else out)
        return EXIT_BAD_INPUT if empty_is_error else 0
    print("", file=out)
    print(_table_only(report.markdown), file=out)
    for p in report.paths:
        print(f"wrote {p}", file=out)
    return 0


@contextlib.contextmanager
def _exclusive(out_dir: Path):
    """One runner per study directory: an flock on <out>/.study.lock (released when we exit)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / LOCK_NAME, "a") as f:
        try:
            import fcntl  # POSIX only

            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # no flock on this platform: no guard
            pass
        except OSError:
            yield False
            return
        yield True


def _table_only(md: str) -> str:
    lines = [line for line in md.splitlines() if line.startswith("|")]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
