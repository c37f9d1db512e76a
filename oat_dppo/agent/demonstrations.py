"""Demonstrations for a warm start: episodes whose agent turns a supervised step imitates.

Three sources, each giving `Episode`s of `Turn`s with prompt and response token ids, as RL's rollouts do
(the same template, history and token budget), so the supervised steps run through the same learner:

* a scripted demonstrator, `demo:NAME` (`DEMONSTRATORS`), played through the agent loop by a
  `ScriptedEngine`: it is shown each turn's prompt text and nothing else, exactly what the model is shown,
  so it can read the replies and the board but never the hidden answer;
* the model's own rollouts, `self`: episodes it played that succeeded (`successful`);
* a JSONL file of episodes as conversations, one per line, the format of a run's `episodes.jsonl`:
  `{"turns": [{"prompt": "<the prompt text as the model saw it>", "response": "<the agent's reply>"}, ...]}`
  (`read_episodes`).

The guessing-game demonstrators read GEM's GuessTheNumber text ("between 1 and 10", "you guessed 5, and the
target number is higher than 5"); the Sudoku one reads the newest board a prompt shows.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from oat_dppo.agent.loop import PromptFormat
from oat_dppo.agent.metrics import SUCCESS_RETURN
from oat_dppo.agent.types import Episode, Turn
from oat_dppo.engine.base import Generation

_RANGE = re.compile(r"number between (\d+) and (\d+)")


def guess_range(prompt: str) -> tuple[int, int]:
    """The range GuessTheNumber's text states (1..100 where the prompt does not show it)."""
    found = _RANGE.search(prompt)
    return (int(found.group(1)), int(found.group(2))) if found else (1, 100)


def guess_interval(prompt: str) -> tuple[int, int]:
    """The targets GuessTheNumber's text still allows: its range, narrowed by every hint the prompt shows
    (read with the env package's own hint pattern, the one its feedback probe uses)."""
    from oat_dppo_envs.games import GUESS_THE_NUMBER  # noqa: PLC0415

    low, high = guess_range(prompt)
    for guess, direction in GUESS_THE_NUMBER._HINT.findall(prompt):
        g = int(guess)
        low, high = (max(low, g + 1), high) if direction == "higher" else (low, min(high, g - 1))
    return low, high if high >= low else low


def bisect(prompt: str, rng: random.Random) -> str:
    low, high = guess_interval(prompt)
    return f"\\boxed{{{(low + high) // 2}}}"


def random_reader(prompt: str, rng: random.Random) -> str:
    """A guess drawn uniformly from what the hints leave: reads every hint, plays no strategy."""
    low, high = guess_interval(prompt)
    return f"\\boxed{{{rng.randint(low, high)}}}"


def noisy_bisect(prompt: str, rng: random.Random) -> str:
    """The middle of the interval the hints leave one time in four, else a random guess inside it: reads every
    hint, weaker than the bisector (wins 0.83 on 1..10 in 4 turns, where bisecting wins every game)."""
    low, high = guess_interval(prompt)
    return f"\\boxed{{{(low + high) // 2 if rng.random() < 0.25 else rng.randint(low, high)}}}"


def blind_guesser(prompt: str, rng: random.Random) -> str:
    """A guess drawn uniformly from the whole range, hints ignored: the control a reply measure must fail."""
    low, high = guess_range(prompt)
    return f"\\boxed{{{rng.randint(low, high)}}}"


def blind_sweep(prompt: str, rng: random.Random) -> str:
    """The next number of the range not guessed yet, whatever the hints said: the best a player that ignores
    every reply can do (k distinct guesses win k / range; 0.4 on 1..10 in 4 turns). Reads its own earlier
    guesses from the prompt, never the directions."""
    from oat_dppo_envs.games import GUESS_THE_NUMBER  # noqa: PLC0415

    low, high = guess_range(prompt)
    guessed = {int(g) for g, _ in GUESS_THE_NUMBER._HINT.findall(prompt)}
    return f"\\boxed{{{next((n for n in range(low, high + 1) if n not in guessed), low)}}}"


def sudoku_random_empty(prompt: str, rng: random.Random) -> str:
    """A random empty cell of the newest board and a random digit: reads where the board is empty, never which
    digits its rows, columns and boxes hold (the Sudoku bound that does not use the rules)."""
    from oat_dppo_envs.games import SUDOKU  # noqa: PLC0415

    board = SUDOKU.board(prompt)
    empty = [(r, c) for r in range(len(board)) for c in range(len(board)) if board[r][c] == 0] or [(0, 0)]
    r, c = rng.choice(empty)
    return "\\boxed{%d %d %d}" % (r + 1, c + 1, rng.randint(1, len(board)))


