"""The package `oat_dppo_envs`: the environment definitions (the project's own `smoke:digits`, the
custom-environment example), and the package list that installs it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import oat_dppo_envs
import pytest
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (.venv-oat)
    import tomli as tomllib

from oat_dppo.envs import get_preset, known_env_ids, make_env
from oat_dppo.main import main

REPO = Path(__file__).resolve().parents[1]


def test_the_definitions_come_from_the_oat_dppo_envs_folder():
    assert Path(oat_dppo_envs.__file__).resolve().parent == REPO / "oat_dppo_envs"
    assert "smoke:digits" in oat_dppo_envs.OWN_ENV_IDS and "smoke:digits" in known_env_ids()
    assert get_preset("game:Sudoku-v0-easy") is oat_dppo_envs.FIRST_CLASS["game:Sudoku-v0-easy"]


def test_pyproject_installs_every_package():
    """The package list is written out: nothing may be missing."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts)
             for top in ("oat_dppo", "oat_dppo_envs") for p in (REPO / top).rglob("__init__.py")}
    assert found == listed


def test_smoke_digits_rewards_the_share_of_digits_over_two_turns():
    env = make_env("smoke:digits", seed=0)
    obs, info = env.reset(seed=5)
    assert "digits" in obs and info["episode_seed"] == 5
    obs, reward, done, truncated, info = env.step("12ab")
    assert reward == 0.5 and not done and info["well_formed"]
    assert "2 digits in 4 characters" in obs  # the second turn sees the first reply
    _, reward, done, _, _ = env.step("x")
    assert reward == 0.0 and done
    env.close()


@pytest.mark.usefixtures("one_thread")
def test_a_tiny_model_gets_gradients_on_smoke_digits(tmp_path):
    """The smoke setting of the docs: rewards vary from the first batch, so advantages and gradients
    are not zero (on GEM games a random tiny model only ever fails the format)."""
    run_dir = tmp_path / "smoke"
    code = main(["--env", "smoke:digits", "--model", "tiny-qwen3", "--engine", "hf", "--episodes-per-iteration", "8",
                 "--iterations", "2", "--eval-every", "0", "--learning-rate", "1e-3", "--threads", "1",
                 "--no-progress", "--log", "none", "--run-dir", str(run_dir)])
    assert code == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["rollout/reward_std"] > 0 and r["train/grad_norm"] > 0 for r in rows)
    assert all(r["rollout/turns_mean"] == 2 and r["rollout/response_tokens_mean"] <= 8 for r in rows)


def test_the_custom_environment_example_runs_as_documented():
    env = make_env("oat_dppo_envs.custom_example:HigherLower", seed=0)
    obs, _ = env.reset(seed=1)
    assert "\\boxed{}" in obs
    secret = env.unwrapped._secret
    _, reward, done, _, info = env.step(f"\\boxed{{{secret}}}")
    assert (reward, done, info["well_formed"], info["success"]) == (1.0, True, True, True)
    env.reset(seed=1)
    _, reward, done, _, info = env.step("no guess")
    assert (reward, done, info["well_formed"]) == (-0.1, True, False)
    # the reward it declares for that is the preset's format-failure floor (study reports: collapse)
    assert get_preset("oat_dppo_envs.custom_example:HigherLower").format_failure_reward == -0.1
    # --max-turns moves the env's own limit too, and the prompt says it; the example is a number
    env = make_env("oat_dppo_envs.custom_example:HigherLower", seed=0, max_turns=4, high=10)
    obs, _ = env.reset(seed=2)
    assert env.unwrapped.max_turns == 4 and "at most 4 turns" in obs and "between 1 and 10" in obs
    assert "\\boxed{N}" not in obs and re.search(r"for example \\boxed\{\d+\}", obs)
    assert get_preset("oat_dppo_envs.smoke:Digits").format_failure_reward == 0.0  # declares none
    assert get_preset("oat_dppo_envs.no_such_module:Env").format_failure_reward == 0.0  # make_env says why
