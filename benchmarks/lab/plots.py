"""Plots: one PNG per figure, panels of per-iteration metrics, mean over seeds with min-max shading."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.lab.experiments import Experiment  # noqa: E402


def _matrix(runs: list[list[dict]], metric: str, smooth: int) -> np.ndarray:
    n = min(len(r) for r in runs)
    m = np.array([[r[i].get(metric, math.nan) for i in range(n)] for r in runs], dtype=float)
    if smooth > 1:  # trailing moving average, NaN-aware (masked_mu_mean is NaN when nothing was masked)
        out = np.full_like(m, np.nan)
        for i in range(n):
            w = m[:, max(0, i - smooth + 1) : i + 1]
            with np.errstate(all="ignore"):
                out[:, i] = np.nanmean(w, axis=1) if np.isfinite(w).any() else np.nan
        m = out
    return m


def plot_experiment(exp: Experiment, results: dict[str, list[list[dict]]], path: Path, smooth: int = 5) -> Path:
    n = len(exp.panels)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6))
    seeds = len(next(iter(results.values())))
    for ax, (metric, ylabel) in zip(np.atleast_1d(axes), exp.panels):
        for spec in exp.strategies:
            m = _matrix(results[spec.label], metric, smooth)
            x = np.arange(m.shape[1])
            with np.errstate(all="ignore"):
                mean, lo, hi = np.nanmean(m, 0), np.nanmin(m, 0), np.nanmax(m, 0)
            ax.plot(x, mean, spec.style, color=spec.color, label=spec.label, lw=1.6)
            ax.fill_between(x, lo, hi, color=spec.color, alpha=0.15, lw=0)
        if metric in exp.log_panels:
            ax.set_yscale("log")
        ax.set_xlabel("iteration (rollout batch)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].legend(fontsize=7, loc="best")
    fig.suptitle(f"{exp.title}  —  mean over {seeds} seeds, shading min-max, {smooth}-iteration moving average", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
