"""--threads 0 (auto): a run takes the cores other work leaves free, and says so when that is fewer
than all of them (two runs side by side with a thread per core each crawl)."""

from __future__ import annotations

import pytest

from oat_dppo import threads
from oat_dppo.threads import auto_threads, choose_threads


@pytest.mark.parametrize(("cores", "busy", "expected"), [
    (2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 7.5, 1), (16, 3.2, 13), (1, 0.9, 1),
])
def test_auto_threads_takes_the_free_cores(cores, busy, expected):
    assert auto_threads(cores, busy) == expected


def test_choose_threads(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "busy_cores", lambda: 1.2)
    assert choose_threads(3) == (3, None)  # asked for: taken as it is, busy or not
    n, note = choose_threads(0)
    assert n == 1
    assert note == ("note: 1.2 of 2 cores are busy with other work: this run takes 1 thread "
                    "(--threads 0 picks the free cores; --threads N sets N)")
    monkeypatch.setattr(threads, "busy_cores", lambda: 0.2)
    assert choose_threads(0) == (2, None)  # an idle machine: every core, no note


def test_busy_cores_reads_the_machine():
    busy = threads.busy_cores()
    assert 0.0 <= busy < 10_000
    assert 1 <= threads.usable_cores()