def sudoku_allowed(board: list[list[int]], r: int, c: int) -> list[int]:
    """The digits cell (r, c) (0-based) allows: those its row, column and box do not hold yet."""
    from oat_dppo_envs.games import sudoku_units  # noqa: PLC0415 (the env package's own reading of a board)

    seen = set().union(*sudoku_units(board, r, c))
    return [d for d in range(1, len(board) + 1) if d not in seen]


def sudoku_options(board: list[list[int]]) -> dict[tuple[int, int], list[int]]:
    """Each empty cell (0-based) that allows a digit, with the digits it allows."""
    n = len(board)
    options = {(r, c): sudoku_allowed(board, r, c) for r in range(n) for c in range(n) if board[r][c] == 0}
    return {cell: digits for cell, digits in options.items() if digits}


def sudoku_rules_move(board: list[list[int]], rng: random.Random) -> tuple[int, int, int] | None:
    """An empty cell and a digit its row, column and box do not hold yet, the most constrained cell first
    (1-based row, column, digit); None where no empty cell allows a digit."""
    options = sudoku_options(board)
    if not options:
        return None
    fewest = min(len(d) for d in options.values())
    r, c = rng.choice([cell for cell, digits in options.items() if len(digits) == fewest])
    return r + 1, c + 1, rng.choice(options[(r, c)])


def sudoku_board_rules(prompt: str, rng: random.Random) -> str:
    from oat_dppo_envs.games import SUDOKU  # noqa: PLC0415 (the env package's own board reader)

    move = sudoku_rules_move(SUDOKU.board(prompt), rng) or (1, 1, 1)
    return "\\boxed{%d %d %d}" % move


def sudoku_board_rules_worked(prompt: str, rng: random.Random) -> str:
    """The rules player's move with its work shown before it: the chosen cell's line of `{board_view}` (the
    digits its row, column and box hold), the digits that leaves, then the move, e.g.
    "2 3: row 1 4, column 2, box 1 2 4; lacks 3. \\boxed{2 3 3}" (GEM reads the last `\\boxed{}`). Each
    step is a copy or a lookup a small model can imitate where the bare move is not (docs/warm_start.md)."""
    from oat_dppo_envs.games import SUDOKU, sudoku_cell_view  # noqa: PLC0415

    board = SUDOKU.board(prompt)
    move = sudoku_rules_move(board, rng)
    if move is None:
        return "\\boxed{1 1 1}"
    r, c, digit = move
    lacks = " ".join(map(str, sudoku_allowed(board, r - 1, c - 1)))
    return f"{sudoku_cell_view(board, r - 1, c - 1)}; lacks {lacks}. \\boxed{{{r} {c} {digit}}}"


ACRE_SAYS = {"off": "in an off trial", "blicket": "the one candidate of an on trial, a blicket",
             "unknown": "no evidence"}


def acre_worked(prompt: str, rng: random.Random) -> str:
    """ACRE's causal rules over the listed trials, each step written before the label: every test object with
    what the trials say of it (in a trial whose light stayed off; the one object of an "on" trial not ruled
    out; neither), then the label that follows, e.g. "gray rubber cube: in an off trial. red rubber cube: the
    one candidate of an on trial, a blicket. So on. \\boxed{on}". Reads the prompt only: its question, and on a
    retry (`--env-option attempts=N`) the grader's replies, answering a label they did not name."""
    from oat_dppo.envs.retry import named_wrong  # noqa: PLC0415
    from oat_dppo_envs.reasoning_gym import ACRE_LABELS, acre_evidence  # noqa: PLC0415 (the env package's own reading)

    evidence, label = acre_evidence(prompt.split("Question:", 1)[-1])
    steps = " ".join(f"{obj}: {ACRE_SAYS[kind]}." for obj, kind in evidence)
    wrong = named_wrong(prompt)  # answered again after the grader's reply (`--env-option attempts=N`)
    if label in wrong:
        label = next((other for other in ACRE_LABELS if other not in wrong), label)
        steps += f" Not {wrong[-1]}, the grader said."
    return f"{steps} So {label}. \\boxed{{{label}}}"


