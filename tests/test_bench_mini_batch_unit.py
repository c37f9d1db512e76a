"""Smoke test of `python -m benchmarks mini-batch-unit`: a tiny model on real math questions, seconds."""

from __future__ import annotations

import pytest
import torch

from benchmarks import mini_batch_unit


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_whole_groups_compute_fewer_tokens_in_as_many_steps(keep_threads, capsys):
    """Two groups of 4 samples, steps of 4 episodes: whole groups run each prompt once per micro-batch; shuffled
    turns split the groups. The table prints both units."""
    from oat_dppo.models import load_policy

    cfg = mini_batch_unit.Config(model="tiny-qwen3", episodes=8, group_size=4, mini_batch_size=4, micro_batch_size=4,
                                 max_new_tokens=6, reps=1)
    model, tok = load_policy(cfg.model, seed=0)
    u = mini_batch_unit.measure(cfg, model, tok)["units"]
    assert u["turns"]["steps"] == u["groups"]["steps"] == 2
    assert u["groups"]["tokens"][0] < u["turns"]["tokens"][0]
    assert mini_batch_unit.main(["--model", "tiny-qwen3", "--episodes", "8", "--group-size", "4",
                                 "--mini-batch-size", "4", "--micro-batch-size", "4", "--max-new-tokens", "6",
                                 "--reps", "1", "--trainable-layers", "0"]) == 0
    table = capsys.readouterr().out
    assert "| turns | 2 |" in table and "| groups | 2 |" in table


def test_counts_that_split_a_group_and_options_given_twice_are_refused(keep_threads, capsys):
    assert mini_batch_unit.main(["--model", "tiny-qwen3", "--episodes", "6", "--group-size", "4"]) == 2
    assert mini_batch_unit.main(["--model", "tiny-qwen3", "--trainable-layers", "0", "--env-option", "max_value=10",
                                 "--env-option", "max_value=20"]) == 2
    assert "max_value is given twice" in capsys.readouterr().err
    assert mini_batch_unit.main(["--model", "tiny-qwen3"]) == 2  # 6 trainable layers of its 4
    assert "the model has only 4 layers" in capsys.readouterr().err
