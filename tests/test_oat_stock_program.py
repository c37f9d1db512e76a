"""`bench peers`' oat-stock side: Oat 0.2.4's own `run_math_rl` program, end to end on this CPU.

Tiny-qwen3 on the benchmark's job (one-digit additions, its prompt texts), 2 prompts x 2 samples, two
learning rounds: `python -m oat.experiment.run_math_rl` with the job's settings as its command line runs
Oat's ZeroMath learner and actor (no project learner, actor or metrics file in the nodes), the learner's
log rows are read back from what it printed, and the program ends by itself (Oat's `lp.stop()`) before the
watchdog would end it, leaving no process of its group behind.
"""

from __future__ import annotations

import json
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
    assert (save / "prompts" / "train").is_dir()
    command = json.loads((save / "oat_command.json").read_text())
    argv = command["argv"]
    assert argv[argv.index("-m") + 1] == "oat.experiment.run_math_rl"  # Oat's script, as Oat ships it
    assert argv[argv.index("--prompt-template") + 1] == "no" and "--no-bf16" in argv
    assert argv[argv.index("--generate-max-length") + 1] == "4"  # the job's settings, on its command line
    assert not command["timed_out"] and command["rounds"] == 2  # Oat's own end, after both rounds
    with pytest.raises(ProcessLookupError):  # nothing of the program left
        os.killpg(command["pgid"], 0)
    assert not list(save.glob("**/metrics.jsonl"))  # no project metrics file: Oat's own printed rows
