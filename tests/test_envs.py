"""Environment adapter (`oat_dppo.envs`) on real GEM environments, offline."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.child import child_env
from hypothesis import given, settings
from hypothesis import strategies as st

from oat_dppo.envs import (
    FIRST_CLASS_ENV_IDS,
    TEMPLATES,
    DatasetUnavailableError,
    EnvError,
    EnvStepError,
    TextEnv,
    UnknownEnvError,
    extract_action,
    get_preset,
    hub,
    is_well_formed,
    known_env_ids,
    make_env,
    render_prompt,
    stop_strings,
)

REPO = Path(__file__).resolve().parents[1]
BOARD_HEADER = "Here is the current board layout:"


# ---------------------------------------------------------------- Sudoku helpers (from the text)
def parse_board(obs: str) -> list[list[int]]:
    """The last board printed in `obs`, 0 for an empty cell."""
    block = obs[obs.rindex(BOARD_HEADER):]
    rows = []
    for line in block.splitlines():
        if re.match(r"^R\d+\s", line):
            cells = [tok for tok in line.split()[1:] if tok != "|"]
            rows.append([0 if c == "." else int(c) for c in cells])
    assert rows and all(len(r) == len(rows) for r in rows), block
    return rows


def solve(board: list[list[int]]) -> list[list[int]]:
    n = len(board)
    box = int(n**0.5)
    grid = [row[:] for row in board]

    def candidates(r, c):
        used = set(grid[r]) | {grid[i][c] for i in range(n)}
        br, bc = box * (r // box), box * (c // box)
        used |= {grid[i][j] for i in range(br, br + box) for j in range(bc, bc + box)}
        return [d for d in range(1, n + 1) if d not in used]

    def search() -> bool:
        empty = [(r, c) for r in range(n) for c in range(n) if grid[r][c] == 0]
        if not empty:
            return True
        r, c = min(empty, key=lambda rc: len(candidates(*rc)))  # most constrained cell first
        for d in candidates(r, c):
            grid[r][c] = d
            if search():
                return True
        grid[r][c] = 0
        return False

    assert search(), "unsolvable board"
    return grid


def first_board(env_id: str, seed: int, reset_seed: int | None = None) -> list[list[int]]:
    env = make_env(env_id, seed=seed)
    obs, _ = env.reset(seed=reset_seed)
    return parse_board(obs)


# ---------------------------------------------------------------- Sudoku (multi-turn)
def test_sudoku_easy_episode_solved_from_the_observed_board():
    env = make_env("game:Sudoku-v0-easy", seed=11)
    obs, info = env.reset()
    assert obs.startswith(get_preset("game:Sudoku-v0-easy").obs_prefix)
    assert "\\boxed{row column number}" in obs and obs.rstrip().endswith("\\boxed{}.")
    board = parse_board(obs)
    empty = [(r, c) for r in range(4) for c in range(4) if board[r][c] == 0]
    assert 5 <= len(empty) <= 12
    solution = solve(board)
    total = 0.0
    for k, (r, c) in enumerate(empty, 1):
        action = f"Row {r + 1} is missing {solution[r][c]}. \\boxed{{{r + 1} {c + 1} {solution[r][c]}}}"
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["well_formed"] is True and info["turn"] == k
        assert reward == pytest.approx(1 / len(empty)) and reward > 0
        assert parse_board(obs)[r][c] == solution[r][c]  # the new board is in the observation
        if k < len(empty):
            assert f"you placed {solution[r][c]} at R{r + 1} C{c + 1}, which is correct" in obs
        assert obs.count("At turn") == min(k, len(empty) - 1)  # the feedback history is concatenated
        total += reward
        assert terminated == (k == len(empty)) and not truncated
    assert parse_board(obs) == solution
    assert "Congratulations" in obs
    assert total == pytest.approx(1.0)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("\\boxed{1 1 1}")


@pytest.mark.parametrize(
    "action, penalty, expected",
    [("I would put a 3 in the corner.", 0.0, -0.1), ("I would put a 3 in the corner.", -0.5, -0.6),
     ("\\boxed{one one three}", 0.0, -0.1)],
)
def test_sudoku_malformed_action_ends_the_episode(action, penalty, expected):
    env = make_env("game:Sudoku-v0-easy", seed=3, format_penalty=penalty)
    env.reset()
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["well_formed"] is False
    assert terminated and not truncated
    assert info["env_reward"] == pytest.approx(-0.1)
    assert reward == pytest.approx(expected)
    assert "You did not provide a valid guess." in obs


def test_sudoku_format_penalty_only_on_malformed_steps():
    env = make_env("game:Sudoku-v0-easy", seed=3, format_penalty=-0.5)
    obs, _ = env.reset()
    board = parse_board(obs)
    r, c = next((r, c) for r in range(4) for c in range(4) if board[r][c] != 0)
    # Overwriting a given cell is well formed but invalid: GEM gives 0 and plays on.
    _, reward, terminated, _, info = env.step(f"\\boxed{{{r + 1} {c + 1} {board[r][c]}}}")
    assert info["well_formed"] and reward == 0.0 and not terminated


def test_sudoku_seeding_reproducible_and_private():
    a1 = make_env("game:Sudoku-v0-easy", seed=5)
    a2 = make_env("game:Sudoku-v0-easy", seed=5)
    b = make_env("game:Sudoku-v0-easy", seed=6)
    random.seed(1234)
    expected_global = [random.random() for _ in range(3)]
    random.seed(1234)
    boards_a1, boards_a2, boards_b = [], [], []
    for _ in range(3):  # interleaved: instances must not disturb each other
        boards_a1.append(parse_board(a1.reset()[0]))
        boards_b.append(parse_board(b.reset()[0]))
        boards_a2.append(parse_board(a2.reset()[0]))
    assert boards_a1 == boards_a2
    assert boards_a1 != boards_b
    # The caller's global RNG was neither reseeded nor advanced by the envs.
    assert [random.random() for _ in range(3)] == expected_global
    # reset(seed=k) gives the same board in every instance (group baselines share a start seed).
    assert first_board("game:Sudoku-v0-easy", 1, 77) == first_board("game:Sudoku-v0-easy", 2, 77)
    assert first_board("game:Sudoku-v0-easy", 1, 77) != first_board("game:Sudoku-v0-easy", 1, 78)


def test_sudoku_max_turns_option_moves_gems_own_limit():
    env = make_env("game:Sudoku-v0-easy", seed=8, max_turns=2)
    assert env.max_turns == 2 and env.unwrapped.max_turns == 2
    obs, _ = env.reset()
    board = parse_board(obs)
    r, c = next((r, c) for r in range(4) for c in range(4) if board[r][c] != 0)
    overwrite = f"\\boxed{{{r + 1} {c + 1} {board[r][c]}}}"
    assert env.step(overwrite)[2:4] == (False, False)
    _, _, terminated, truncated, info = env.step(overwrite)
    assert truncated and info["turn"] == 2


def test_sudoku_hard_make_reset_and_a_correct_move():
    env = make_env("game:Sudoku-v0-hard", seed=0)
    assert env.max_turns == 50
    obs, info = env.reset()
    board = parse_board(obs)
    assert len(board) == 9 and "R9" in info["suffix"]
    empty = sum(row.count(0) for row in board)
    assert 40 <= empty <= 55
    solution = solve(board)
    r, c = next((r, c) for r in range(9) for c in range(9) if board[r][c] == 0)
    _, reward, terminated, _, info = env.step(f"\\boxed{{{r + 1} {c + 1} {solution[r][c]}}}")
    assert reward == pytest.approx(1 / empty) and info["well_formed"] and not terminated


# ---------------------------------------------------------------- reasoning-gym (single-turn)
@pytest.mark.parametrize("env_id", ["rg:arc_1d", "rg:acre"])
def test_reasoning_gym_correct_answer_scores_one(env_id):
    env = make_env(env_id, seed=21)
    obs, _ = env.reset()
    assert obs.startswith("Question: ") and obs.endswith("within \\boxed{}.")
    answer = env.unwrapped.data["answer"]
    if env_id == "rg:acre":
        assert answer in {"on", "off", "undetermined"}
    else:
        assert re.fullmatch(r"\d( \d)+", answer)  # a grid row such as "0 0 1 5 0"
    obs, reward, terminated, truncated, info = env.step(f"Reasoning...\n\\boxed{{{answer}}}")
    assert (reward, terminated, info["well_formed"]) == (1.0, True, True)

    env.reset()
    answer = env.unwrapped.data["answer"]
    wrong = "0 " + answer if env_id == "rg:arc_1d" else ("off" if answer == "on" else "on")
    assert env.step(f"\\boxed{{{wrong}}}")[1] < 1.0
    env.reset()
    _, reward, _, _, info = env.step(env.unwrapped.data["answer"])  # right answer, but no box
    assert reward == 0.0 and info["well_formed"] is False


@pytest.mark.parametrize("env_id", ["rg:arc_1d", "rg:acre"])
def test_reasoning_gym_seeding(env_id):
    def questions(seed, n=4):
        env = make_env(env_id, seed=seed)
        return [env.reset()[0] for _ in range(n)]

    assert questions(1) == questions(1)
    assert questions(1) != questions(2)
    assert len(set(questions(3, 6))) == 6
    a, b = make_env(env_id, seed=1), make_env(env_id, seed=2)
    assert a.reset(seed=99)[0] == b.reset(seed=99)[0]
    # The question pool stays fixed however many episodes an instance has played (GEM 0.1.0
    # would swap it after `size` seeded resets), so a shared seed still means a shared question.
    small = dict(size=3)
    veteran = make_env(env_id, seed=1, **small)
    for _ in range(7):
        veteran.reset()
    assert veteran.reset(seed=99)[0] == make_env(env_id, seed=2, **small).reset(seed=99)[0]
    # The validation instances draw from a different pool and seed stream.
    assert make_env(env_id, seed=1, split="validation").reset()[0] != questions(1, 1)[0]


# ---------------------------------------------------------------- math
MATH_ROWS = [
    {"problem": "What is 2 + 3?", "answer": "5"},
    {"problem": "What is half of 1?", "answer": "\\frac{1}{2}"},
    {"problem": "How many sides has a hexagon?", "answer": 6},
    {"problem": "A row without an answer.", "answer": None},
    {"problem": "Another row without an answer."},
]
ANSWERS = {r["problem"]: str(r["answer"]) for r in MATH_ROWS if r.get("answer") is not None}


def write_rows(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        # A parquet column has one type: numbers become text, as in real datasets.
        typed = [{k: (None if v is None else str(v)) for k, v in r.items()} for r in rows]
        pq.write_table(pa.Table.from_pylist(typed), path)
    return path


def current_answer(obs: str) -> str:
    [answer] = [a for p, a in ANSWERS.items() if p in obs]
    return answer


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_math_local_file_graded_by_gem(tmp_path, caplog, suffix):
    data = write_rows(tmp_path / f"math{suffix}", MATH_ROWS)
    with caplog.at_level(logging.WARNING, logger="oat_dppo.envs.math_data"):
        env = make_env("math", seed=0, math_data=str(data))
    assert "dropped 2 of 5 rows" in caplog.text
    seen = set()
    with env:
        for _ in range(8):
            obs, _ = env.reset()
            assert obs.startswith("Question: ") and "\\boxed{}" in obs
            seen.add(current_answer(obs))
            _, reward, terminated, truncated, info = env.step(f"So the answer is \\boxed{{{current_answer(obs)}}}.")
            assert (reward, terminated, info["well_formed"]) == (1.0, True, True)
            env.reset()
            obs2, reward, *_ = env.step("\\boxed{12345}")
            assert reward == 0.0
        assert seen == set(ANSWERS.values())  # no row without an answer is ever served
    env.close()  # idempotent


def test_math_checker_is_gems_equivalence_not_string_match(tmp_path):
    data = write_rows(tmp_path / "m.jsonl", [{"problem": "What is half of 1?", "answer": "\\frac{1}{2}"}])
    env = make_env("math", seed=0, math_data=data)
    env.reset()
    assert env.step("\\boxed{0.5}")[1] == 1.0
    env.reset()
    assert env.step("\\boxed{\\frac12} and then \\boxed{3}")[1] == 0.0  # the last box counts
    env.close()


def test_math_file_custom_keys_and_gem_math_id(tmp_path):
    rows = [{"q": "What is 7 * 6?", "a": 42}]
    data = write_rows(tmp_path / "custom.jsonl", rows)
    with pytest.raises(DatasetUnavailableError, match=r"columns found: \['a', 'q'\]"):
        make_env("math", seed=0, math_data=data)
    for env_id in ("math", "math:Math12K", "eval:MATH500"):
        env = make_env(env_id, seed=0, math_data=data, question_key="q", answer_key="a")
        assert "What is 7 * 6?" in env.reset()[0]
        assert env.step("\\boxed{42}")[1] == 1.0
        env.close()


def test_math_bad_inputs(tmp_path):
    with pytest.raises(DatasetUnavailableError, match="--math-data FILE"):
        make_env("math", seed=0)
    with pytest.raises(DatasetUnavailableError, match="not found"):
        make_env("math", seed=0, math_data=tmp_path / "missing.jsonl")
    for not_math in ("rg:arc_1d", "math:procedural", "eval:2Wiki"):  # eval:2Wiki is a QA env
        with pytest.raises(ValueError, match="math_data applies"):
            make_env(not_math, seed=0, math_data=tmp_path / "x.jsonl")


def test_math_step_from_a_thread_raises_env_step_error(tmp_path):
    # GEM's in-process grader uses SIGALRM, which only works in the main thread: a real env
    # failure, which must reach the caller as EnvStepError (and not as a silent reward of 0).
    data = write_rows(tmp_path / "m.jsonl", MATH_ROWS[:1])
    env = make_env("math", seed=0, math_data=data)
    env.reset()
    caught = []

    def play():
        try:
            env.step("\\boxed{5}")
        except EnvError as e:
            caught.append(e)

    worker = threading.Thread(target=play)
    worker.start()
    worker.join(30)
    [error] = caught
    assert isinstance(error, EnvStepError) and "use_mp=True" in str(error)
    assert isinstance(error.__cause__, ValueError)


def test_math_with_a_grader_process_steps_from_threads_and_closes(tmp_path):
    import multiprocessing

    data = write_rows(tmp_path / "m.jsonl", MATH_ROWS[:1])
    before = set(multiprocessing.active_children())
    from datasets import Dataset

    envs = [make_env("math", seed=s, math_data=data, use_mp=True) for s in range(2)]
    # a GEM id built by gem.make itself (the user's dataset) grades there too
    envs.append(make_env("eval:MATH500", seed=0, dataset=Dataset.from_list(MATH_ROWS[:1]), use_mp=True))
    rewards = []

    def play(env):
        env.reset()
        rewards.append(env.step("\\boxed{5}")[1])

    for env in envs:
        worker = threading.Thread(target=play, args=(env,))
        worker.start()
        worker.join(30)
    assert rewards == [1.0, 1.0, 1.0]
    assert len(set(multiprocessing.active_children()) - before) == 1  # one grader for all envs, not one each
    envs[0].close()
    envs[0].close()  # twice: still one share released
    assert len(set(multiprocessing.active_children()) - before) == 1  # the other envs still grade there
    for env in envs[1:]:
        env.close()
    assert set(multiprocessing.active_children()) - before == set()


def _slow_grade(answer, truth):
    import time

    time.sleep(30 if answer == "hang" else 0)
    return answer == truth


def test_a_grading_that_times_out_scores_0_and_the_next_one_gets_a_fresh_worker(tmp_path):
    data = write_rows(tmp_path / "m.jsonl", MATH_ROWS[:1])
    env = make_env("math", seed=0, math_data=data, use_mp=True)
    inner = env.unwrapped
    inner.check_correct = _slow_grade  # GEM grades check_correct(action, answer) in the worker
    inner.answer = "5"
    results = []

    def play(action):
        results.append(inner.step(action)[1])

    for action in ("hang", "5"):
        worker = threading.Thread(target=play, args=(action,))
        worker.start()
        worker.join(30)
    assert results == [0, 1.0]  # without the new worker the second would wait behind the first and time out
    env.close()


def test_a_late_timeout_does_not_kill_the_worker_that_replaced_its_own():
    """A grading waits on a worker that another timeout already replaced: its own timeout ends nothing but its
    worker. The healthy worker's grading completes (before: the current worker was terminated, whichever it
    was, and that grading failed too)."""
    import time as _time

    from oat_dppo.envs.grader_process import SharedGrader

    grader = SharedGrader()
    handle = grader.handle()
    stuck = handle.apply_async(_time.sleep, (60,))
    grader.restart()  # as a first timeout does
    healthy = handle.apply_async(_time.sleep, (1,))
    with pytest.raises(multiprocessing.TimeoutError):
        stuck.get(timeout=0.2)
    assert healthy.get(timeout=20) is None
    handle.close()


def _alive(pid: int) -> bool:
    """Running, not a zombie awaiting its reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_the_grader_process_ends_with_the_process_that_made_it(tmp_path):
    """A stopped actor leaves no grader behind (SIGKILL: no atexit, no finalizer runs)."""
    import signal
    import subprocess

    data = write_rows(tmp_path / "m.jsonl", MATH_ROWS[:1])
    code = (
        "import sys, threading, time\n"
        "from oat_dppo.envs import make_env\n"
        "from oat_dppo.envs.grader_process import _GRADERS\n"
        f"env = make_env('math', seed=0, math_data={str(data)!r}, use_mp=True)\n"
        "env.reset()\n"
        "t = threading.Thread(target=lambda: env.step('\\\\boxed{5}')); t.start(); t.join()\n"
        "[g] = _GRADERS.values(); print(*g.worker_pids(), flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        [grader] = [int(p) for p in child.stdout.readline().split()]
        assert _alive(grader)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(grader):
            time.sleep(0.1)
        if _alive(grader):
            pytest.fail(f"grader {grader} outlived its parent")
    finally:
        child.kill()


def test_procedural_math_offline_and_seeded():
    env = make_env("math:procedural", seed=4)
    obs, _ = env.reset()
    question = obs[len("Question: "):obs.index("\nPlease reason")]
    assert re.search(r"Calculate|Solve for", question)
    answer = env.unwrapped.answer
    assert env.step(f"\\boxed{{{answer}}}")[1] == 1.0
    env.reset()
    assert env.step(f"\\boxed{{{int(env.unwrapped.answer) + 1}}}")[1] == 0.0

    def questions(seed):
        e = make_env("math:procedural", seed=seed)
        return [e.reset()[0] for _ in range(5)]

    assert questions(4) == questions(4)
    assert questions(4) != questions(5)
    only_equations = make_env("math:procedural", seed=0, tasks="simple_equations", size=20)
    assert "Solve for" in only_equations.reset()[0]


def test_hub_math_id_offline_fails_at_once_with_a_clear_message():
    # A fresh process: HF_HUB_OFFLINE is read when huggingface_hub and datasets are imported.
    code = (
        "from conftest import refuse_network; attempts = []; refuse_network(attempts)\n"
        "from oat_dppo.envs import make_env, DatasetUnavailableError\n"
        "try:\n    make_env('math:Math12K', seed=0)\n"
        "except DatasetUnavailableError as e:\n    print(len(attempts)); print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    attempts, message = out.stdout.split("\n", 1)
    assert attempts == "0"  # offline: no lookup, no retries, so nothing to wait for
    assert "axon-rl/MATH-12k" in message and "offline mode is on" in message
    assert "--env math --math-data FILE" in message and "math:procedural" in message


def test_hub_math_id_without_network_fails_at_once(monkeypatch, network_attempts):
    monkeypatch.setattr(hub, "hub_offline", lambda: False)
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(DatasetUnavailableError, match="cannot be reached") as err:
        make_env("eval:MATH500", seed=0)
    assert "--math-data" in str(err.value)
    assert 1 <= len(network_attempts) <= 2, network_attempts  # it tried, and gave up without retrying


# ---------------------------------------------------------------- import-path environments
def test_import_path_env_multi_turn_with_adapter_truncation():
    env = make_env("test_envs_helpers:CountdownEnv", seed=7, max_turns=3)
    assert env.unwrapped.init_seed == 7  # the seed reaches a factory that accepts one
    obs, info = env.reset(seed=5)
    assert obs == "[countdown] Guess a number between 1 and 9.\n"  # no instruction wrapper
    target = env.unwrapped.target
    wrong = 1 if target != 1 else 2
    obs, reward, terminated, truncated, info = env.step(f"\\boxed{{{wrong}}}")
    assert (terminated, truncated, info["well_formed"]) == (False, False, True)
    assert obs.splitlines() == ["Guess a number between 1 and 9.", "higher" if wrong < target else "lower"]
    assert env.step("no idea")[3] is False
    _, _, terminated, truncated, info = env.step("still no idea")
    assert (terminated, truncated, info["turn"]) == (False, True, 3)
    env.reset(seed=5)
    assert env.step(f"\\boxed{{{target}}}")[1:4] == (1.0, True, False)


def test_import_path_factory_and_history_modes():
    env = make_env("test_envs_helpers:make_countdown", seed=1, high=3, history="concat_with_action")
    assert env.unwrapped.high == 3 and env.unwrapped.init_seed is None
    env.reset(seed=0)
    obs = env.step("my guess: \\boxed{9}")[0]
    assert obs.splitlines() == ["Guess a number between 1 and 3.", "my guess: \\boxed{9}", "lower"]
    last = make_env("test_envs_helpers:CountdownEnv", seed=1, history="last")
    last.reset(seed=0)
    assert last.step("\\boxed{9}")[0] == "lower\n"


def test_import_path_env_error_contract():
    env = make_env("test_envs_helpers:CountdownEnv", seed=0)
    env.reset(seed=5)
    assert env.step("\\boxed{0}")[2:4] == (False, False)  # a wrong guess: the episode goes on
    with pytest.raises(EnvStepError, match="ZeroDivisionError") as err:
        env.step("CRASH")
    assert err.value.turn == 2
    assert isinstance(err.value.__cause__, ZeroDivisionError)
    assert err.value.env_id == "test_envs_helpers:CountdownEnv"
    with pytest.raises(RuntimeError, match="reset"):
        env.step("\\boxed{1}")  # the episode is over
    env.reset()  # ...and the env is usable again
    assert env.step("\\boxed{0}")[1] == 0.0

    bad = make_env("test_envs_helpers:BytesObsEnv", seed=0)
    bad.reset()
    with pytest.raises(EnvStepError, match="not str"):
        bad.step("x")


def test_import_path_env_global_random_is_isolated_and_reproducible():
    def play_interleaved(*envs, steps=3):
        # reset all, then step them in turns: each draw must come from the env's own stream
        logs = [[env.reset()[0]] for env in envs]
        for _ in range(steps):
            for env, log in zip(envs, logs):
                log.append(env.step("x")[0].splitlines()[-1])
        return logs

    a, b = (make_env("test_envs_helpers:GlobalRandomEnv", seed=3) for _ in range(2))
    log_a, log_b = play_interleaved(a, b)
    assert log_a == log_b and len(set(log_a)) == len(log_a)
    [alone] = play_interleaved(make_env("test_envs_helpers:GlobalRandomEnv", seed=3))
    assert alone == log_a
    [other] = play_interleaved(make_env("test_envs_helpers:GlobalRandomEnv", seed=4))
    assert other != log_a


@pytest.mark.parametrize(
    "env_id, error, pattern",
    [
        ("test_envs_helpers:NoSuchEnv", UnknownEnvError, "has no attribute"),
        ("no_such_package.envs:Env", UnknownEnvError, "no module named 'no_such_package'"),
        ("test_envs_helpers:NOT_AN_ENV", UnknownEnvError, "not a class or factory"),
        ("test_envs_helpers:NoSeedResetEnv", TypeError, r"reset\(\) must accept seed="),
    ],
)
def test_import_path_bad_targets(env_id, error, pattern):
    with pytest.raises(error, match=pattern):
        make_env(env_id, seed=0)


# ---------------------------------------------------------------- ids, presets, CLI
@pytest.mark.parametrize(
    "env_id, expected",
    [("game:Sudoku-v0-eazy", "game:Sudoku-v0-easy"), ("rg:arc1d", "rg:arc_1d"),
     ("math:procedual", "math:procedural"), ("rg:ACRE", "rg:acre")],
)
def test_unknown_id_suggests_the_closest_ids(env_id, expected, network_attempts):
    with pytest.raises(UnknownEnvError) as err:
        make_env(env_id, seed=0)
    assert network_attempts == []  # the suggestion comes from the local registry
    message = str(err.value)
    assert isinstance(err.value, ValueError)
    assert repr(env_id) in message and "python -m oat_dppo.envs --list" in message
    closest = message.split("Closest known ids: ")[1].split(".")[0]
    assert expected in closest.split(", ")


def test_known_ids_and_presets():
    ids = known_env_ids()
    assert set(FIRST_CLASS_ENV_IDS) <= set(ids)
    assert {"math:Math12K", "eval:MATH500", "game:Wordle-v0-easy", "rg:basic_arithmetic"} <= set(ids)
    assert len(ids) > 150
    for env_id in FIRST_CLASS_ENV_IDS:
        preset = get_preset(env_id)
        assert preset.first_class and preset.template in TEMPLATES and preset.max_new_tokens > 0
        assert preset.multi_turn == (env_id.startswith("game:") or preset.family == "smoke")
        assert (preset.max_turns > 1) == preset.multi_turn
        assert preset.eval_seed_offset > 10**5
    assert get_preset("game:GuessTheNumber-v0-easy").max_turns == 4  # from GEM's registration
    assert get_preset("my.pkg:Env").obs_prefix == ""
    # Non-math hub ids keep their graders' answer formats.
    assert get_preset("qa:HotpotQA").action_format == "answer_tag"
    assert get_preset("code:Taco8k").action_format == "code"
    assert get_preset("logic:RuleTaker-d0").action_format == "boxed"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    # --show resolves the run's template (imports torch and transformers: ~7 s idle, far more when the
    # machine is shared)
    return subprocess.run([sys.executable, "-m", "oat_dppo.envs", *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=child_env())


def test_cli_list():
    out = run_cli("--list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for env_id in FIRST_CLASS_ENV_IDS:
        assert f"  * {env_id}" in lines
    assert "    rg:basic_arithmetic" in lines and "    math:Math12K" in lines
    assert any(line.startswith("game (") for line in lines)
    assert any(line.startswith("eval (") and "--math-data" in line for line in lines)


def test_cli_help_imports_nothing_heavy():
    out = run_cli("--help")
    assert out.returncode == 0 and "--list" in out.stdout
    probe = ("import sys, oat_dppo.envs; "
             "print(sorted(m for m in ('torch', 'transformers', 'gem', 'datasets') if m in sys.modules))")
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=60, cwd=REPO, env=child_env())
    assert imported.stdout.strip() == "[]", imported.stderr
    show = run_cli("--show", "rg:acre")
    assert show.returncode == 0 and "'size': 2000" in show.stdout


def test_cli_show_names_the_template_the_run_uses_and_for_which_model(capsys):
    """Not the preset's hint (qwen3, the paper's model): the template --template auto resolves to for
    the main command's --model (default smollm2: chatml), or for the --model given."""
    from oat_dppo.config import TrainConfig
    from oat_dppo.envs.__main__ import main as envs_main

    def template_line(*args: str) -> str:
        assert envs_main(["--show", "game:GuessTheNumber-v0-easy", *args]) == 0
        return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("template "))

    assert TrainConfig().model == "smollm2"
    line = template_line()
    assert "'chatml'" in line and "--model smollm2" in line and "qwen3" not in line, line
    line = template_line("--model", "Qwen/Qwen3-1.7B")
    assert "'qwen3'" in line and "--model Qwen/Qwen3-1.7B" in line, line
    assert "'llama3'" in template_line("--model", "tiny-llama")


# ---------------------------------------------------------------- templates
OBS = "Observation: board\nPlease reason step by step, and put your final answer within \\boxed{}."


def test_templates_render_family_markup():
    assert render_prompt("qwen3", OBS) == f"<|im_start|>user\n{OBS}<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt("chatml", OBS, system="Be brief.") == (
        f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{OBS}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_prompt("qwen3_nothink", OBS).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render_prompt("llama3", OBS) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
        f"{OBS}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" in render_prompt(
        "llama3", OBS, system="Be brief.")
    raw = render_prompt("raw", OBS)
    assert "<|" not in raw and raw.endswith(f"User: {OBS}\nAssistant:")
    assert render_prompt("none", OBS) == OBS
    assert stop_strings("llama3") == ("<|eot_id|>",) and stop_strings("qwen3") == ("<|im_end|>",)


def test_raw_template_starts_with_the_bos_a_base_tokenizer_adds_itself():
    """Prompts are encoded without special tokens: Llama-3 / OctoThinker base models get their BOS
    from the raw template; tokenizers that add none (Qwen, SmolLM2, byte-level) get none."""
    from oat_dppo.models import qwen_tokenizer, tiny_tokenizer

    llama = tiny_tokenizer("llama")
    ids = llama(render_prompt("raw", OBS, llama), add_special_tokens=False)["input_ids"]
    assert ids[0] == llama.bos_token_id and ids.count(llama.bos_token_id) == 1
    assert ids == llama(render_prompt("raw", OBS), add_special_tokens=True)["input_ids"]
    for tok in (tiny_tokenizer("qwen3"), qwen_tokenizer()):
        assert render_prompt("raw", OBS, tok) == render_prompt("raw", OBS)


def test_game_preset_with_qwen3_reproduces_gems_qwen3_game_prompt():
    env = make_env("game:Sudoku-v0-easy", seed=0)
    obs, _ = env.reset()
    body = obs[len(get_preset("game:Sudoku-v0-easy").obs_prefix):-len(get_preset("game:Sudoku-v0-easy").obs_suffix)]
    gem_qwen3_game = (
        "<|im_start|>user\nYou are playing language games. Make valid actions to win.\n"
        f"Observation: {body}"
        "\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render_prompt("qwen3", obs) == gem_qwen3_game


def test_unknown_template_lists_choices():
    with pytest.raises(ValueError, match="choose from: qwen3, qwen3_nothink, llama3, chatml, raw, tokenizer"):
        render_prompt("qwen4", OBS)


CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def chatml_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {s: i for i, s in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tk.add_special_tokens(specials)
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHATML
    return tok


def test_tokenizer_template_uses_the_chat_template(chatml_tokenizer):
    assert render_prompt("tokenizer", OBS, chatml_tokenizer) == render_prompt("chatml", OBS)
    assert render_prompt("tokenizer", OBS, chatml_tokenizer, system="S") == render_prompt("chatml", OBS, system="S")
    with pytest.raises(ValueError, match="needs a tokenizer"):
        render_prompt("tokenizer", OBS)
    chatml_tokenizer.chat_template = None
    try:
        with pytest.raises(ValueError, match="pick a template by name"):
            render_prompt("tokenizer", OBS, chatml_tokenizer)
    finally:
        chatml_tokenizer.chat_template = CHATML


# ---------------------------------------------------------------- action extraction
@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{{a}{b}}", "{a}{b}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{1 2 3} and \\boxed{4 5 6} trailing", "4 5 6"),
        ("\\boxed{}", ""),
        ("no answer here", None),
        ("\\boxed{1} then a broken \\boxed{2", None),  # GEM: only the last box counts
        ("\\boxed 5", None),
        ("\\boxed {5}", None),
        ("\\fbox{5}", None),
        ("", None),
    ],
)
def test_extract_action_cases(text, expected):
    assert extract_action(text) == expected


def test_well_formed_pattern():
    pattern = get_preset("game:Sudoku-v0-easy").action_pattern
    assert is_well_formed("\\boxed{1 2 3}", "boxed", pattern)
    assert not is_well_formed("\\boxed{1 2}", "boxed", pattern)
    assert not is_well_formed("\\boxed{1  2 3}", "boxed", pattern)  # GEM wants one space
    assert is_well_formed("```python\nprint(1)\n```", "code") and not is_well_formed("print(1)", "code")
    assert is_well_formed("<answer>x</answer>", "answer_tag") and is_well_formed("anything", "any")
    with pytest.raises(ValueError, match="action_format"):
        is_well_formed("x", "json")


_no_box = st.text().filter(lambda s: "\\boxed" not in s)
_balanced = st.recursive(
    st.text(alphabet=st.characters(blacklist_characters="{}\\")),
    lambda inner: st.lists(inner.map(lambda s: "{" + s + "}") | inner, max_size=3).map("".join),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(prefix=_no_box, answer=_balanced, tail=st.text(alphabet="abc ;.\n"))
def test_extract_action_finds_an_appended_box(prefix, answer, tail):
    assert extract_action(f"{prefix}\\boxed{{{answer}}}{tail}") == answer
    assert extract_action(prefix) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["\\boxed", "{", "}", "x", " ", "\\fbox", "\\"]), max_size=12).map("".join))
