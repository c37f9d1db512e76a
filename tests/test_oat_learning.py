"""Oat's program learns, in every shape it runs in: 1 actor + 1 learner and 2 + 2, ZeRO-2 and ZeRO-3, each
lands in the band the local backend reaches on the same problem (Oat's own issue #69 is a policy that does
not learn under ZeRO-2 on one GPU: this is the test that catches that class of fault).

The problem: smoke:digits with one turn per episode (the reward is the share of digits in the reply; a
random tiny model writes ~4%), tiny-qwen3 in float32, 16 episodes a round in groups of 4, one optimizer
step a round at lr 3e-3, 20 rounds. One turn, because on multi-turn environments the Oat actor sends a
uniform sample of exactly slots x group size turns (Oat's batch arithmetic), half of a two-turn round,
where the local backend trains on every turn: the same options then take other updates.

The measure: mean rollout reward of the last 5 rounds minus the first 5, against the local backend's rise
on the same settings. It must be able to fail: the local backend at learning rate 1e-8, the same program
that does not learn, is measured beside it and must fall outside the band.
Curves: runs/oat_learning/curves.csv (`make oat-learning` copies them to docs/results/, docs/oat.md).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("launchpad", reason="Oat's stack is .venv-oat (`make setup-oat`)")
pytest.importorskip("oat.interface")

from helpers.child import child_env  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 20
PROBLEM = ["--env", "smoke:digits", "--max-turns", "1", "--model", "tiny-qwen3", "--dtype", "float32",
           "--group-size", "4", "--max-new-tokens", "8", "--iterations", str(ROUNDS), "--episodes-per-iteration", "16",
           "--aggregation", "token_mean", "--seed", "0"]
OAT = ["--backend", "oat", "--no-flash-attn", "--shm-size-mb", "200", "--eval-episodes", "0", "--train-batch-size",
       "16", "--check-sync", "off"]
LOCAL = ["--backend", "local", "--engine", "hf", "--eval-every", "0", "--mini-batch-size", "16", "--micro-batch-size",
         "4", "--threads", "1", "--no-progress"]
SHAPES = {  # name -> Oat options
    "oat 1+1 zero2": ["--gpus", "2", "--zero-stage", "2", "--train-batch-size-per-device", "4"],
    "oat 1+1 zero3": ["--gpus", "2", "--zero-stage", "3", "--train-batch-size-per-device", "4"],
    "oat 2+2 zero2": ["--gpus", "4", "--zero-stage", "2", "--train-batch-size-per-device", "4"],
    "oat 2+2 zero3": ["--gpus", "4", "--zero-stage", "3", "--train-batch-size-per-device", "4"],
}
# A shape learns when its rise is at least this share of the local backend's (and the local rise is real).
BAND = 0.5
OUT = REPO / "runs" / "oat_learning"


def run(name: str, argv: list[str]) -> list[float]:
    """The run's rollout reward per round."""
    run_dir = OUT / name.replace(" ", "_").replace("+", "p")
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    proc = subprocess.run([sys.executable, "-m", "oat_dppo.main", *PROBLEM, *argv, "--run-dir", str(run_dir)],
                          capture_output=True, text=True, errors="replace", env=child_env(), timeout=1200,
                          cwd=REPO)
    assert proc.returncode == 0, f"{name}:\n{(proc.stdout + proc.stderr)[-3000:]}"
    files = sorted(run_dir.glob("metrics.jsonl")) + sorted(run_dir.glob("*/metrics.jsonl"))
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    rewards = [r["rollout/reward_mean"] for r in rows if "rollout/reward_mean" in r]
    assert len(rewards) == ROUNDS, (name, rewards)
    return rewards


def rise(rewards: list[float]) -> float:
    return sum(rewards[-5:]) / 5 - sum(rewards[:5]) / 5


@pytest.fixture(scope="module")
def curves():
    OUT.mkdir(parents=True, exist_ok=True)
    out = {"local": run("local", LOCAL + ["--learning-rate", "3e-3"]),
           "local lr 1e-8 (does not learn)": run("local_lr1e-8", LOCAL + ["--learning-rate", "1e-8"])}
    for name, argv in SHAPES.items():
        out[name] = run(name, OAT + argv + ["--learning-rate", "3e-3"])
    with (OUT / "curves.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["round", *out])
        for i in range(ROUNDS):
            w.writerow([i + 1, *(f"{out[k][i]:.4f}" for k in out)])
    return out


def learns(curves, name: str) -> bool:
    return rise(curves[name]) >= BAND * rise(curves["local"])


def test_the_local_backend_learns_and_the_measure_can_fail(curves):
    assert rise(curves["local"]) > 0.25, curves["local"]
    assert not learns(curves, "local lr 1e-8 (does not learn)"), curves["local lr 1e-8 (does not learn)"]


@pytest.mark.parametrize("name", list(SHAPES))
def test_oats_program_learns_as_the_local_backend_does(curves, name):
    assert learns(curves, name), (name, round(rise(curves[name]), 3), round(rise(curves["local"]), 3), curves[name])
