"""What scripted policies score on GEM's Sudoku: the bounds a trained policy is read against.

    python -m benchmarks.sudoku_bounds --boards 400            # game:Sudoku-v0-easy
    python -m benchmarks.sudoku_bounds --env game:Sudoku-v0-hard --boards 50

Each policy sees what the model sees, the observation text (the board and the newest reply), and
answers one well-formed move a turn, through the project's `make_env` (the same adapter, seeds and
turn limit as a run):

* `random_move`: any row, column and digit of the board's range.
* `random_empty`: an empty cell of the shown board, a random digit. Reads the board, not the replies.
* `reader_last`: as random_empty, never the move the newest reply refuted (what `history=last` shows).
* `reader`: as random_empty, never a move any earlier reply of the episode refuted.
* `example_copier`: the move `{example}` shows, whatever the replies say.
* `example_reader`: the move `{example}` shows (the first empty cell, digit 1), the next digit after
  the one the newest reply refuted there: what a prompt with the board's example makes easy, reading
  only the newest reply.
* `random_example_copier`: the move `{random_example}` shows (the first empty cell, a digit drawn at
  random every turn), whatever the replies say.
* `random_example_reader`: the same, but the next digit after the newest refuted one where the shown
  move is the one the newest reply refuted.
* `random_allowed`: a random empty cell that allows a digit, and a digit its row, column and box do not hold
  yet: the rules right, no order of cells (what imitating `board_rules`' digits but not its choice of cell
  earns).
* `board_rules`: an empty cell and a digit its row, column and box do not hold yet (the board's rules,
  no reply read); the most constrained cell first.
* `oracle`: the solution's digit for an empty cell (reads GEM's solution grid): the ceiling.

A policy that beats `random_empty` uses more than the empty cells, but not necessarily the replies:
`board_rules` reads the board alone and solves every easy board. Whether a policy reads the replies
is what `eval/reply_effect` measures (`oat_dppo.agent.reply_effect`), not a score against these bounds.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

from oat_dppo.agent.demonstrations import sudoku_options, sudoku_rules_move
from oat_dppo.envs.registry import make_env
from oat_dppo_envs.games import SUDOKU

board_from_observation = SUDOKU.board  # the newest board an observation shows, rows of digits (0: '.')
SHOWN_MOVE = re.compile(r"\\boxed\{(\d+) (\d+) (\d+)\}")
RANDOM_EXAMPLE_SUFFIX = "\ne.g. {random_example}"


@dataclass
class Sudoku:
    """A scripted policy: `act(observation, env) -> action`; `start()` at each episode."""

    name: str
    choose: Callable[[list[list[int]], set, random.Random, object, str], tuple[int, int, int]]
    memory: str = "none"  # which refutations it avoids: none, last, all
    obs_suffix: str = ""  # what the prompt adds to GEM's observation (the example the copiers read)

    def start(self) -> None:
        self._refuted: set[tuple[int, int, int]] = set()

    def act(self, observation: str, env, rng: random.Random) -> str:
        board = board_from_observation(observation)
        refuted = SUDOKU.refuted(observation)  # history=last: the one reply shown
        if self.memory == "last":
            self._refuted = set()
        if refuted is not None and self.memory != "none":
            kind, r, c, d = refuted
            self._refuted |= {(r, c, x) for x in range(1, len(board) + 1)} if kind == "filled" else {(r, c, d)}
        r, c, d = self.choose(board, self._refuted, rng, env, observation)
        return f"\\boxed{{{r} {c} {d}}}"


def _any_move(board, refuted, rng, env, observation):
    n = len(board)
    return rng.randint(1, n), rng.randint(1, n), rng.randint(1, n)


def _empty_move(board, refuted, rng, env, observation):
    n = len(board)
    moves = [(r + 1, c + 1, d) for r in range(n) for c in range(n) if board[r][c] == 0 for d in range(1, n + 1)]
    allowed = [m for m in moves if m not in refuted] or moves or [(1, 1, 1)]
    return rng.choice(allowed)


def _example_move(board, refuted, rng, env, observation):
    empty = [(r + 1, c + 1) for r, row in enumerate(board) for c, cell in enumerate(row) if cell == 0]
    if not empty:
        return 1, 1, 1
    r, c = empty[0]
    tried = [d for (rr, cc, d) in refuted if (rr, cc) == (r, c)]  # memory "last": the newest reply's only
    return r, c, (max(tried) % len(board)) + 1 if tried else 1


def _shown_example_move(board, refuted, rng, env, observation):
    shown = SHOWN_MOVE.findall(observation)  # the prompt's example: the last move it writes out
    if not shown:
        return _empty_move(board, refuted, rng, env, observation)
    r, c, d = (int(x) for x in shown[-1])
    return (r, c, d % len(board) + 1) if (r, c, d) in refuted else (r, c, d)


def _rules_move(board, refuted, rng, env, observation):
    return sudoku_rules_move(board, rng) or _empty_move(board, refuted, rng, env, observation)


def _allowed_move(board, refuted, rng, env, observation):
    options = sudoku_options(board)
    if not options:
        return _empty_move(board, refuted, rng, env, observation)
    r, c = rng.choice(list(options))
    return r + 1, c + 1, rng.choice(options[(r, c)])


def _oracle_move(board, refuted, rng, env, observation):
    solution = env.unwrapped.full_grid
    empty = [(r, c) for r in range(len(board)) for c in range(len(board)) if board[r][c] == 0]
    r, c = rng.choice(empty) if empty else (0, 0)
    return r + 1, c + 1, solution[r][c]


POLICIES = {
    "random_move": Sudoku("random_move", _any_move),
    "random_empty": Sudoku("random_empty", _empty_move),
    "reader_last": Sudoku("reader_last", _empty_move, memory="last"),
    "reader": Sudoku("reader", _empty_move, memory="all"),
    "example_copier": Sudoku("example_copier", _example_move),
    "example_reader": Sudoku("example_reader", _example_move, memory="last"),
    "random_example_copier": Sudoku("random_example_copier", _shown_example_move, obs_suffix=RANDOM_EXAMPLE_SUFFIX),
    "random_example_reader": Sudoku("random_example_reader", _shown_example_move, memory="last",
                                    obs_suffix=RANDOM_EXAMPLE_SUFFIX),
    "random_allowed": Sudoku("random_allowed", _allowed_move),
    "board_rules": Sudoku("board_rules", _rules_move),
    "oracle": Sudoku("oracle", _oracle_move),
}


def play(env_id: str, policy: Sudoku, boards: int, seed: int = 0, split: str | None = "validation") -> dict[str, float]:
    """Mean reward, solved share and reply outcomes per episode of `policy` over `boards` boards of the split
    (`oat_dppo.envs.splits`; None: every board), an instance of a run with this seed."""
    env = make_env(env_id, seed=seed, history="last", obs_suffix=policy.obs_suffix, split=split)
    rng = random.Random(seed)
    returns, solved, outcomes = [], [], {k: [] for k in SUDOKU.OUTCOMES}
    try:
        for _ in range(boards):
            obs, _ = env.reset()
            policy.start()
            done, total, counts = False, 0.0, dict.fromkeys(SUDOKU.OUTCOMES, 0)
            while not done:
                obs, reward, terminated, truncated, info = env.step(policy.act(obs, env, rng))
                total += reward
                done = terminated or truncated
                if info.get("outcome") in counts:
                    counts[info["outcome"]] += 1
            returns.append(total)
            solved.append(total >= 1 - 1e-6)
            for k, v in counts.items():
                outcomes[k].append(v)
    finally:
        env.close()
    return {"reward": float(np.mean(returns)), "solved": float(np.mean(solved)),
            **{k: float(np.mean(v)) for k, v in outcomes.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sudoku_bounds", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="game:Sudoku-v0-easy", help="a GEM Sudoku id")
    parser.add_argument("--boards", type=int, default=400, help="boards per policy (held-out boards of seed 0)")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated: " + ", ".join(POLICIES))
    args = parser.parse_args(argv)
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or args.boards < 1 or not args.env.startswith("game:Sudoku"):
        parser.error(f"unknown policy {unknown}" if unknown else "--boards must be >= 1" if args.boards < 1
                     else f"--env must be a GEM Sudoku id, got {args.env!r}")
    print(f"{args.env}, {args.boards} held-out boards each\n")
    print("| policy | reward | solved | correct / episode | filled | violates | out of bounds |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        m = play(args.env, POLICIES[name], args.boards)
        print(f"| {name} | {m['reward']:.3f} | {m['solved']:.3f} | {m['correct']:.2f} | {m['filled']:.2f} | "
              f"{m['violates']:.2f} | {m['out_of_bounds']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
