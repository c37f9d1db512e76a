"""GEM's Sudoku, read by the project: reply outcomes, the counterfactual reply effect, scripted bounds.

The replies are GEM's own (the real `game:Sudoku-v0-easy` through `make_env`); the policies are
scripted so that each measure is checked against what it must say: a reader that never replays a
refuted move scores a reply effect of 1, a policy that ignores the reply 0, whatever it plays.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from oat_dppo.agent.demonstrations import sudoku_rules_move
from oat_dppo.agent.metrics import outcomes_per_episode
from oat_dppo.agent.reply_effect import Case, reply_effect
from oat_dppo.agent.types import Episode, Turn
from oat_dppo.envs import make_env
from oat_dppo_envs.games import SUDOKU
from benchmarks.sudoku_bounds import POLICIES, board_from_observation, play

ENV = "game:Sudoku-v0-easy"


def _board_env(seed: int = 3):
    env = make_env(ENV, seed=0, history="last")
    obs, _ = env.reset(seed=seed)
    return env, obs


def _cells(board, filled: bool):
    return [(r + 1, c + 1) for r in range(len(board)) for c in range(len(board)) if (board[r][c] != 0) == filled]


def test_each_reply_of_gem_is_classified_and_the_board_is_read_back():
    env, obs = _board_env()
    board = board_from_observation(obs)
    assert board == env.unwrapped.board  # the prompt's board is GEM's
    solution = env.unwrapped.full_grid
    (fr, fc), (er, ec) = _cells(board, True)[0], _cells(board, False)[0]
    wrong = next(d for d in range(1, 5) if d != solution[er - 1][ec - 1])
    steps = [(f"\\boxed{{{fr} {fc} 1}}", "filled"), ("\\boxed{1 1 5}", "out_of_bounds"),
             (f"\\boxed{{{er} {ec} {wrong}}}", "violates"),
             (f"\\boxed{{{er} {ec} {solution[er - 1][ec - 1]}}}", "correct"), ("no move", "malformed")]
    for action, kind in steps:
        obs, reward, terminated, _, info = env.step(action)
        assert info["outcome"] == kind, (action, obs)
        assert (reward > 0) == (kind == "correct")
    assert terminated  # a malformed reply ends GEM's game


def test_counterfactual_names_a_neighbouring_move_and_favours_the_unrefuted_one():
    env, obs = _board_env()
    (fr, fc) = _cells(board_from_observation(obs), True)[0]
    obs, _, _, _, info = env.step(f"\\boxed{{{fr} {fc} 3}}")
    cf = info["counterfactual"]
    neighbour = fc - 1 if fc > 1 else fc + 1
    assert f"place 3 at R{fr} C{fc}, which is already filled" in obs
    assert f"place 3 at R{fr} C{neighbour}, which is already filled" in cf["changed_observation"]
    assert cf["changed_observation"].replace(f"R{fr} C{neighbour}", f"R{fr} C{fc}", 1) == obs  # all else equal
    assert cf["moves"] == [f"\\boxed{{{fr} {fc} 3}}", f"\\boxed{{{fr} {neighbour} 3}}"]
    assert cf["favoured"] == [False, True]
    obs, _, _, _, info = env.step("\\boxed{1 1 5}")  # out of bounds: no counterfactual
    assert "counterfactual" not in info and info["follows_feedback"] is True


class MovePolicy:
    """[P, M] weights: `reads` -> no weight on the move the prompt's reply refuted."""

    def __init__(self, reads: bool, anti: bool = False):
        self.reads, self.anti = reads, anti

    def move_probs(self, prompts, moves):
        out = np.ones((len(prompts), len(moves)))
        for i, prompt in enumerate(prompts):
            refuted = SUDOKU.refuted(prompt)
            for j, move in enumerate(moves):
                if not self.reads or refuted is None:
                    out[i, j] = 1.0 + j  # blind: prefers later moves, the same after any reply
                    continue
                named = f"\\boxed{{{refuted[1]} {refuted[2]} {refuted[3]}}}"
                out[i, j] = float((move == named) == self.anti)
        return out


def _cases(boards: int = 20) -> list[Case]:
    """Every turn of random empty-cell play on real boards whose reply carries a counterfactual."""
    env = make_env(ENV, seed=0, history="last")
    rng = np.random.default_rng(0)
    cases = []
    for seed in range(boards):
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            board = board_from_observation(obs)
            cells = _cells(board, filled=bool(rng.random() < 0.3)) or _cells(board, True)
            r, c = cells[rng.integers(len(cells))]
            obs, _, terminated, truncated, info = env.step(f"\\boxed{{{r} {c} {rng.integers(1, 5)}}}")
            done = terminated or truncated
            cf = info.get("counterfactual")
            if cf and not done:
                cases.append(Case(obs, cf["changed_observation"], tuple(cf["moves"]), tuple(cf["favoured"])))
    return cases


