"""Two learner ranks holding responses of unequal length take the step one rank takes on all of them, in
every aggregation mode (`UpdateHooks.normalizers`: the step's token and sequence counts are reduced
over the ranks before they normalize the loss; DeepSpeed then averages the ranks' gradients).

Real processes, a real gloo group, real `DPPOLearner`s in DeepSpeed engines (tests/helpers/oat_ranks.py).
The same run with the reduction undone (each rank normalizing by its own counts, as the learner did
before) is the control: under token_mean it misses the single-rank step by far more than the tolerance,
so the comparison can fail. The seq_* modes count rows, and every rank holds the same number of rows
of a step (args.finalize requires it), so for them the control agrees too.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("oat") is None or importlib.util.find_spec("deepspeed") is None:
    pytest.skip("Oat's stack is .venv-oat (`make setup-oat`)", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
from oat_ranks import MODES  # noqa: E402

HELPER = Path(__file__).parent / "helpers" / "oat_ranks.py"
# float32 sums in another order and micro-batch split; a per-rank normalizer is off by ~1e-2 and more
TOLERANCE = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(world: int, out: Path, helper: Path = HELPER) -> None:
    """`helper`'s ranks, each in its own process, joined over loopback; a rank that waits on a collective the
    others never join does not end (the timeout fails the test)."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(helper), str(r), str(world), str(port), str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    for p in procs:
        text, _ = p.communicate(timeout=900)
        assert p.returncode == 0, text[-4000:]


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    out = tmp_path_factory.mktemp("aggregation")
    _ranks(1, out)
    _ranks(2, out)
    tokens = [torch.load(out / f"tokens2_{r}.pt") for r in range(2)]
    return torch.load(out / "world1.pt"), torch.load(out / "world2.pt"), tokens


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_the_ranks_hold_unequal_token_counts(steps):
    _, _, tokens = steps
    short, long = tokens[0][("token_mean", "fixed")], tokens[1][("token_mean", "fixed")]
    assert long > 3 * short, (short, long)


@pytest.mark.parametrize("mode", MODES)
def test_two_ranks_take_the_single_rank_step(steps, mode):
    single, two, _ = steps
    ref, got = single[(mode, "fixed")], two[(mode, "fixed")]
    assert _max_diff(ref["params"], got["params"]) < TOLERANCE
    assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)


def test_per_rank_token_counts_miss_the_single_rank_step(steps):
    """The control: what the comparison above catches (the learner before the reduction)."""
    single, two, _ = steps
    ref, wrong = single[("token_mean", "fixed")], two[("token_mean", "per_rank")]
    assert _max_diff(ref["params"], wrong["params"]) > 100 * TOLERANCE
    assert abs(wrong["grad_norm"] - ref["grad_norm"]) > 1e-2 * ref["grad_norm"]


# ---------------------------------------------------------------------------------------------
# Whole episodes of unequal length on the ranks (tests/helpers/oat_episode_ranks.py)
# ---------------------------------------------------------------------------------------------

EPISODE_HELPER = Path(__file__).parent / "helpers" / "oat_episode_ranks.py"


@pytest.fixture(scope="module")
def episode_rounds(tmp_path_factory):
    out = tmp_path_factory.mktemp("episodes")
    _ranks(1, out, EPISODE_HELPER)
    _ranks(2, out, EPISODE_HELPER)
    turns = [torch.load(out / f"turns2_{r}.pt") for r in range(2)]
    return torch.load(out / "world1.pt"), torch.load(out / "world2.pt"), turns


def test_the_ranks_episodes_differ_4x_in_tokens_and_balancing_evens_them(episode_rounds):
    _, _, tokens = episode_rounds
    short, long = tokens[0][(0, "unbalanced")], tokens[1][(0, "unbalanced")]
    assert long > 3 * short, (short, long)  # as the actors sent them
    short, long = tokens[0][(0, "balanced")], tokens[1][(0, "balanced")]
    assert max(short, long) < 1.3 * min(short, long), (short, long)  # after the trade by tokens


@pytest.mark.parametrize("variant", ["balanced", "unbalanced"])
@pytest.mark.parametrize("stage", [0, 2, 3])
def test_two_ranks_of_unequal_episodes_take_the_single_rank_step(episode_rounds, stage, variant):
    single, two, _ = episode_rounds
    ref, got = single["saved"][(stage, variant)], two["saved"][(stage, variant)]
    assert _max_diff(ref["params"], got["params"]) < TOLERANCE
    assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)


def test_several_steps_of_unequal_micro_batches_end_on_every_rank(episode_rounds):
    """Steps of 2 episodes (1 turn against 4 on a rank): every rank ends with the same optimizer steps."""
    _, two, _ = episode_rounds
    for stage in (0, 2, 3):
        steps = [rank[(stage, "steps")] for rank in two["steps_per_rank"]]
        assert steps[0] == steps[1] == 4.0, (stage, steps)
        # 4 SGD steps at lr 0.5 from weights of at most 1 in size; ZeRO-3 on gloo without the CPU stand-in P8
        # (oat_dppo/patches.py) left weights of 1e28 or NaN now and then
        weights = two["saved"][(stage, "steps")]["params"].values()
        assert max(float(w.abs().max()) for w in weights) < 2.0, stage
