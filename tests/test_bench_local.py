"""Smoke test of the local-backend benchmark (`python -m benchmarks local`): tiny model, seconds."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks import __main__ as bench_main
from benchmarks import local


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_local_benchmark_numbers_and_table(keep_threads):
    cfg = local.Config(model="tiny-qwen3", env="game:GuessTheNumber-v0-easy", episodes=2, iterations=1, warmup=0,
                       max_new_tokens=8, reps=1)
    rows = local.run(cfg)
    assert len(rows) == 1
    r = rows[0]
    for key in ("wall", "episodes_per_s", "generated_tok_s", "trained_tok_s", "generate_s", "forward_s", "backward_s",
                "optimizer_s", "cmp_learner_tok_s", "cmp_bare_tok_s", "cmp_bare_full_tok_s", "learner_vs_bare"):
        assert math.isfinite(r[key]) and r[key] > 0, (key, r[key])
    assert r["episodes"] == 2 and r["cmp_steps"] == 1 and r["cmp_micro_batches"] == 1
    # the pieces are disjoint parts of the wall time
    assert 0 <= r["outside_share"] < 1
    assert r["generate_s"] + r["forward_s"] + r["backward_s"] + r["optimizer_s"] + r["outside_s"] == pytest.approx(r["wall"])
    assert r["rest_s"] >= -1e-6
    # the learner's timing hook reported the pieces that explain the rest too
    assert r["collate_s"] > 0 and r["trust_region_s"] > 0 and r["env_s"] > 0

    table = local.format_table(rows, cfg)
    assert "| tiny-qwen3 | game:GuessTheNumber-v0-easy |" in table
    assert "learner / bare" in table and "outside" in table
    assert table.count("\n|---") == 3  # throughput, time shares, learner vs bare
    assert r["learner_vs_bare_cpu"] > 0 and r["cmp_learner_cpu_s"] > 0


def test_local_benchmark_is_registered_and_checks_models(capsys):
    assert bench_main.BENCHMARKS["local"][0] == "benchmarks.local"
    assert local.main(["--model", "gpt-9"]) == 2
    assert "error: --model 'gpt-9': expected one of" in capsys.readouterr().err
    assert local.Config(model="both").models() == ["tiny-qwen3", "smollm2"]
    assert local.Config(env="a, b").envs() == ["a", "b"]


def test_local_benchmark_comparison_only(keep_threads):
    """--iterations 0: the comparison runs on the warm-up iteration's turns; only its table prints."""
    cfg = local.Config(model="tiny-qwen3", env="rg:arc_1d", episodes=2, iterations=0, warmup=1, max_new_tokens=4, reps=1)
    rows = local.run(cfg)
    assert rows[0]["cmp_learner_tok_s"] > 0 and rows[0]["cmp_turns"] == 2
    table = local.format_table(rows, cfg)
    assert table.count("\n|---") == 3 and table.count("| tiny-qwen3 | rg:arc_1d |") == 1


@pytest.mark.parametrize("name", ["local", "oat", "trust-region", "head", "engine", "gpu", "peers"])
def test_every_benchmark_explains_each_option_in_help(name, capsys):
    """One option per Config field, each with its help text and default."""
    import dataclasses
    import importlib

    module = importlib.import_module(bench_main.BENCHMARKS[name][0])
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m benchmarks {name} ")
    flat = " ".join(out.replace("│", " ").split())  # the help box wraps lines
    for f in dataclasses.fields(module.Config):
        assert f"--{f.name.replace('_', '-')}" in flat
        help_ = f.metadata.get("help")
        if help_:  # else a docstring under the field (bench gpu)
            assert " ".join(help_.split())[:40] in flat, f.name


