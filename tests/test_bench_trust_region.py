"""`bench trust-region`: every registered strategy and the peers' sequence-level variants are timed,
each steps on the benchmark's own inputs, and the table marks which have a target."""

from __future__ import annotations

import math

from benchmarks import trust_region as bench
from oat_dppo.trust_region import available


def test_every_strategy_and_sequence_variant_is_benchmarked():
    labels = bench.labels()
    assert set(available()) <= set(labels) and set(bench.SEQUENCE_VARIANTS) <= set(labels)
    cfg = bench.Config(batch=2, seq=16, topk=3, reps=1, warmup=0)
    for label in labels:
        tr = bench.build(label, cfg)
        inputs = bench.make_inputs(cfg, tr.needs_topk)
        bench.step(tr, inputs)
        assert inputs.logp.grad is not None and math.isfinite(float(inputs.logp.grad.abs().sum())), label


def test_the_table_gives_sequence_level_strategies_no_target():
    rows = [dict(name=n, time=1e-3, median=1e-3, time_ratio=1.0, target=None if n in bench.SEQUENCE_LEVEL else 1.3,
                 peak=1, peak_ratio=1.0, largest=1, largest_vs_topk_input=0.1) for n in ("ipo", "trm", "tis:sequence")]
    table = bench.format_table(rows, bench.Config())
    assert "| ipo | 1.0 | 1.0 | 1.00 | <= 1.3 (ok) |" in table
    assert table.count("none (sequence-level)") == 2
