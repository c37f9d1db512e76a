"""Studies: grids of training runs from a TOML file, run locally (resumable, N at a time) or written
as Oat launch commands, then aggregated into tables and figures (docs/studies.md).

    python -m oat_dppo.study experiments/smollm2_gtn.toml [--dry-run] [--only PATTERN] [--report]

    study = load_study("experiments/tiny_smoke.toml")     # checked; StudyError lists every problem
    for run in study.runs: run.name, run.run_dir, run.config, main_command(run)
    report = write_report(study, study.runs)             # summary.md, summary.csv, *.png in study.out

Importing this package is cheap (no torch); checking a study imports the trust-region registry.
"""

from oat_dppo.study.cli import main
from oat_dppo.study.spec import RunSpec, Study, StudyError, load_study, option_args, run_name


def __getattr__(name: str):  # the runner and the report load numpy/matplotlib: on first use only
    if name in ("main_command", "run_state", "write_oat_script", "LocalRunner", "RunState"):
        from oat_dppo.study import runner

        return getattr(runner, name)
    if name in ("write_report", "Report"):
        from oat_dppo.study import report

        return getattr(report, name)
    if name in ("run_result", "build_groups"):
        from oat_dppo.study import run_results

        return getattr(run_results, name)
    raise AttributeError(name)


__all__ = [
    "LocalRunner",
    "Report",
    "RunSpec",
    "RunState",
    "Study",
    "StudyError",
    "build_groups",
    "load_study",
    "main",
    "main_command",
    "option_args",
    "run_name",
    "run_result",
    "run_state",
    "write_oat_script",
    "write_report",
]
