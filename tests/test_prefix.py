"""Clustering rows by the prefixes they share (`models.prefix.plan_prefixes`): hand cases, and against every
subset of a few rows: the plan saves at least what the best single cluster saves (the dynamic program covers
runs of the sorted order, not every partition: a short row sorted between two longer twins pairs only with
its neighbours)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from oat_dppo.models.prefix import MAX_GRID_SHARE, PrefixPlan, plan_prefixes

INF = float("inf")  # the clustering alone, whatever its grid


def _common(rows):
    n = 0
    while all(len(r) > n for r in rows) and len({r[n] for r in rows}) == 1:
        n += 1
    return n


def test_groups_are_found_however_the_rows_are_ordered():
    a, b = [1, 2, 3, 4, 5], [7, 7, 7, 7]
    rows = [a + [9], b + [1], a + [8, 8], b + [2], [5, 5, 5]]
    plan = plan_prefixes(rows, [len(r) - 1 for r in rows], min_shared=3)
    assert plan.cluster[0] == plan.cluster[2] != plan.cluster[1] == plan.cluster[3] and plan.cluster[4] == -1
    assert plan.lengths[plan.cluster[0]] == 5 and plan.lengths[plan.cluster[1]] == 4
    assert plan.offsets == [5, 4, 5, 4, 0] and plan.saved == 5 + 4


def test_limits_and_the_minimum_cap_a_cluster():
    rows = [[1, 2, 3, 4, 5, 6]] * 3
    # row 2 may share only 2 tokens: all three save 2 x 2, rows 0 and 1 alone 1 x 5
    assert plan_prefixes(rows, [5, 5, 2], min_shared=2, max_grid_share=INF) == PrefixPlan((0, 0, -1), (5,))
    assert plan_prefixes(rows, [5, 5, 4], min_shared=2) == PrefixPlan((0, 0, 0), (4,))  # 2 x 4 beats 1 x 5
    assert plan_prefixes(rows, [5, 5, 5], min_shared=6) == PrefixPlan((-1, -1, -1), ())
    assert plan_prefixes([[1, 2]], [1]) == PrefixPlan((-1,), ())
    assert plan_prefixes([], []) == PrefixPlan((), ())


def test_a_plan_whose_grid_does_not_shrink_is_dropped():
    """A row outside every cluster keeps the rests' batch at its whole length: the pair's prefix (5 positions once)
    plus 3 rests of 6 is 23 positions against the padded grid's 18, so no cluster runs. With every row in the
    cluster: 4 + 3 x 2 = 10 <= 0.9 x 18."""
    rows = [[1, 2, 3, 4, 5, 6]] * 3
    assert plan_prefixes(rows, [5, 5, 2], min_shared=2) == PrefixPlan((-1, -1, -1), ())
    assert PrefixPlan((0, 0, -1), (5,)).grid([6, 6, 6]) == 23
    kept = plan_prefixes(rows, [5, 5, 4], min_shared=2)
    assert kept == PrefixPlan((0, 0, 0), (4,)) and kept.grid([6, 6, 6]) == 10 <= MAX_GRID_SHARE * 18


def _subsets(n):
    for mask in range(1, 2**n):
        yield [r for r in range(n) if mask >> r & 1]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=7), min_size=1, max_size=7), st.integers(1, 3),
       st.data())
def test_the_plan_is_valid_and_saves_at_least_the_best_single_cluster(rows, min_shared, data):
    limits = [data.draw(st.integers(0, len(r))) for r in rows]
    plan = plan_prefixes(rows, limits, min_shared, max_grid_share=INF)
    for c, length in enumerate(plan.lengths):
        members = [r for r, k in enumerate(plan.cluster) if k == c]
        assert len(members) > 1 and length >= min_shared
        assert length <= _common([rows[r] for r in members]) and all(length <= limits[r] for r in members)
    def saved(members):
        shared = min([_common([rows[r] for r in members])] + [limits[r] for r in members])
        return (len(members) - 1) * shared if shared >= min_shared else 0

    assert plan.saved >= max(saved(members) for members in _subsets(len(rows)))
