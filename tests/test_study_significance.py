"""The study report's permutation tests (oat_dppo.study.significance): exact values, invariants,
the Monte Carlo branch against the exact one, and the comparisons a report makes."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oat_dppo.study import significance
from oat_dppo.study.run_results import Group, RunResult
from oat_dppo.study.significance import comparisons, permutation_p

values = st.lists(st.floats(-1, 1, allow_nan=False).map(lambda v: round(v, 3)), min_size=2, max_size=6)


def brute_force_p(a, b) -> float:
    """The definition, spelled out: every split of the pooled values into |a| and |b|."""
    x = list(a) + list(b)
    observed = abs(np.mean(a) - np.mean(b))
    hits = total = 0
    for idx in itertools.combinations(range(len(x)), len(a)):
        rest = [x[i] for i in range(len(x)) if i not in idx]
        hits += abs(np.mean([x[i] for i in idx]) - np.mean(rest)) >= observed - 1e-12
        total += 1
    return hits / total


def test_exact_values():
    # 5 vs 5 with every a below every b: only the observed split and its mirror are as extreme.
    assert permutation_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert permutation_p([0.3, 0.3, 0.3], [0.3, 0.3]) == 1.0  # no difference at all
    # 2 vs 2: splits {1,2}|{3,4}, {3,4}|{1,2} give |diff| 2; the other four give 1 or 0.
    assert permutation_p([1, 2], [3, 4]) == pytest.approx(2 / 6)
    assert math.isnan(permutation_p([], [1.0, 2.0]))


@settings(max_examples=60, deadline=None)
@given(values, values)
def test_matches_the_definition_and_is_symmetric(a, b):
    p = permutation_p(a, b)
    assert p == pytest.approx(brute_force_p(a, b))
    assert 0 < p <= 1  # the observed split is always counted
    assert permutation_p(b, a) == pytest.approx(p)
    assert permutation_p([v + 5 for v in a], [v + 5 for v in b]) == pytest.approx(p)  # shift-invariant


def test_monte_carlo_branch_agrees_with_the_exact_one(monkeypatch):
    rng = np.random.default_rng(1)
    a, b = rng.normal(0, 1, 6), rng.normal(0.8, 1, 6)
    exact = permutation_p(a, b)
    monkeypatch.setattr(significance, "EXACT_LIMIT", 100)  # C(12, 6) = 924 > 100: sampled
    sampled = permutation_p(a, b)
    assert sampled != exact and sampled == pytest.approx(exact, abs=0.01)


def _group(tr: str, extra: dict, finals: list[float], model="m", env="e") -> Group:
    g = Group("chatml", model, env, tr, extra)
    nan = math.nan
    g.results = [RunResult(None, 30, f, f, nan, f, 1.0, 0.01, nan, f - 0.1, int(f < 0), 1.0, 0.005)
                 for f in finals]
    return g


def test_report_compares_rows_differing_in_one_thing():
    vllm, hf = {"engine": "vllm"}, {"engine": "hf"}
    groups = [
        _group("pg_is", vllm, [-0.1, -0.1, 0.2]), _group("dppo_binary_tv", vllm, [0.5, 0.6, 0.7]),
        _group("pg_is", hf, [0.4, 0.5, 0.6]), _group("dppo_binary_tv", hf, [0.5]),  # one seed: no test
        _group("pg_is", vllm, [0.1, 0.2], model="other"),
    ]
    comps = comparisons(groups, {"final": "final reward"})
    pairs = [(c.where, c.label_a, c.label_b) for c in comps]
    # pg_is vs dppo at vllm; pg_is at vllm vs hf; not across trust region and engine at once, not across models
    assert pairs == [("engine=vllm", "pg_is", "dppo_binary_tv"), ("pg_is", "engine=vllm", "engine=hf")]
    first = comps[0]
    assert first.difference == pytest.approx(0.0 - 0.6)
    assert first.p == pytest.approx(2 / 20)  # 3 vs 3, fully separated: 2 of C(6, 3) = 20 splits
    assert "| engine=vllm | pg_is | dppo_binary_tv | final reward | 0.000 | 0.600 | -0.600 | 3 vs 3 | 0.100 |" in (
        significance.markdown_table(comps))


def test_unfinished_runs_are_left_out_of_the_tests():
    """A run still going has no final reward yet: its seed is not compared, and a row left with
    fewer than 2 finished seeds is not tested at all."""
    vllm = {"engine": "vllm"}
    pg, tv = _group("pg_is", vllm, [0.1, 0.2, 0.9]), _group("dppo_binary_tv", vllm, [0.5, 0.6])
    pg.results[2].finished = False
    (comp,) = comparisons([pg, tv], {"final": "final reward"})
    assert comp.a == [0.1, 0.2] and comp.b == [0.5, 0.6]
    tv.results[1].finished = False
    assert comparisons([pg, tv], {"final": "final reward"}) == []
