"""`python -m benchmarks sudoku-work`: which step of a worked Sudoku move holds, per iteration."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("gem")

from benchmarks.sudoku_work import by_iteration, check, left_out, main  # noqa: E402
from oat_dppo.agent.demonstrations import DEMONSTRATORS  # noqa: E402
from oat_dppo.envs.registry import make_env  # noqa: E402


def prompts(n: int) -> list[str]:
    env = make_env("game:Sudoku-v0-easy", seed=0, history="last", obs_suffix="\n{board_view}\nAnswer.")
    return [env.reset(seed=s)[0] for s in range(n)]


def test_the_rules_players_work_holds_at_every_step_and_each_slip_is_caught_where_it_happens():
    worked = DEMONSTRATORS["board_rules_worked"].act
    rng = random.Random(0)
    for prompt in prompts(8):
        response = worked(prompt, rng)
        assert all(check(prompt, response).values()), response
        line = response.split(";")[0]
        # a slip in the copy: a digit the line names dropped from it, the rest of the work done on the copy
        dropped = next(d for d in range(1, 5) if d not in left_out(line))
        head, units = line.split(": ")
        slipped = head + ": " + ", ".join(
            name + " " + (" ".join(x for x in digits.split() if x != str(dropped)) or "-")
            for name, digits in (u.split(" ", 1) for u in units.split(", ")))
        move = response.split(". ", 1)[1]
        r, c = line.split(":")[0].split()
        lacks = " ".join(map(str, left_out(slipped)))
        on_copy = f"{slipped}; lacks {lacks}. \\boxed{{{r} {c} {left_out(slipped)[0]}}}"
        assert check(prompt, on_copy) == {"form": True, "copied": False, "lacks_written": True, "lacks_cell": False,
                                          "follows": True}
        # the copy right, the rule wrong: one more digit named than the line leaves
        extra = [d for d in range(1, 5) if d not in left_out(line)][0]
        wrong = f"{line}; lacks {' '.join(map(str, sorted(left_out(line) + [extra])))}. {move}"
        assert check(prompt, wrong)["copied"] and not check(prompt, wrong)["lacks_written"]
        assert not any(check(prompt, move).values())  # a bare move has no work to check


def test_main_prints_shares_per_iteration_and_refuses_a_run_without_episodes(tmp_path, capsys):
    rng = random.Random(1)
    worked = DEMONSTRATORS["board_rules_worked"].act
    ps = prompts(4)
    episodes = [{"iteration": 0, "turns": [{"prompt": p, "response": worked(p, rng)} for p in ps]},
                {"iteration": 1, "turns": [{"prompt": p, "response": "\\boxed{1 1 1}"} for p in ps[:2]]}]
    table = by_iteration(episodes)
    assert table[0] == (4, dict.fromkeys(table[0][1], 1.0)) and table[1] == (2, dict.fromkeys(table[1][1], 0.0))
    run = tmp_path / "run"
    run.mkdir()
    (run / "episodes.jsonl").write_text("\n".join(json.dumps(e) for e in episodes))
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "| 0 | 4 | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 |" in out and "| 1 | 2 | 0.00 |" in out
    assert main([str(tmp_path / "missing")]) != 0
