"""Sums in columns: which step of a worked addition a run's policy gets wrong (`demo:addition_worked`'s format, and
`demo:addition_places`'s, which names each column's place).

    python -m benchmarks sums-work RUN_DIR

A worked sum adds the columns ones first, each as "x + y (+ 1) = s: w." (its two digits, the carry, their sum, the
result so far), then the answer: "9 + 1 = 10: 0. 7 + 3 + 1 = 11: 10. 1 + 9 + 1 = 11: 110. 4 + 1 + 1 = 6: 6110.
\\boxed{6110}". Reads RUN_DIR/episodes.jsonl (`--log-episodes`) and prints, over the written columns of every
logged answer, the share of each step done rightly, each judged on what the answer itself wrote before it:

* digits: the column's two digits copied from the question (0 where a number is shorter);
* carry: "+ 1" written exactly where the column before summed to 10 or more;
* sum: s is the sum of the digits (and carry) the column wrote: a one-digit fact;
* written: w is s's last digit (the whole s in the last column) before the result so far: a copy;

and per answer: form (as many columns as the longer number has, then a box), follows (the box holds the last
result written), right (the box holds the sum: what the grader rewards) and places (both numbers written by their
places as `demo:addition_places` writes them, "4179 is 4 thousands, 1 hundreds, 7 tens, 9 ones."; never for the
other format, which writes none): places held with digits wrong is a column that did not find its digits by name. A reply of random digits gets a
column's digits right about 1 time in 100 and its sum 1 in 19; a column step that fails well above that names the
step the policy has not learned.
"""

from __future__ import annotations

import re
from collections import Counter

from benchmarks.logged import logged_episodes
from oat_dppo.cli import stdout_may_close
from oat_dppo_envs.math import TWO_TERM_SUM, column_addition_steps
from oat_dppo.envs.math_data import last_boxed

COLUMN = re.compile(r"(\d) \+ (\d)( \+ 1)? = (\d+): (\d+)\.")  # a place's name may stand before it
STEPS = ("digits", "carry", "sum", "written")
ANSWER_PROPERTIES = ("form", "follows", "right", "places")


def check(prompt: str, response: str) -> tuple[Counter, dict[str, bool]] | None:
    """({columns, and per step the columns done rightly}, {form, follows, right}) of one answer; None where the
    prompt states no two-term sum."""
    question = prompt.split("Question:", 1)[-1].split("Please reason", 1)[0]
    found = TWO_TERM_SUM.findall(question)
    if len(found) != 1:
        return None
    by_place = column_addition_steps(question, named_places=True)[0].split(". ")[:2]  # the two numbers' sentences
    a, b = found[0]
    width = max(len(a), len(b))
    a, b = a.zfill(width), b.zfill(width)
    columns, steps = COLUMN.findall(response), Counter()
    written_before, carry_in = "", False
    for i, (x, y, carried, total, written) in enumerate(columns):
        steps["columns"] += 1
        at = width - 1 - i  # this column's place in the question's numbers (ones first)
        steps["digits"] += at >= 0 and (x, y) == (a[at], b[at])
        steps["carry"] += bool(carried) == carry_in
        steps["sum"] += int(total) == int(x) + int(y) + bool(carried)
        last = i == len(columns) - 1
        steps["written"] += written == (total if last else total[-1]) + written_before
        written_before, carry_in = written, int(total) >= 10
    boxed = (last_boxed(response) or "").strip()
    held = {"form": len(columns) == width and boxed.isdigit(),
            "follows": bool(columns) and boxed == columns[-1][-1],
            "right": boxed.isdigit() and int(boxed) == int(a) + int(b),
            "places": all(sentence.rstrip(".") + "." in response for sentence in by_place)}
    return steps, held


def tally(episodes: list[dict]) -> tuple[Counter, Counter, int]:
    """(column steps summed over answers, answers per property held, answers)."""
    steps, answers_held, answers = Counter(), Counter(), 0
    for e in episodes:
        for t in e["turns"]:
            checked = check(t["prompt"], t["response"])
            if checked is None:
                continue
            answers += 1
            steps.update(checked[0])
            answers_held.update(k for k, ok in checked[1].items() if ok)
    return steps, answers_held, answers


def main(argv: list[str]) -> int:
    read = logged_episodes("sums-work", __doc__, "math:procedural two-term sums, worked answers", argv)
    if isinstance(read, int):
        return read
    run_dir, episodes = read
    steps, held, answers = tally(episodes)
    with stdout_may_close():
        print(f"{answers} logged answers of {run_dir}, {steps['columns']} written columns\n")
        print("| columns | " + " | ".join(STEPS) + " |\n|---|" + "---|" * len(STEPS))
        print(f"| {steps['columns']} | "
              + " | ".join(f"{steps[s] / max(steps['columns'], 1):.2f}" for s in STEPS) + " |")
        print("\n| answers | form | follows | right | places |\n|---|---|---|---|---|")
        print(f"| {answers} | " + " | ".join(f"{held[s] / max(answers, 1):.2f}" for s in ANSWER_PROPERTIES) + " |")
    return 0