def acre_cited(prompt: str, rng: random.Random) -> str:
    """`acre_worked` with each verdict's evidence copied from the prompt first, so that every step is a copy or a
    short lookup (as Sudoku's worked demonstrator copies the cell's line): before each test object's verdict, the
    trial line that decides it, quoted, e.g.

        See: brown rubber cube → off. brown rubber cube: in an off trial.
        See: red rubber cube, red metal cylinder → on; red metal cylinder: in an off trial. red rubber cube: the one
        candidate of an on trial, a blicket.
        See: blue metal cylinder, gray metal sphere → on; gray metal sphere: not ruled out. blue metal cylinder: no
        evidence.   ("See: no trial." where no line holds the object)

    then "So LABEL. \\boxed{LABEL}". The off line cited is the first that holds the object; a blicket's, the on line
    where every other object is in an off trial; no evidence, the first on line that holds it and one of its other
    objects not ruled out. The verdicts and label are `acre_worked`'s (the same rules, `acre_evidence`)."""
    from oat_dppo_envs.reasoning_gym import (  # noqa: PLC0415
        acre_evidence, acre_line_objects, acre_trial, acre_trial_lines)

    question = prompt.split("Question:", 1)[-1]
    evidence, label = acre_evidence(question)
    lines = [(line, *acre_trial(line)) for line in acre_trial_lines(question)]
    ruled_out = set().union(*(objs for _, objs, outcome in lines if outcome == "off"))
    steps = []
    for obj, kind in evidence:
        holding = [(line, objs, outcome) for line, objs, outcome in lines if obj in objs]
        if kind == "off":
            cited = next(line for line, _, outcome in holding if outcome == "off")
        elif kind == "blicket":
            line = next(line for line, objs, outcome in holding if outcome == "on" and objs - ruled_out == {obj})
            others = [o for o in acre_line_objects(line) if o != obj]
            cited = "; ".join([line] + [f"{o}: {ACRE_SAYS['off']}" for o in others])
        else:
            open_on = [(line, o) for line, _, outcome in holding if outcome == "on"
                       for o in acre_line_objects(line) if o != obj and o not in ruled_out]
            cited = f"{open_on[0][0]}; {open_on[0][1]}: not ruled out" if open_on else "no trial"
        steps.append(f"See: {cited}. {obj}: {ACRE_SAYS[kind]}.")
    return f"{' '.join(steps)} So {label}. \\boxed{{{label}}}"


def equation_worked(prompt: str, rng: random.Random) -> str:
    """A linear equation's solution with its steps before the answer (reasoning-gym's simple_equations): the
    constants moved to the right, then the division, e.g. "25*c = 144 - 19 = 125. c = 125 / 25 = 5. \\boxed{5}";
    "\\boxed{0}" where the prompt states no such equation."""
    from oat_dppo_envs.math import linear_equation_steps  # noqa: PLC0415

    solved = linear_equation_steps(prompt.split("Question:", 1)[-1].split("Please reason", 1)[0])
    return f"{solved[0]} \\boxed{{{solved[1]}}}" if solved else "\\boxed{0}"


def addition_worked(prompt: str, rng: random.Random, named_places: bool = False) -> str:
    """A sum of two whole numbers added in columns, ones first, before the answer (reasoning-gym's basic_arithmetic
    with operators=+), e.g. "9 + 1 = 10: 0. 7 + 3 + 1 = 11: 10. ... 4 + 1 + 1 = 6: 6110. \\boxed{6110}";
    "\\boxed{0}" where the prompt states no such sum. named_places: each number by its places first, each column
    named ("4179 is 4 thousands, ... 9 ones. ... ones: 9 + 1 = 10: 0. ...")."""
    from oat_dppo_envs.math import column_addition_steps  # noqa: PLC0415

    question = prompt.split("Question:", 1)[-1].split("Please reason", 1)[0]
    solved = column_addition_steps(question, named_places=named_places)
    return f"{solved[0]} \\boxed{{{solved[1]}}}" if solved else "\\boxed{0}"


def copy_question(prompt: str, rng: random.Random) -> str:
    """The question's last line with an "=" (the equation) in the box, unsolved: a math blind bound that reads the
    question and solves nothing (the grader must not pass it)."""
    question = prompt.split("Question:", 1)[-1].split("Please reason", 1)[0]
    lines = [line.rsplit(":", 1)[-1].strip() for line in question.splitlines() if line.strip()]
    return f"\\boxed{{{next((line for line in reversed(lines) if '=' in line), lines[-1] if lines else '')}}}"