def test_head_benchmark_measures_the_chunked_head_against_one_block(keep_threads, capsys):
    """`bench head`: one-block baseline always first; checkpointed blocks allocate smaller tensors."""
    from benchmarks import head

    cfg = head.Config(vocab=2048, hidden=32, tokens=128, sequences=2, prompt=8, chunks="32", reps=1, warmup=0)
    rows = head.run(cfg)
    assert [r["chunk"] for r in rows] == [0, 32]
    base, chunked = rows
    assert base["cpu_ratio"] == 1.0 and chunked["cpu"] > 0
    # the largest tensor is a [rows, V] float32 block: all 128 response rows at once, or 32
    assert base["largest"] == 128 * 2048 * 4 and chunked["largest"] == 32 * 2048 * 4
    assert chunked["peak"] is None or chunked["peak"] > 0
    table = head.format_table(rows, cfg, 128)
    assert "| one block (0) |" in table and "| 32 |" in table and "<= 1.35" in table
    assert bench_main.BENCHMARKS["head"][0] == "benchmarks.head"
    for bad in ("a,b", "-5", ""):
        assert head.main(["--chunks", bad]) == 2
        assert "error: --chunks" in capsys.readouterr().err


def _double(x):
    return 2 * x


def _fail(x):
    raise ValueError(f"child failed on {x}")


def _vanish(x):
    import os

    os._exit(3)  # as the OOM killer would: no exception, no result


def test_in_fresh_process_returns_the_result_or_raises_when_the_child_dies(capfd):
    from benchmarks.memory import in_fresh_process

    assert in_fresh_process(_double, 21) == 42
    with pytest.raises(RuntimeError, match=r"_fail died in its child process \(exit code 1"):
        in_fresh_process(_fail, 7, timeout=120)
    assert "child failed on 7" in capfd.readouterr().err
    with pytest.raises(RuntimeError, match=r"_vanish died in its child process \(exit code 3"):
        in_fresh_process(_vanish, 0, timeout=120)


def test_packing_benchmark_runs_and_packs_chat_episodes(capsys):
    """`python -m benchmarks packing` on a tiny model: a packed layout with fewer rows and fewer tokens."""
    from benchmarks import packing

    assert packing.main(["--model", "tiny-qwen3", "--envs", "smoke:digits", "--episodes", "2", "--reps", "1",
                         "--trainable-layers", "0", "--max-new-tokens", "4", "--response-prefix", ""]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| smoke:digits")]
    assert len(row) == 1
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    per_turn_rows, packed_rows = (int(x) for x in cells[4].split(" / "))
    per_turn_tokens, packed_tokens = (float(x) for x in cells[5].split(" / "))
    assert packed_rows == 2 < per_turn_rows == 4 and packed_tokens < per_turn_tokens


def test_layouts_benchmark_times_every_layout_on_real_turns(capsys):
    """`python -m benchmarks layouts` on a tiny model: one row per env, a time for each layout, a padded share
    and the tokens "prefix" computes."""
    from benchmarks import layouts

    assert layouts.main(["--model", "tiny-qwen3", "--envs", "smoke:digits", "--episodes", "3", "--reps", "1",
                         "--trainable-layers", "0", "--max-new-tokens", "4", "--response-prefix", ""]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| smoke:digits")]
    assert len(row) == 1
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    assert int(cells[1]) > 0 and 0.0 <= float(cells[3]) < 1.0 and float(cells[4]) > 0
    times = cells[5].split(" / ") + cells[6].split(" / ")  # padded / rows / packed / prefix, fwd+bwd then fwd
    assert len(times) == 8 and all(float(x) > 0 for x in times)


def test_layouts_benchmark_shuffled_order_shares_fewer_prefixes(capsys):
    """`--order shuffled` (stock Oat's plan: no sort) cuts micro-batches that mix groups, so "prefix" computes
    more tokens per real token than on micro-batches sorted by tokens, where a group's samples sit together."""
    from benchmarks import layouts

    computed = {}
    for order in ("sorted", "shuffled"):
        assert layouts.main(["--model", "tiny-qwen3", "--envs", "smoke:digits", "--episodes", "8", "--group-size", "2",
                             "--micro-batch-size", "2", "--order", order, "--reps", "1", "--trainable-layers", "0",
                             "--max-new-tokens", "4", "--response-prefix", ""]) == 0
        out = capsys.readouterr().out
        assert ("random order" in out) == (order == "shuffled")
        row = [line for line in out.splitlines() if line.startswith("| smoke:digits")][0]
        computed[order] = float(row.strip("|").split("|")[4])
    assert computed["sorted"] < computed["shuffled"]
