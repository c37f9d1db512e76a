"""GEM's language games (`game:*`): multi-turn, one move per turn, discounted returns (gamma 0.9)."""

from __future__ import annotations

import math
import random
import re

from .preset import DEFAULT_MAX_TURNS, GAME_PREFIX, EnvPreset

# What every game shares. GEM's games draw from the global `random`: each instance gets a private copy.
GAME = dict(
    family="game",
    multi_turn=True,
    gamma=0.9,
    format_failure_reward=-0.1,  # gem.utils.constants.LanguageGameReward.format_error_reward
    obs_prefix=GAME_PREFIX,
    isolate_step_rng=True,
)

PRESETS = (
    EnvPreset(
        env_id="game:Sudoku-v0-easy",
        max_turns=15,
        action_pattern=r"\d+\s\d+\s\d+",
        first_class=True,
        description="4x4 Sudoku, about 9 empty cells, one move per turn (multi-turn)",
        feedback_probe="oat_dppo_envs.games:SUDOKU",
        split_key="observation",  # the board is the task
        **GAME,
    ),
    EnvPreset(
        env_id="game:Sudoku-v0-hard",
        max_turns=50,
        action_pattern=r"\d+\s\d+\s\d+",
        first_class=True,
        description="9x9 Sudoku, about 47 empty cells in 50 turns (multi-turn)",
        feedback_probe="oat_dppo_envs.games:SUDOKU",
        split_key="observation",  # the board is the task
        **GAME,
    ),
)


def family_preset(env_id: str, max_turns: int | None) -> EnvPreset:
    """Any other game: the family's defaults, with the turn limit GEM registered for it."""
    probe = "oat_dppo_envs.games:GUESS_THE_NUMBER" if env_id.startswith("game:GuessTheNumber-") else None
    return EnvPreset(env_id=env_id, max_turns=max_turns or DEFAULT_MAX_TURNS, feedback_probe=probe, **GAME)


class GuessTheNumberFeedback:
    """Feedback use in GEM's GuessTheNumber: its reply to a valid wrong guess is "At turn 2, you
    guessed 5, and the target number is higher than 5."; a guess is the last `\\boxed{N}`."""

    _HINT = re.compile(r"you guessed (\d+), and the target number is (higher|lower) than")
    _GUESS = re.compile(r"\\boxed\{(\d+)\}")  # GEM's own pattern

    def follows(self, observation: str, action: str) -> bool | None:
        hint = self._HINT.search(observation)
        guesses = self._GUESS.findall(action)
        if hint is None or not guesses:
            return None
        previous, guess = int(hint.group(1)), int(guesses[-1])
        return guess > previous if hint.group(2) == "higher" else guess < previous

    def changed(self, observation: str) -> str | None:
        """The reply had the target been on the other side (`oat_dppo.agent.reply_effect`)."""
        hint = self._HINT.search(observation)
        if hint is None:
            return None
        other = "lower" if hint.group(2) == "higher" else "higher"
        return observation[: hint.start(2)] + other + observation[hint.end(2):]

    def moves(self, env, observation: str) -> list[str]:
        """Every guess in the env's range, as GEM reads it (none for the random-range variant)."""
        low, high = getattr(env, "min_number", None), getattr(env, "max_number", None)
        if low is None or high is None or getattr(env, "_is_random", False):
            return []
        return [f"\\boxed{{{n}}}" for n in range(low, high + 1)]

    def blind_success(self, env, max_turns: int) -> float:
        """min(turns, N) distinct guesses of N equally likely targets (NaN for the random-range variant,
        whose range is drawn at every reset)."""
        low, high = getattr(env, "min_number", None), getattr(env, "max_number", None)
        if low is None or high is None or getattr(env, "_is_random", False):
            return math.nan
        n = high - low + 1
        return min(max_turns, getattr(env, "max_turns", max_turns), n) / n


GUESS_THE_NUMBER = GuessTheNumberFeedback()


