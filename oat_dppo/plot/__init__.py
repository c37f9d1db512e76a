"""Training curves of runs: `python -m oat_dppo.plot RUN_DIR [RUN_DIR ...]` (docs/plotting.md).

Reading and aggregating (numpy only; importing this package loads neither torch nor matplotlib):

    table = read_metrics("runs/a")                  # MetricTable: iterations + columns, NaN for null
    curve = aggregate([t1, t2, t3], "rollout/reward_mean", band="std", smooth=1)
    curve.x, curve.mean, curve.lo, curve.hi, curve.n  # per iteration, over the runs with a value
    series = group_runs([load_run(d) for d in find_run_dirs("runs/")], by="trust_region")

Drawing is `oat_dppo.plot.figures.write_figures` (imports matplotlib with the Agg backend).
"""

from oat_dppo.plot.cli import main
from oat_dppo.plot.data import (
    IGNORED_CONFIG_KEYS,
    Curve,
    MetricTable,
    Run,
    Series,
    aggregate,
    available_metrics,
    find_run_dirs,
    group_runs,
    load_run,
    parse_metrics,
    read_metrics,
    trailing_mean,
)
from oat_dppo.plot.panels import DEFAULT_PANELS, NAMED_PANELS, Panel, resolve_panels

__all__ = [
    "DEFAULT_PANELS",
    "IGNORED_CONFIG_KEYS",
    "NAMED_PANELS",
    "Curve",
    "MetricTable",
    "Panel",
    "Run",
    "Series",
    "aggregate",
    "available_metrics",
    "find_run_dirs",
    "group_runs",
    "load_run",
    "main",
    "parse_metrics",
    "read_metrics",
    "resolve_panels",
    "trailing_mean",
]
