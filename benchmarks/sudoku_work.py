"""Sudoku: which step of a worked move a run's policy gets wrong (`demo:board_rules_worked`'s format).

    python -m benchmarks sudoku-work RUN_DIR

A worked move is "2 3: row 1 4, column 2, box 1 2 4; lacks 3. \\boxed{2 3 3}": the chosen cell's line of the
prompt's `{board_view}`, the digits 1-4 that line leaves, then the move. Reads RUN_DIR/episodes.jsonl
(`--log-episodes`) and prints, per iteration, the share of turns where each step holds:

* form: the response has that shape;
* copied: the line is exactly the prompt's line for that cell (a cell the view lists, copied without a slip);
* lacks (as written): the digits named are those the written line leaves out (the step on the model's own copy);
* lacks (the cell's): they are those the prompt's line for that cell leaves out, what the rules allow there;
* follows: the move is on the written cell with a digit the work named.

A move is right (a placement) when the cell is empty and its digit is the solution's; on an easy board that is
nearly always the case when "lacks (the cell's)" names one digit (docs/environments.md: the rules with cells in
random order score 0.998). Where the steps fail tells whether to train the copy or the rule.
"""

from __future__ import annotations

import re
from collections import defaultdict

from benchmarks.logged import logged_episodes
from oat_dppo.cli import stdout_may_close

WORKED = re.compile(r"^((\d) (\d): row [-\d ]+, column [-\d ]+, box [-\d ]+); lacks ([\d ]+)\. "
                    r"\\boxed\{(\d) (\d) (\d)\}")
STEPS = ("form", "copied", "lacks_written", "lacks_cell", "follows")


def left_out(line: str, digits: int = 4) -> list[int]:
    """The digits 1..digits a view line ("2 3: row 1 4, column 2, box 1 2 4") does not name."""
    named = {int(d) for d in line.split(":", 1)[1].replace(",", " ").split() if d.isdigit()}
    return [d for d in range(1, digits + 1) if d not in named]


def check(prompt: str, response: str) -> dict[str, bool]:
    """Which steps of one worked move hold (module docstring); all False where the form does not."""
    found = WORKED.match(response.strip())
    if not found:
        return dict.fromkeys(STEPS, False)
    line, r, c, lacks, move_r, move_c, digit = found.groups()
    named = [int(d) for d in lacks.split()]
    shown = re.search(rf"\n({r} {c}: [^\n]*)\n", prompt)  # the prompt's own line for the written cell
    return {"form": True, "copied": f"\n{line}\n" in prompt, "lacks_written": named == left_out(line),
            "lacks_cell": bool(shown) and named == left_out(shown.group(1)),
            "follows": (move_r, move_c) == (r, c) and int(digit) in named}


def by_iteration(episodes: list[dict]) -> dict[int, tuple[int, dict[str, float]]]:
    """iteration -> (turns, share of turns per step)."""
    counts: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(STEPS, 0))
    turns: dict[int, int] = defaultdict(int)
    for e in episodes:
        for t in e["turns"]:
            turns[e["iteration"]] += 1
            for step, held in check(t["prompt"], t["response"]).items():
                counts[e["iteration"]][step] += held
    return {i: (n, {s: counts[i][s] / n for s in STEPS}) for i, n in sorted(turns.items())}


def main(argv: list[str]) -> int:
    read = logged_episodes("sudoku-work", __doc__, "Sudoku, worked moves", argv)
    if isinstance(read, int):
        return read
    run_dir, episodes = read
    with stdout_may_close():
        print(f"{len(episodes)} logged episodes of {run_dir}\n")
        print("| iteration | turns | form | copied | lacks (as written) | lacks (the cell's) | follows |")
        print("|---|---|---|---|---|---|---|")
        for i, (n, share) in by_iteration(episodes).items():
            print(f"| {i} | {n} | " + " | ".join(f"{share[s]:.2f}" for s in STEPS) + " |")
    return 0
