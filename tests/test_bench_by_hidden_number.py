"""`python -m benchmarks by-hidden-number`: a run's logged GuessTheNumber episodes split by hidden number."""

from __future__ import annotations

import json

import pytest

gem = pytest.importorskip("gem")

from benchmarks.by_hidden_number import by_number, guesses, hidden_number, main  # noqa: E402

ENV = "game:GuessTheNumber-v0-easy"


def episode(seed: int, responses: list[str], won: bool) -> dict:
    return {"iteration": 0, "seed": seed, "return": 1.0 if won else 0.0, "error": None,
            "turns": [{"response": r} for r in responses]}


def test_episodes_are_split_by_the_number_the_env_hid():
    env = gem.make(ENV)
    seeds = list(range(40))
    numbers = [hidden_number(env, s) for s in seeds]
    assert numbers == [hidden_number(env, s) for s in seeds] and len(set(numbers)) > 3  # the env's own draw, repeatable
    # lose every game whose number is the first seed's, win the rest
    lost = numbers[0]
    eps = [episode(s, ["\\boxed{5}", "\\boxed{7"], n != lost) for s, n in zip(seeds, numbers)]
    table = by_number(eps, lambda seed: hidden_number(env, seed))
    assert table[lost][1] == 0.0 and all(rate == 1.0 for n, (_, rate, _) in table.items() if n != lost)
    assert sum(count for count, _, _ in table.values()) == len(seeds)
    assert table[lost][2][0] == ("5 7", numbers.count(lost))  # an unclosed brace still reads as the guess
    assert guesses(episode(0, ["no guess"], False)) == "?"


def test_main_prints_the_table_and_refuses_other_envs(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env": ENV}))
    (run / "episodes.jsonl").write_text("\n".join(json.dumps(episode(s, ["\\boxed{5}"], False)) for s in range(5)))
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "| hidden number | episodes | success |" in out and "0.00" in out
    (run / "config.json").write_text(json.dumps({"env": "game:Sudoku-v0-easy"}))
    assert main([str(run)]) != 0
    assert main([str(tmp_path / "missing")]) != 0
