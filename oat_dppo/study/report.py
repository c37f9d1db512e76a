"""A study's report: the per-run results (`run_results`) grouped over seeds into summary.md,
summary.csv and runs.csv (`tables`, with the GPU windows' draws: `draws`) and paper-style figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from oat_dppo.plot.data import Run, Series
from oat_dppo.study.run_results import (ENTROPY, KEPT, MISMATCH, PRE_UPDATE_MISMATCH, REWARD, Group, build_groups,
                                        load_runs)
from oat_dppo.study.spec import RunSpec, Study
from oat_dppo.study.tables import csv_text, markdown, runs_csv_text

# (file stem, metric, what it shows, log y-axis: for values that fall by orders of magnitude)
FIGURES = (("reward", REWARD, "reward (rollout/reward_mean)", False),
           ("kept", KEPT, "kept fraction (train/kept_frac)", False),
           ("mismatch", PRE_UPDATE_MISMATCH, "training–inference mismatch |π − μ| (train/mismatch_mean)", True),
           ("drift", MISMATCH, "|π − μ| over the update, mismatch + drift (train/prob_diff_mean)", True),
           ("entropy", ENTROPY, "entropy of π at the response tokens (train/entropy)", True))


# ---- figures ------------------------------------------------------------------------------------


def write_figures(study: Study, groups: Sequence[Group], loaded: dict[str, Run]) -> list[Path]:
    """One figure per `FIGURES` entry that some run logged (reward, kept, mismatch, drift, entropy):
    a grid of panels (rows: models, columns: envs), one line per trust region (and other varied
    options) with a ± std band over seeds."""
    # matplotlib (about 0.5 s): only when figures are drawn
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from oat_dppo.plot.figures import _save, draw_panel, figure_legend, series_colors
    from oat_dppo.plot.panels import Panel

    groups = [g for g in groups if g.results]
    if not groups:
        return []
    models = list(dict.fromkeys((g.family, g.model) for g in groups))
    envs = list(dict.fromkeys(g.env for g in groups))
    labels = list(dict.fromkeys(g.label for g in groups))
    colors = series_colors(len(labels))
    color_of = dict(zip(labels, colors))
    written = []
    for stem, key, what, log in FIGURES:
        if not any(loaded[r.run.name].metrics.has(key) for g in groups for r in g.results):
            continue
        nrows, ncols = len(models), len(envs)
        fig = Figure(figsize=(max(6.0, 4.8 * ncols), 3.6 * nrows + 1.1), layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False)
        for i, (fam, model) in enumerate(models):
            for j, env in enumerate(envs):
                ax = axes[i][j]
                here = [g for g in groups if g.model == model and g.env == env]
                if not here:
                    ax.set_visible(False)
                    continue
                series = [Series(g.label, [loaded[r.run.name] for r in g.results]) for g in here]
                panel = Panel(stem, f"{env}\n{model} ({fam})", key)
                draw_panel(ax, panel, series, [color_of[g.label] for g in here], "iteration", "std", 1, 1.0)
                ax.set_title(panel.title, fontsize=9)
                ax.set_ylabel(what if j == 0 else "", fontsize=9)
                ax.set_xlabel("iteration", fontsize=9)
                if log:  # a band reaching below 0 is clipped at the axis
                    ax.set_yscale("log", nonpositive="clip")
        handles = [Line2D([], [], color=color_of[lb], lw=2, label=lb) for lb in labels]
        figure_legend(fig, handles)
        fig.suptitle(f"{study.name}: {what}\nmean ± std over seeds", fontsize=11)
        written.append(_save(fig, study.out / f"{stem}.png"))
    return written


# ---- all of it ----------------------------------------------------------------------------------


@dataclass
class Report:
    groups: list[Group]
    markdown: str
    paths: list[Path]

    @property
    def runs_with_metrics(self) -> int:
        return sum(len(g.results) for g in self.groups)


def write_report(study: Study, runs: Sequence[RunSpec], *, figures: bool = True) -> Report:
    """Aggregate `runs` (those with metrics) into <out>/summary.md, summary.csv and the figures."""
    loaded = load_runs(runs)
    groups = build_groups(runs, loaded, study.threshold, study.final_window)
    study.out.mkdir(parents=True, exist_ok=True)
    pngs = write_figures(study, groups, loaded) if figures and loaded else []
    md = markdown(study, groups, runs, pngs)
    md_path, csv_path, runs_path = study.out / "summary.md", study.out / "summary.csv", study.out / "runs.csv"
    md_path.write_text(md, encoding="utf-8")
    csv_path.write_text(csv_text(groups, study.name, study.threshold), encoding="utf-8")
    runs_path.write_text(runs_csv_text(groups), encoding="utf-8")
    return Report(groups, md, [md_path, csv_path, runs_path, *pngs])