# simple_equations at max_value=10: every answer is 1..10; the commonest in its 1,000-question training pool is 3
# (114 of them, 9 at 111): a player that answers it whatever the question is the blind bound there.
EQUATION_COMMONEST_ANSWER = 3


def equation_prior(prompt: str, rng: random.Random) -> str:
    """The commonest answer of small linear equations (`EQUATION_COMMONEST_ANSWER`), the question unread."""
    return f"\\boxed{{{EQUATION_COMMONEST_ANSWER}}}"


# simple_equations at max_value=10, size=4000 (the retry cell's pool): the answers of 3,000 draws of its training
# split, commonest first (353 to 263 each: near uniform, so any order scores about as well on held-out questions).
EQUATION_ANSWERS_BY_COUNT = (6, 9, 4, 2, 7, 10, 3, 8, 5, 1)


def equation_sweep(prompt: str, rng: random.Random) -> str:
    """The commonest answer of small linear equations that no reply has refused yet (`EQUATION_ANSWERS_BY_COUNT`),
    the question unread: with `--env-option attempts=k`, k distinct answers, so about k / 10 of questions (the
    retry task's blind bound). Reads only the grader's replies to its own earlier answers."""
    from oat_dppo.envs.retry import named_wrong  # noqa: PLC0415

    refused = set(named_wrong(prompt))
    answer = next((a for a in EQUATION_ANSWERS_BY_COUNT if str(a) not in refused), EQUATION_ANSWERS_BY_COUNT[0])
    return f"\\boxed{{{answer}}}"


def arc_worked(prompt: str, rng: random.Random) -> str:
    """Arc1D: the rule of reasoning-gym's arc_1d families that fits every example (`ARC_RULES`) named, then applied
    to the test input, e.g. "Rule: shift right by 2. \\boxed{0 0 3 3 0}"; where no known rule fits, it says so and
    copies the input ("Rule: unknown.")."""
    from oat_dppo_envs.reasoning_gym import arc_rows, arc_rule  # noqa: PLC0415

    examples, test = arc_rows(prompt)
    found = arc_rule(examples)
    if found is None or not test:
        return f"Rule: unknown. \\boxed{{{' '.join(test)}}}"
    name, rule = found
    return f"Rule: {name}. \\boxed{{{' '.join(map(str, rule([int(x) for x in test])))}}}"


def arc_copy_input(prompt: str, rng: random.Random) -> str:
    """Arc1D's test input unchanged: reads the input, not the rule (the blind bound)."""
    from oat_dppo_envs.reasoning_gym import arc_rows  # noqa: PLC0415

    return f"\\boxed{{{' '.join(arc_rows(prompt)[1])}}}"


@dataclass(frozen=True)
class Demonstrator:
    act: Callable[[str, random.Random], str]  # (prompt text, rng) -> the response text
    env_prefix: str  # the env ids it plays: those starting with this
    description: str