def test_extract_action_agrees_with_gem(text):
    from gem.utils.parsing import extract_last_boxed_answer

    assert extract_action(text) == extract_last_boxed_answer(text)


def test_text_env_is_exported_type():
    assert isinstance(make_env("rg:arc_1d", seed=0), TextEnv)


@pytest.mark.parametrize(
    "options, pattern",
    [({"history": "full"}, "history must be one of"), ({"max_turns": 0}, "max_turns must be >= 1"),
     ({"action_format": "json"}, "action_format must be one of"), ({"data_seed": -1}, "data_seed")],
)
def test_bad_adapter_options_fail_before_building(options, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_env("game:Sudoku-v0-easy", seed=0, **options)


def test_partial_credit_false_makes_a_near_miss_worth_nothing():
    """GEM's GuessTheNumber pays 1 - distance / range when the turns run out; `partial_credit=false` pays 0
    there and keeps a win's 1 and a format failure's penalty."""
    rewards = {}
    for credit in (True, "false"):
        env = make_env("game:GuessTheNumber-v0-easy", seed=0, partial_credit=credit)
        env.reset(seed=4)
        got = [env.step("\\boxed{1}")[1] for _ in range(4)]  # never the target of seed 4
        rewards[credit] = got[-1]
        env.reset(seed=2)
        assert env.step("\\boxed{1}")[1] == 1.0  # seed 2's target is 1: a win pays 1 either way
        env.close()
    assert 0.0 < rewards[True] < 1.0 and rewards["false"] == 0.0
    with pytest.raises(ValueError, match="partial_credit must be true or false"):
        make_env("game:GuessTheNumber-v0-easy", seed=0, partial_credit="maybe")
