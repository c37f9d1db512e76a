"""Named splits (oat_dppo.envs.splits): a task's split is a hash of what identifies it, and an env built for a
split plays only its tasks, on every env family the mission names and on both key kinds."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oat_dppo.envs import make_env
from oat_dppo.envs.adapter import TextEnv
from oat_dppo.envs.splits import SplitExhausted, split_of, split_seeds, task_key
from oat_dppo.seeds import derive_seed


def first_observations(env_id: str, split: str | None, n: int, *, base: int = 0, **options) -> list[tuple[int, str]]:
    """(the seed that drew it, the task's text) of n episodes asked for with seeds base..base+n-1."""
    env = make_env(env_id, seed=0, split=split, **options)
    try:
        out = []
        for i in range(n):
            _, info = env.reset(seed=base + i)
            inner_obs = env._observations[0]
            out.append((info["episode_seed"], f"{info.get('prefix', '')}{inner_obs}{info.get('suffix', '')}"))
        return out
    finally:
        env.close()


@given(st.text(min_size=0, max_size=40))
def test_split_of_is_a_function_of_the_key(key):
    assert split_of(key) == split_of(str(key)) in ("train", "validation", "test")


def test_split_shares():
    counts = {"train": 0, "validation": 0, "test": 0}
    for i in range(16_000):
        counts[split_of(f"k{i}")] += 1
    # 1/16 each for test and validation: 1000 expected, sd ~31
    assert 850 < counts["test"] < 1150 and 850 < counts["validation"] < 1150


@pytest.mark.parametrize("env_id", ["game:Sudoku-v0-easy", "rg:acre", "rg:arc_1d", "math:procedural"])
def test_an_env_plays_only_its_splits_tasks(env_id):
    """By the task's text: every task a split's env draws is in that split. Without a split, the same seeds
    draw tasks of every split (what a run trained on before the splits existed)."""
    for split in ("train", "validation", "test"):
        drawn = first_observations(env_id, split, 24)
        assert {split_of(text) for _, text in drawn} == {split}, split
    unsplit = {split_of(text) for _, text in first_observations(env_id, None, 200)}
    assert unsplit == {"train", "validation", "test"}


def test_test_boards_are_disjoint_from_training_and_validation_boards():
    train = {t for _, t in first_observations("game:Sudoku-v0-easy", "train", 300)}
    validation = {t for _, t in first_observations("game:Sudoku-v0-easy", "validation", 60, base=10**6)}
    test = {t for _, t in first_observations("game:Sudoku-v0-easy", "test", 60, base=2 * 10**6)}
    assert not (train & test) and not (train & validation) and not (validation & test)
    assert len(test) == 60  # and the test split is not one board repeated


def test_demonstrations_never_show_a_test_or_validation_board():
    """A warm start's demonstrator plays the run's training envs: every board it is shown is a training board."""
    from oat_dppo.agent.loop import PromptFormat
    from oat_dppo.components import build_envs
    from oat_dppo.config import TrainConfig
    from oat_dppo.models import load_tokenizer
    from oat_dppo.warm_start import collect

    cfg = TrainConfig(env="game:Sudoku-v0-easy", model="smollm2", warm_start="demo:board_rules", warm_start_episodes=12,
                      env_option=("history=last",), max_turns=2)
    envs = build_envs(cfg, 6, split="train")
    try:
        prompt = PromptFormat(load_tokenizer("smollm2"), "chatml", None, "")
        episodes, _ = collect(cfg, engine=None, envs=envs, prompt=prompt, max_new_tokens=12)
    finally:
        for env in envs:
            env.close()
    assert len(episodes) == 12
    for episode in episodes:
        board = first_observations("game:Sudoku-v0-easy", None, 1, base=episode.info["task_seed"])[0][1]
        assert split_of(board) == "train"


def test_seed_keyed_envs_split_by_seed():
    """GuessTheNumber shows the same first text for every hidden number: its seed is the task's key."""
    for split in ("train", "test"):
        for seed, _ in first_observations("game:GuessTheNumber-v0-easy", split, 40):
            assert split_of(task_key("seed", seed=seed, observation="")) == split


def test_a_shared_seed_still_means_a_shared_task():
    """Group baselines: two instances asked for one seed play one task, the redraws included."""
    a = first_observations("game:Sudoku-v0-easy", "test", 8)
    b = first_observations("game:Sudoku-v0-easy", "test", 8)
    assert a == b
    replay = make_env("game:Sudoku-v0-easy", seed=5, split=None)
    assert replay.reset(seed=a[3][0])[1]["suffix"] == json.loads(json.dumps(
        make_env("game:Sudoku-v0-easy", seed=9, split="test").reset(seed=3)[1]["suffix"]))


def test_a_constant_first_observation_cannot_be_split_by_it():
    env = make_env("game:GuessTheNumber-v0-easy", seed=0)
    keyed_by_text = TextEnv(env.unwrapped, env_id=env.env_id, seed=0, preset=replace(env.preset, split_key="observation"),
                            max_turns=4, split="test" if split_of(env.reset(seed=0)[0]) != "test" else "train")
    with pytest.raises(SplitExhausted, match='split_key="seed"'):
        keyed_by_text.reset(seed=1)


def test_split_seeds():
    assert split_seeds("test", 3, run_seed=0) == split_seeds("test", 3, run_seed=7)  # one test set for every run
    assert split_seeds("validation", 3, run_seed=0) != split_seeds("validation", 3, run_seed=7)
    assert split_seeds("test", 2, 0) == [derive_seed("test", 0), derive_seed("test", 1)]
    with pytest.raises(ValueError, match="validation"):
        split_seeds("train", 2, 0)