DEMONSTRATORS: dict[str, Demonstrator] = {
    "bisect": Demonstrator(bisect, "game:GuessTheNumber", "the middle of the interval the hints leave (optimal)"),
    "random_reader": Demonstrator(random_reader, "game:GuessTheNumber",
                                  "a random guess inside the interval the hints leave"),
    "noisy_bisect": Demonstrator(noisy_bisect, "game:GuessTheNumber",
                                 "the middle of the hints' interval one time in four, else a random guess inside it"),
    "blind_guesser": Demonstrator(blind_guesser, "game:GuessTheNumber", "a random guess, hints ignored"),
    "blind_sweep": Demonstrator(blind_sweep, "game:GuessTheNumber",
                                "the next number not guessed yet, hints ignored (the best blind player)"),
    "acre_worked": Demonstrator(acre_worked, "rg:acre",
                                "ACRE's rules over the trials, each test object's evidence written before the label"),
    "acre_cited": Demonstrator(acre_cited, "rg:acre",
                               "acre_worked with the trial line behind each verdict quoted from the prompt first"),
    "acre_prior": Demonstrator(lambda prompt, rng: "\\boxed{off}", "rg:acre",
                               "the commonest label, whatever the trials say (ACRE's blind bound)"),
    "equation_worked": Demonstrator(equation_worked, "math:procedural",
                                    "a linear equation solved step by step (simple_equations), then the answer"),
    "addition_worked": Demonstrator(addition_worked, "math:procedural",
                                    "a sum of two numbers added in columns, ones first, then the answer"),
    "addition_places": Demonstrator(lambda prompt, rng: addition_worked(prompt, rng, named_places=True),
                                    "math:procedural", "addition_worked with each number written by its places "
                                    "first and each column named"),
    "copy_question": Demonstrator(copy_question, "math:procedural", "the question's equation, unsolved (blind bound)"),
    "equation_prior": Demonstrator(equation_prior, "math:procedural",
                                   "the commonest answer of equations with values to 10, the question unread "
                                   "(blind bound)"),
    "equation_sweep": Demonstrator(equation_sweep, "math:procedural",
                                   "the commonest answer of equations with values to 10 not refused yet, the question "
                                   "unread (the retry task's blind bound)"),
    "arc_worked": Demonstrator(arc_worked, "rg:arc_1d", "the arc_1d rule that fits the examples, named, then applied"),
    "arc_copy_input": Demonstrator(arc_copy_input, "rg:arc_1d", "the test input unchanged (Arc1D's blind bound)"),
    "random_empty": Demonstrator(sudoku_random_empty, "game:Sudoku",
                                 "a random digit in a random empty cell (the board's digits unread)"),
    "board_rules": Demonstrator(sudoku_board_rules, "game:Sudoku",
                                "a digit the board's row, column and box allow, most constrained cell first"),
    "board_rules_worked": Demonstrator(sudoku_board_rules_worked, "game:Sudoku",
                                       "board_rules with its work written before the move: the cell's row, column "
                                       "and box digits, the digits they leave"),
}


class ScriptedEngine:
    """An `Engine` whose responses a demonstrator writes: the prompt's text in, the action's token ids out
    (ending with the template's end of turn, as a model's sampled response does). Its mu is a placeholder
    (log 1): demonstrations train a supervised objective, never a ratio."""

    def __init__(self, demonstrator: Demonstrator, prompt: PromptFormat, end_ids: Sequence[int], seed: int):
        self.demonstrator, self.prompt, self.end_ids = demonstrator, prompt, list(end_ids)
        self.rng = random.Random(seed)

    def generate(self, prompt_ids: list[list[int]], max_new_tokens: int, topk: int = 0, *, seed: int | None = None,
                 temperature: float | None = None) -> list[Generation]:
        out = []
        tok = self.prompt.tokenizer
        for ids in prompt_ids:
            action = self.demonstrator.act(tok.decode(list(ids)), self.rng)
            prefix = self.prompt.response_prefix
            text = action[len(prefix):] if prefix and action.startswith(prefix) else action
            # what a model writing this text gets from the same budget: cut at max_new_tokens, the end of turn
            # only where it fits (a move that fills the budget ends by length, as a sampled one does)
            response = (list(tok(text, add_special_tokens=False)["input_ids"]) + self.end_ids[:1])[:max_new_tokens]
            out.append(Generation(response, np.zeros(len(response), dtype=np.float32), None, None, "stop"))
        return out


def successful(episodes: Sequence[Episode]) -> list[Episode]:
    """The episodes that succeeded (an env's success flag, else the full return of 1) and played cleanly."""
    return [e for e in episodes if e.error is None and e.turns
            and e.info.get("success", e.episode_return >= SUCCESS_RETURN)]


def read_episodes(path: str | Path, prompt: PromptFormat, end_ids: Sequence[int]) -> list[Episode]:
    """Episodes from a JSONL file of conversations (module docstring). Each turn's prompt text is tokenized as
    the model's prompts are (the template's markup written as text); its response gets the end of turn."""
    episodes = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turns = [(str(t["prompt"]), str(t["response"])) for t in row["turns"]]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{lineno}: not an episode {{\"turns\": [{{\"prompt\", \"response\"}}, ...]}} "
                             f"({type(e).__name__}: {e})") from None
        episode = Episode(env_index=0, seed=lineno)
        for prompt_text, response_text in turns:
            response = prompt._ids(response_text) + list(end_ids[:1])
            episode.turns.append(Turn(prompt_ids=prompt._ids(prompt_text), response_ids=response,
                                      behavior_logprobs=np.zeros(len(response), dtype=np.float32), reward=0.0,
                                      done=False, truncated=False, well_formed=True, finish_reason="stop",
                                      prompt_text=prompt_text, response_text=response_text))
        if episode.turns:
            episode.turns[-1].done = True
            episodes.append(episode)
    return episodes
