"""Is a difference between two rows of a study more than seed noise? Exact permutation tests.

Two rows (groups of seeds) are compared when they share the model and env and differ either in the
trust region alone or in the other varied options alone (e.g. the rollout engine at one trust
region). For a per-run number x (final reward, iterations at the format-failure floor, ...), the
statistic is the difference of the rows' means, and its two-sided p-value is the share of the ways
to relabel the pooled runs into two rows of the same sizes whose |difference| is at least the one
observed (Fisher's permutation test: no normality assumed, exact for the few seeds a study has;
5 vs 5 seeds has C(10, 5) = 252 relabellings, so the smallest p is 2/252 = 0.008).

The p-values are per comparison, not corrected for the number of comparisons a table makes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

EXACT_LIMIT = 200_000  # relabellings enumerated; above it, a seeded Monte Carlo sample of this size


def permutation_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of mean(a) - mean(b) under random relabelling of the pooled values."""
    x = np.concatenate([np.asarray(a, np.float64), np.asarray(b, np.float64)])  # [n_a + n_b]
    n_a, n = len(a), len(x)
    if n_a == 0 or n_a == n:
        return math.nan
    total = x.sum()

    def diffs(sums_a: np.ndarray) -> np.ndarray:  # |mean_a - mean_b| from the sum of the a-labelled values
        return np.abs(sums_a / n_a - (total - sums_a) / (n - n_a))

    observed = diffs(np.array([x[:n_a].sum()]))[0]
    tolerance = 1e-12 * max(1.0, float(np.abs(x).max()))  # ties of the observed split count as "as extreme"
    if math.comb(n, n_a) <= EXACT_LIMIT:
        sums = np.array([x[list(idx)].sum() for idx in itertools.combinations(range(n), n_a)])
        return float(np.mean(diffs(sums) >= observed - tolerance))
    rng = np.random.default_rng(0)
    picks = np.argsort(rng.random((EXACT_LIMIT, n)), axis=1)[:, :n_a]  # [draws, n_a]
    extreme = int(np.sum(diffs(x[picks].sum(axis=1)) >= observed - tolerance))
    return (extreme + 1) / (EXACT_LIMIT + 1)


@dataclass
class Comparison:
    where: str  # what the two rows share, e.g. "engine=vllm" or "dppo_binary_tv"
    label_a: str
    label_b: str
    metric: str
    a: list[float]
    b: list[float]

    @property
    def p(self) -> float:
        return permutation_p(self.a, self.b)

    @property
    def difference(self) -> float:
        return float(np.mean(self.a) - np.mean(self.b))


def comparisons(groups, metrics: dict[str, str]) -> list[Comparison]:
    """Every pair of groups (each with >= 2 finished seeds that have the metric) of one model and env
    that differ in the trust region alone, or in the other varied options alone. `metrics` maps a
    RunResult attribute to the name shown. An unfinished run's numbers are not its final ones: left out."""
    out = []
    rows = [(g, [r for r in g.results if r.finished]) for g in groups]
    for (g, g_runs), (h, h_runs) in itertools.combinations([row for row in rows if len(row[1]) >= 2], 2):
        if (g.model, g.env) != (h.model, h.env):
            continue
        extras = ", ".join(f"{k}={v}" for k, v in g.extra.items())
        if g.extra == h.extra and g.trust_region != h.trust_region:
            where, la, lb = extras or "-", g.trust_region, h.trust_region
        elif g.trust_region == h.trust_region and g.extra != h.extra:
            where = g.trust_region
            la = ", ".join(f"{k}={v}" for k, v in g.extra.items() if h.extra[k] != v)
            lb = ", ".join(f"{k}={v}" for k, v in h.extra.items() if g.extra[k] != v)
        else:
            continue
        for attr, name in metrics.items():
            a = [float(getattr(r, attr)) for r in g_runs if math.isfinite(getattr(r, attr))]
            b = [float(getattr(r, attr)) for r in h_runs if math.isfinite(getattr(r, attr))]
            if len(a) >= 2 and len(b) >= 2:
                out.append(Comparison(where, la, lb, name, a, b))
    return out


def markdown_table(comps: Sequence[Comparison]) -> str:
    lines = ["| rows share | A | B | metric | mean A | mean B | A − B | seeds | p (permutation) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in comps:
        lines.append(f"| {c.where} | {c.label_a} | {c.label_b} | {c.metric} | {np.mean(c.a):.3f} | "
                     f"{np.mean(c.b):.3f} | {c.difference:+.3f} | {len(c.a)} vs {len(c.b)} | {c.p:.3f} |")
    return "\n".join(lines) + "\n"