def test_reply_effect_on_sudoku_is_one_for_a_reader_zero_blind_minus_one_against():
    cases = _cases()
    kinds = {SUDOKU.refuted(c.prompt)[0] for c in cases}
    assert kinds == {"filled", "violates"} and len(cases) > 50
    assert reply_effect(MovePolicy(reads=True), cases) == pytest.approx(1.0)
    assert reply_effect(MovePolicy(reads=False), cases) == 0.0
    assert reply_effect(MovePolicy(reads=True, anti=True), cases) == pytest.approx(-1.0)


def test_outcomes_are_counted_per_episode_with_zeros_for_declared_kinds():
    def turn(outcome):
        return Turn([1], [2], np.zeros(1, np.float32), 0.0, False, False, True, "stop", outcome=outcome)

    kinds = {"outcome_kinds": SUDOKU.OUTCOMES}
    episodes = [Episode(0, 0, [turn("correct"), turn("correct"), turn("filled")], info=dict(kinds)),
                Episode(1, 1, [turn("violates"), turn("malformed")], info=dict(kinds))]
    counts = outcomes_per_episode(episodes)
    assert counts["outcome_correct"] == 1.0 and counts["outcome_filled"] == 0.5
    assert counts["outcome_out_of_bounds"] == 0.0 and set(counts) == {f"outcome_{k}" for k in SUDOKU.OUTCOMES}
    assert outcomes_per_episode([Episode(0, 0, [turn(None)])]) == {}


def test_scripted_bounds_order_as_the_board_and_the_replies_allow():
    """random moves < empty cells <= empty cells avoiding every refuted move < the board's rules = 1; the rules'
    digits on cells in random order lose little (the digit, not the order of cells, is what an easy board asks)."""
    scores = {name: play(ENV, POLICIES[name], boards=60) for name in
              ("random_move", "random_empty", "reader", "random_allowed", "board_rules", "oracle")}
    assert 0.95 < scores["random_allowed"]["reward"] <= 1.0 and scores["random_allowed"]["solved"] > 0.9
    assert scores["random_move"]["reward"] < scores["random_empty"]["reward"] < scores["reader"]["reward"] < 0.6
    assert scores["random_move"]["filled"] > 1 and scores["random_empty"]["filled"] == 0
    assert scores["board_rules"]["reward"] == pytest.approx(1.0) == scores["oracle"]["reward"]
    assert scores["board_rules"]["solved"] == 1.0 and scores["random_empty"]["solved"] < 0.05


def test_the_example_field_names_the_first_empty_cell_of_each_turns_board():
    """`{example}` in obs_suffix: a move on the board's first empty cell with the digit 1, redrawn every
    turn from the board shown (a placed digit moves it on); an env without examples refuses the field."""
    env = make_env(ENV, seed=0, history="last", obs_suffix="\ne.g. {example}")
    obs, _ = env.reset(seed=3)
    board, solution = env.unwrapped.board, env.unwrapped.full_grid
    r, c = _cells(board, filled=False)[0]
    assert obs.endswith(f"e.g. \\boxed{{{r} {c} 1}}") and "{example}" not in obs
    obs, reward, _, _, _ = env.step(f"\\boxed{{{r} {c} {solution[r - 1][c - 1]}}}")
    assert reward > 0
    r2, c2 = _cells(env.unwrapped.board, filled=False)[0]
    assert (r2, c2) != (r, c) and obs.endswith(f"e.g. \\boxed{{{r2} {c2} 1}}")
    with pytest.raises(ValueError, match="does not provide"):
        make_env("smoke:digits", seed=0, obs_suffix="{example}")


def test_with_the_boards_example_only_a_reader_of_the_replies_passes_one_half():
    """Copying `{example}` (first empty cell, digit 1) whatever the replies say stalls on the first cell
    whose digit is not 1; moving to the next digit after "violates" (the newest reply only) passes 0.5."""
    copier = play(ENV, POLICIES["example_copier"], boards=60)
    reader = play(ENV, POLICIES["example_reader"], boards=60)
    assert copier["reward"] < 0.3 < 0.5 < reader["reward"]


