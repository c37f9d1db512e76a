"""`bench peers`' oat-stock side: Oat 0.2.4's own `run_math_rl` program, end to end on this CPU.

Tiny-qwen3 on the benchmark's job (one-digit additions, its prompt texts), 2 prompts x 2 samples, two
learning rounds: Oat's ZeroMath learner and actor run (no project learner or actor in the nodes), their
log rows reach the metrics file, and the program ends by itself with status 0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("launchpad", reason="Oat's stack is .venv-oat (`make setup-oat`)")
pytest.importorskip("oat.interface")

from benchmarks import peers  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def test_oats_own_program_runs_the_job_and_ends(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = peers.Config(sides="oat-stock", steps=1, warmup=1, prompts=2, samples=2, max_new_tokens=4, micro_batch=2,
                       model="tiny-qwen3", oat_python=os.path.relpath(sys.executable, REPO))
    result = peers.run_oat_stock(cfg, tmp_path)
    steps = result["steps"]
    assert len(steps) == 2  # both rounds logged once each
    assert all(s["sequences"] == 4 and s["learn"] > 0 and s["generate"] > 0 for s in steps)
    assert all(s["reward"] == 0 for s in steps)  # Oat's grader: no \boxed in a pre-filled response
    save = tmp_path / "oat-stock"
    [metrics] = save.glob("*/metrics.jsonl")  # Oat's run folder under the save path
    assert (save / "prompts" / "train").is_dir()
    assert not (metrics.parent / "config.json").exists()  # the project's learner writes one in _init; Oat's not
