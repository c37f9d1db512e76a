"""`python -m benchmarks sums-work`: which step of a worked addition holds, by hand and on a run's log."""

from __future__ import annotations

import json
from collections import Counter

from benchmarks.sums_work import check, main, tally


def test_sums_work_names_the_step_a_worked_sum_gets_wrong():
    prompt = ("Question: Calculate 8684 + 475.\n\n"
              "Please reason step by step, and put your final answer within \\boxed{}.")
    right = "4 + 5 = 9: 9. 8 + 7 = 15: 59. 6 + 4 + 1 = 11: 159. 8 + 0 + 1 = 9: 9159. \\boxed{9159}"
    steps, held = check(prompt, right)
    assert steps == Counter(columns=4, digits=4, carry=4, sum=4, written=4)
    assert held == {"form": True, "follows": True, "right": True, "places": False}
    # one wrong one-digit sum (6 + 4 + 1 = 12), its result copied on: only that column's sum, and the answer
    wrong_sum = "4 + 5 = 9: 9. 8 + 7 = 15: 59. 6 + 4 + 1 = 12: 259. 8 + 0 + 1 = 9: 9259. \\boxed{9259}"
    steps, held = check(prompt, wrong_sum)
    assert steps == Counter(columns=4, digits=4, carry=4, sum=3, written=4)
    assert held == {"form": True, "follows": True, "right": False, "places": False}
    # a digit copied from the wrong place, a carry dropped, a result miscopied, a box that does not follow
    sloppy = "4 + 5 = 9: 9. 6 + 7 = 13: 39. 6 + 4 = 10: 039. 8 + 0 + 1 = 9: 9039. \\boxed{9159}"
    steps, held = check(prompt, sloppy)
    assert steps == Counter(columns=4, digits=3, carry=3, sum=4, written=4)
    assert held == {"form": True, "follows": False, "right": True, "places": False}
    steps, held = check(prompt, "\\boxed{9159}")  # the answer without its work
    assert steps == Counter() and held == {"form": False, "follows": False, "right": True, "places": False}
    # demo:addition_places's format: the columns are judged as before, the numbers written by place as a property
    places = ("8684 is 8 thousands, 6 hundreds, 8 tens, 4 ones. 475 is 0 thousands, 4 hundreds, 7 tens, 5 ones. "
              "ones: 4 + 5 = 9: 9. tens: 8 + 7 = 15: 59. hundreds: 6 + 4 + 1 = 11: 159. "
              "thousands: 8 + 0 + 1 = 9: 9159. \\boxed{9159}")
    steps, held = check(prompt, places)
    assert steps == Counter(columns=4, digits=4, carry=4, sum=4, written=4) and all(held.values())
    # the places right, a column's digits not found by name (tens took 6 and 4 from the hundreds)
    steps, held = check(prompt, places.replace("tens: 8 + 7 = 15: 59.", "tens: 6 + 4 = 10: 09."))
    assert steps["digits"] == 3 and held["places"]
    steps, held = check(prompt, places.replace("7 tens", "5 tens"))  # a number miswritten by place
    assert not held["places"]
    assert check("Question: Calculate 1 - 2.", right) is None
    episodes = [{"turns": [{"prompt": prompt, "response": r}]} for r in (right, wrong_sum)]
    steps, held, answers = tally(episodes)
    assert answers == 2 and steps["sum"] == 7 and held["right"] == 1


def test_the_command_reads_a_runs_logged_answers(tmp_path, capsys):
    prompt = "Question: Calculate 95 + 7.\n\nPlease reason step by step, and put your final answer within \\boxed{}."
    turns = [{"prompt": prompt, "response": "5 + 7 = 12: 2. 9 + 0 + 1 = 10: 102. \\boxed{102}"},
             {"prompt": prompt, "response": "5 + 7 = 12: 2. 9 + 0 = 9: 92. \\boxed{92}"}]  # the carry dropped
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps({"iteration": 0, "turns": [t]}) + "\n" for t in turns))
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 4 | 1.00 | 0.75 | 1.00 | 1.00 |" in out  # columns, digits, carry, sum, written
    assert "| 2 | 1.00 | 1.00 | 0.50 | 0.00 |" in out  # answers, form, follows, right, places
    assert main([str(tmp_path / "nothing")]) == 2