def sudoku_units(board: list[list[int]], r: int, c: int) -> tuple[list[int], list[int], list[int]]:
    """The cells of (r, c)'s row, column and box (0-based; 0 for an empty cell), on an n x n board of
    sqrt(n) x sqrt(n) boxes."""
    n, box = len(board), int(round(len(board) ** 0.5))
    r0, c0 = r - r % box, c - c % box
    return (list(board[r]), [board[i][c] for i in range(n)],
            [board[i][j] for i in range(r0, r0 + box) for j in range(c0, c0 + box)])


def sudoku_cell_view(board: list[list[int]], r: int, c: int) -> str:
    """One line of `{board_view}`: cell (r, c)'s move "row column" (1-based) and the digits its row, its column
    and its box hold ("-": none), e.g. "2 3: row 1 4, column 2, box 1 2 4"."""

    def held(cells: list[int]) -> str:
        return " ".join(str(d) for d in sorted(set(cells) - {0})) or "-"

    in_row, in_column, in_box = sudoku_units(board, r, c)
    return f"{r + 1} {c + 1}: row {held(in_row)}, column {held(in_column)}, box {held(in_box)}"


class SudokuFeedback:
    """Feedback in GEM's Sudoku. Every well-formed move is answered: "At turn 3, you placed 2 at R1 C4,
    which is correct." (reward 1/empty cells), or a refutation of the move, reward 0 and the game goes
    on: "you tried to place 2 at R1 C4, which is already filled" (a clue or an earlier placement),
    "... which violates Sudoku rules" (the digit is wrong there), "... which is out of bounds"; a reply
    without a move ends the game at -0.1. The board is shown every turn, so what a refutation adds is
    the named move itself: a reader does not play a refuted move again.

    * follows: the move after a refutation is not the refuted one (a filled cell: no digit in it).
      Agreement only: a policy that never repeats a move agrees without reading.
    * changed: the refutation names a neighbouring move of the same kind instead (another cell for
      "already filled", another digit in the same cell for "violates"); out-of-bounds replies have no
      changed reply (a neighbour of an impossible move is mostly possible).
    * moves: the two named moves. The real reply favours the one it did not refute, so a policy that
      never plays a refuted move scores 1 (`oat_dppo.agent.reply_effect`), one that ignores the
      reply 0.
    * outcome: the kind of each reply, counted per episode in `rollout/outcome_*` (correct placements,
      moves onto filled cells, rule violations, out of bounds, malformed)."""

    _MOVE = re.compile(r"you (?:tried to place|placed) (\d+) at R(\d+) C(\d+), which (is correct|is already filled"
                       r"|violates Sudoku rules|is out of bounds)")
    _ACTION = re.compile(r"\\boxed\{(\d+)\s(\d+)\s(\d+)\}")  # GEM's own pattern
    _ROW = re.compile(r"^R(\d+)\s+(.*)$", re.MULTILINE)  # a board row as GEM renders it: "R1  .  4 |  2  ."
    _KINDS = {"is correct": "correct", "is already filled": "filled", "violates Sudoku rules": "violates",
              "is out of bounds": "out_of_bounds"}
    OUTCOMES = ("correct", "filled", "violates", "out_of_bounds", "malformed", "refuted")

    def refuted(self, observation: str) -> tuple[str, int, int, int] | None:
        """(kind, row, col, digit) of the move a refutation names; None for any other reply."""
        found = self._MOVE.search(observation)
        if found is None or found.group(4) == "is correct":
            return None
        digit, row, col = (int(found.group(i)) for i in (1, 2, 3))
        return self._KINDS[found.group(4)], row, col, digit

    def follows(self, observation: str, action: str) -> bool | None:
        refuted, moves = self.refuted(observation), self._ACTION.findall(action)
        if refuted is None or not moves:
            return None
        kind, row, col, digit = refuted
        r, c, d = (int(x) for x in moves[-1])
        if kind == "filled":
            return (r, c) != (row, col)
        return (r, c, d) != (row, col, digit)

    def _neighbour(self, observation: str) -> tuple[int, int, int] | None:
        """The move a changed refutation names: the next column for a filled cell, the next digit for a
        violation (one down at the board's edge, whatever its size)."""
        refuted = self.refuted(observation)
        if refuted is None or refuted[0] == "out_of_bounds":
            return None
        kind, row, col, digit = refuted
        if kind == "filled":
            return row, (col - 1 if col > 1 else col + 1), digit
        return row, col, (digit - 1 if digit > 1 else digit + 1)

    def changed(self, observation: str) -> str | None:
        neighbour = self._neighbour(observation)
        if neighbour is None:
            return None
        found = self._MOVE.search(observation)
        row, col, digit = neighbour
        named = f"{digit} at R{row} C{col}"
        start, end = found.start(1), found.end(3)
        return observation[:start] + named + observation[end:]

    def moves(self, env, observation: str) -> list[str]:
        refuted, neighbour = self.refuted(observation), self._neighbour(observation)
        if neighbour is None:
            return []
        _, row, col, digit = refuted
        return [f"\\boxed{{{row} {col} {digit}}}", "\\boxed{{{} {} {}}}".format(*neighbour)]

    def blind_success(self, env, max_turns: int) -> float:
        """Not defined: the board, not the reply, says which moves are possible (NaN)."""
        return math.nan

    def board(self, text: str) -> list[list[int]]:
        """The newest board `text` shows, as rows of digits (0 for '.'); [] where it shows none."""
        rows: dict[int, list[int]] = {}
        for found in self._ROW.finditer(text):  # a later board (history=concat) overwrites an earlier one
            rows[int(found.group(1))] = [0 if x == "." else int(x) for x in found.group(2).replace("|", " ").split()]
        return [rows[r] for r in sorted(rows)]

    def example(self, text: str, rng: random.Random | None = None) -> str | None:
        """A move for the prompt's `{example}` (`obs_suffix`): the first empty cell of the board `text`
        shows, with the digit 1 whatever the solution, or with a digit `rng` draws uniformly from the
        board's range (`{random_example}`). It names a cell the board already shows empty and says
        nothing of the right digit; None when the board has no empty cell."""
        board = self.board(text)
        empty = [(r + 1, c + 1) for r, row in enumerate(board) for c, cell in enumerate(row) if cell == 0]
        digit = rng.randint(1, len(board)) if rng is not None else 1
        return f"\\boxed{{{empty[0][0]} {empty[0][1]} {digit}}}" if empty else None

    def board_view(self, text: str) -> str | None:
        """The board `text` shows, laid out by cell for `{board_view}` (`obs_suffix`): a line for each empty
        cell, its move's "row column" and then the digits its row, its column and its box hold ("-": none).
        The grid's own facts placed beside the cell a move names (a lookup a small model fails at, docs/
        warm_start.md); it draws no conclusion from them (not the digits the cell allows). None when the
        board has no empty cell."""
        board = self.board(text)
        lines = [sudoku_cell_view(board, r, c) for r, row in enumerate(board) for c, cell in enumerate(row) if not cell]
        if not lines:
            return None
        return "Empty cells (row column) and the digits their row, column and box hold:\n" + "\n".join(lines)

    def outcome(self, observation: str, reward: float) -> str | None:
        """The kind of reply: correct, filled, violates, out_of_bounds, malformed; at the turn limit GEM
        replaces the reply, so only the reward tells a placement ("correct") from a refutation
        ("refuted")."""
        found = self._MOVE.search(observation)
        if found is not None:
            return self._KINDS[found.group(4)]
        if observation.startswith("Congratulations"):
            return "correct"
        if observation.startswith("You did not provide a valid guess"):
            return "malformed"
        if observation.startswith("You have reached the maximum number of turns"):
            return "correct" if reward > 0 else "refuted"
        return None


SUDOKU = SudokuFeedback()
