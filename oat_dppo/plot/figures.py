"""Matplotlib drawing (Agg, no pyplot state): one PNG per panel and overview.png with all of them."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Sequence

import matplotlib
import numpy as np

matplotlib.use("Agg")  # noqa: E402  (before anything can pick an interactive backend)
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from oat_dppo.plot.data import BandKind, Series, XAxis, aggregate
from oat_dppo.plot.panels import Panel

DPI = 120
LEGEND_WIDTH = 90  # characters a legend line holds before it wraps


def series_colors(n: int) -> list:
    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def time_unit(seconds: float) -> tuple[str, float]:
    if not math.isfinite(seconds) or seconds <= 300:
        return "s", 1.0
    if seconds <= 3 * 3600:
        return "min", 60.0
    return "h", 3600.0


def _max_wall_time(series: Sequence[Series]) -> float:
    best = -math.inf
    for s in series:
        for r in s.runs:
            if r.metrics.has("wall_time"):
                best = max(best, float(np.nanmax(r.metrics.columns["wall_time"])))
    return best


def draw_panel(
    ax, panel: Panel, series: Sequence[Series], colors: Sequence, x: XAxis, band: BandKind, smooth: int, x_scale: float
) -> tuple[list[int], bool]:
    """Draw one panel; returns (indices of the series drawn, whether a dashed eval line was drawn).

    A solid curve identical to one drawn before it (same x, same mean: e.g. trust regions that never
    mask, so their runs coincide) is drawn in short dashes on top, each twin's dashes shifted so that
    every colour shows, and the panel says which curves coincide: otherwise the first line would be
    hidden."""
    drawn: list[int] = []
    dashed_drawn = False
    solid: list[tuple[int, np.ndarray, np.ndarray]] = []  # (series index, x, mean) drawn so far
    twin_of: dict[int, int] = {}  # series index -> the first series with the identical curve
    for i, s in enumerate(series):
        tables = [r.metrics for r in s.runs]
        for key, dashed in ((panel.key, False), (panel.dashed, True)):
            if key is None:
                continue
            c = aggregate(tables, key, x=x, band=band, smooth=smooth)
            if len(c) == 0:
                continue
            xs = c.x / x_scale
            twin = None
            if not dashed:
                twin = next((j for j, sx, sm in solid if _same_curve(sx, sm, xs, c.mean)), None)
                solid.append((i, xs, c.mean))
                if twin is not None:
                    twin_of[i] = twin_of.get(twin, twin)
            ax.plot(
                xs,
                c.mean,
                color=colors[i],
                lw=1.4 if dashed else 1.8,
                ls="--" if dashed else ("-" if twin is None else _twin_dashes(len(twin_of))),
                marker="o" if dashed or len(c) == 1 else None,
                ms=3.5,
            )
            if len(s.runs) > 1:
                ax.fill_between(xs, c.lo, c.hi, color=colors[i], alpha=0.10 if dashed else 0.22, lw=0)
            dashed_drawn |= dashed
            if i not in drawn:
                drawn.append(i)
    references = sorted({float(v) for s in series for r in s.runs
                         if isinstance(v := r.config.get(panel.reference or ""), (int, float))})
    for value in references:  # e.g. the feedback-blind bound: success above it needs the env's replies
        ax.axhline(value, color="0.35", lw=1.0, ls=":")
        ax.text(0.99, value, panel.reference_label, transform=ax.get_yaxis_transform(), ha="right", va="bottom",
                fontsize=7, color="0.35")
    if twin_of:
        sets = {root: [root] + [i for i, r in twin_of.items() if r == root] for root in twin_of.values()}
        note = "; ".join(" = ".join(series[i].label for i in members) for members in sets.values())
        ax.text(0.01, 0.99, f"identical curves: {note}", transform=ax.transAxes, va="top", fontsize=7, color="0.25")
    ax.set_title(panel.title, fontsize=11)
    ax.set_ylabel(panel.key if not dashed_drawn else f"{panel.key}\n(dashed: {panel.dashed})", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=9)
    return drawn, dashed_drawn


def _twin_dashes(k: int) -> tuple[float, tuple[float, float]]:
    """Dash style of the k-th coinciding curve (k >= 1): 3-point dashes, 3 * k points apart."""
    return (3.0 * (k - 1), (3.0, 3.0 * k))


def _same_curve(x1: np.ndarray, y1: np.ndarray, x2: np.ndarray, y2: np.ndarray) -> bool:
    return x1.shape == x2.shape and np.array_equal(x1, x2) and np.array_equal(y1, y2, equal_nan=True)


def _handles(series: Sequence[Series], colors: Sequence, which: Sequence[int], dashed: bool) -> list:
    hs = [Line2D([], [], color=colors[i], lw=2, label=textwrap.fill(series[i].legend, LEGEND_WIDTH))
          for i in which]
    if dashed:
        hs.append(Line2D([], [], color="0.3", lw=1.4, ls="--", marker="o", ms=3.5, label="eval (dashed)"))
    return hs


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI)
    return path


def figure_legend(fig: Figure, handles: list, ncol: int | None = None) -> None:
    """The figure's legend under its panels, in `ncol` columns, by default as many (up to 4) as the
    figure's width holds."""
    longest = max((len(line) for h in handles for line in h.get_label().splitlines()), default=1)
    entry_pt = 9 * 0.6 * longest + 36  # fontsize 9, ~0.6 em a character, plus the line sample and the gap
    ncol = ncol or max(1, min(4, len(handles), int(fig.get_figwidth() * 72 // entry_pt)))
    try:  # matplotlib >= 3.7 with a constrained layout: outside the axes, no overlap
        fig.legend(handles=handles, loc="outside lower center", ncol=ncol, fontsize=9, frameon=False)
    except (ValueError, TypeError):
        fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=9, frameon=False)


def write_figures(
    series: Sequence[Series],
    panels: Sequence[Panel],
    out_dir: Path,
    x: XAxis = "iteration",
    band: BandKind = "std",
    smooth: int = 1,
    title: str = "",
) -> list[Path]:
    """One <panel>.png per panel, then overview.png (all panels in a grid). Returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    colors = series_colors(len(series))
    if x == "wall_time":
        unit, x_scale = time_unit(_max_wall_time(series))
        xlabel = f"wall time ({unit})"
    else:
        x_scale, xlabel = 1.0, "iteration"
    written: list[Path] = []

    long_labels = max((len(s.legend) for s in series), default=0) > 40  # a legend under the axes, not over the curves
    legend_lines = sum(textwrap.fill(s.legend, LEGEND_WIDTH).count("\n") + 1 for s in series) + 1
    for panel in panels:
        height = 4.8 + (0.2 * legend_lines if long_labels else 0.0)
        fig = Figure(figsize=(7.5 if not long_labels else 9.0, height), layout="constrained")
        ax = fig.add_subplot()
        drawn, dashed = draw_panel(ax, panel, series, colors, x, band, smooth, x_scale)
        ax.set_xlabel(xlabel)
        if title:
            fig.suptitle(title, fontsize=10)
        handles = _handles(series, colors, drawn, dashed)
        if long_labels:
            figure_legend(fig, handles, ncol=1)
        else:
            ax.legend(handles=handles, fontsize=8, loc="best")
        written.append(_save(fig, out_dir / f"{panel.name}.png"))

    n = len(panels)
    ncols = 1 if n == 1 else 2 if n <= 4 else 3
    nrows = math.ceil(n / ncols)
    legend_rows = math.ceil((len(series) + 1) / min(4, len(series) + 1))
    fig = Figure(figsize=(6.2 * ncols, 4.0 * nrows + 0.35 * legend_rows + 0.5), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    all_drawn: set[int] = set()
    any_dashed = False
    for ax, panel in zip(axes, panels):
        drawn, dashed = draw_panel(ax, panel, series, colors, x, band, smooth, x_scale)
        ax.set_xlabel(xlabel, fontsize=9)
        all_drawn.update(drawn)
        any_dashed |= dashed
    for ax in axes[n:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=12)
    handles = _handles(series, colors, sorted(all_drawn), any_dashed)
    figure_legend(fig, handles)
    written.append(_save(fig, out_dir / "overview.png"))
    return written