def test_the_random_example_draws_its_digit_from_the_episode_and_the_turn():
    """`{random_example}`: the board's first empty cell with a digit drawn anew every turn, the same for
    the same episode seed and turn (a run reproduces), and the same in the counterfactual prompt as in
    the real one (only the reply differs there)."""
    def shown(seed):
        env = make_env(ENV, seed=0, history="last", obs_suffix="\ne.g. {random_example}")
        obs, _ = env.reset(seed=seed)
        r, c = _cells(env.unwrapped.board, filled=False)[0]
        moves = [obs.rsplit("e.g. ", 1)[1]]
        for _ in range(6):  # a filled cell: the board and its first empty cell stay
            fr, fc = _cells(env.unwrapped.board, filled=True)[0]
            obs, _, _, _, info = env.step(f"\\boxed{{{fr} {fc} 1}}")
            moves.append(obs.rsplit("e.g. ", 1)[1])
            assert info["counterfactual"]["changed_observation"].rsplit("e.g. ", 1)[1] == moves[-1]
        return (r, c), moves

    (r, c), moves = shown(3)
    assert all(m.startswith(f"\\boxed{{{r} {c} ") for m in moves)
    assert len({m[-2] for m in moves}) > 1  # the digit changes across turns
    assert shown(3)[1] == moves and shown(4)[1] != moves
    with pytest.raises(ValueError, match=r"\{random_example\}.*at random.*does not provide"):
        make_env("smoke:digits", seed=0, obs_suffix="{random_example}")


def test_with_a_random_example_copying_it_stays_under_one_half():
    """Copying `{random_example}` is a random digit on one empty cell: near the random empty-cell mover
    (0.41), so the bar of 0.5 is not passed by copying; the reply-reading bound sits above the copier."""
    copier = play(ENV, POLICIES["random_example_copier"], boards=60)
    reader = play(ENV, POLICIES["random_example_reader"], boards=60)
    assert 0.25 < copier["reward"] < reader["reward"]
    assert copier["reward"] < 0.5 and copier["filled"] == 0


def test_the_board_view_lays_out_each_empty_cell_with_what_its_units_hold():
    """`{board_view}`: a line for every empty cell and no other, each listing exactly the digits its row,
    column and box hold, so the digits it leaves out are the ones the rules allow (the rules player's
    options); a later turn's view follows the board. An env without a board refuses the field."""
    env = make_env(ENV, seed=0, history="last", obs_suffix="\n{board_view}\nAnswer.")
    obs, _ = env.reset(seed=3)
    for turn in range(3):
        board = env.unwrapped.board
        lines = obs.split("hold:\n", 1)[1].split("\nAnswer.")[0].splitlines()
        assert [tuple(int(x) for x in line.split(":")[0].split()) for line in lines] == _cells(board, filled=False)
        for line in lines:
            r, c = (int(x) for x in line.split(":")[0].split())
            listed = {int(d) for d in line.split(":")[1].replace(",", " ").split() if d.isdigit()}
            unit = set(board[r - 1]) | {board[i][c - 1] for i in range(4)} | {
                board[i][j] for i in range((r - 1) // 2 * 2, (r - 1) // 2 * 2 + 2)
                for j in range((c - 1) // 2 * 2, (c - 1) // 2 * 2 + 2)}
            assert listed == unit - {0}
            assert {1, 2, 3, 4} - listed == {d for d in range(1, 5) if sudoku_rules_allows(board, r, c, d)}
        r, c = _cells(board, filled=False)[0]
        obs, reward, *_ = env.step(f"\\boxed{{{r} {c} {env.unwrapped.full_grid[r - 1][c - 1]}}}")
        assert reward > 0 and f"\n{r} {c}: " not in obs  # placed: the cell leaves the view
    with pytest.raises(ValueError, match=r"\{board_view\}.*does not provide"):
        make_env("smoke:digits", seed=0, obs_suffix="{board_view}")


def sudoku_rules_allows(board, r, c, digit) -> bool:
    """The rules player's own test (1-based cell): `digit` is among the options `sudoku_rules_move` draws from
    (40 seeded draws: every option of at most 4 is drawn)."""
    trial = [[cell if (i, j) == (r - 1, c - 1) or cell else 5 for j, cell in enumerate(row)]
             for i, row in enumerate(board)]  # every other empty cell filled with a digit no unit holds
    options = {sudoku_rules_move(trial, random.Random(s)) for s in range(40)}
    return (r, c, digit) in options
