"""`--env-option NAME=VALUE`: environment settings from the command line, checked before anything runs.

GEM's constructors end in `**_`, so a misspelt option would be ignored silently; `make_env` refuses
any option the constructor does not name. `math:procedural` passes its options to the reasoning-gym
tasks (e.g. single-digit arithmetic, where SmolLM2-135M earns a non-constant reward).
"""

from __future__ import annotations

import json
import re

import pytest

from oat_dppo.config import ConfigError, TrainConfig, env_options, from_dict, to_dict
from oat_dppo.envs import EnvOptionError, make_env
from oat_dppo.main import main

EASY_ARITHMETIC = dict(tasks="basic_arithmetic", max_digits=1, max_terms=2, operators="+,-", allow_parentheses=False,
                       allow_negation=False)


# reasoning-gym's single digits are 1-10: two terms, + or -, no parentheses, no negation.
ONE_DIGIT = re.compile(r"Question: Calculate (10|\d) [+-] (10|\d)\.")


def questions(env, n: int) -> list[str]:
    return [env.reset()[0].split("\n")[0] for _ in range(n)]


def test_procedural_settings_reach_the_reasoning_gym_task():
    env = make_env("math:procedural", seed=0, size=50, **EASY_ARITHMETIC)
    for q in questions(env, 30):
        assert ONE_DIGIT.fullmatch(q), q
    default = make_env("math:procedural", seed=0, size=50, tasks="basic_arithmetic")
    assert any(not ONE_DIGIT.fullmatch(q) for q in questions(default, 30))


def test_sequence_settings_take_comma_separated_numbers():
    env = make_env("math:procedural", seed=0, size=20, tasks="simple_equations", max_terms=2, max_value=10,
                   operators="+,-", operators_weights="0.5,0.5")  # floats, as reasoning-gym's weights must be
    for q in questions(env, 10):
        assert "*" not in q, q
    # reasoning-gym's own check reaches the user: three weights for two operators.
    with pytest.raises(ValueError, match="weights"):
        make_env("math:procedural", seed=0, size=20, tasks="simple_equations", operators="+,-")


def test_procedural_settings_are_checked_against_the_tasks():
    with pytest.raises(ValueError, match=r"no option max_digit: .* are .*max_digits"):
        make_env("math:procedural", seed=0, max_digit=1)
    # A setting of simple_equations is not one of basic_arithmetic's.
    with pytest.raises(ValueError, match="no option min_value"):
        make_env("math:procedural", seed=0, tasks="basic_arithmetic", min_value=3)
    # Shared by both default tasks: each gets it.
    make_env("math:procedural", seed=0, size=10, max_terms=2)


def test_number_answers_refuse_a_copied_expression():
    """GEM grades with math-verify, which evaluates `\\boxed{1 + 9}` to 10: copying the question scores.
    `answer=number` grades only a plain number in the last box."""
    graded = {}
    for rule in ("any", "number"):
        env = make_env("math:procedural", seed=0, size=20, answer=rule, **EASY_ARITHMETIC)
        question = env.reset(seed=3)[0]
        expression = ONE_DIGIT.search(question).group(0).removeprefix("Question: Calculate ").rstrip(".")
        answer = env.unwrapped.answer
        rewards = []
        for action in (f"\\boxed{{{answer}}}", f"\\boxed{{ {answer} }}", f"\\boxed{{{expression}}}",
                       f"\\boxed{{{expression}}} so \\boxed{{{answer}}}", f"\\boxed{{{answer}}} is \\boxed{{{expression}}}",
                       f"{answer}", "\\boxed{x}"):
            env.reset(seed=3)
            rewards.append(env.step(action)[1])
        graded[rule] = rewards
    assert graded["any"] == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert graded["number"] == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0]  # the last box counts, as GEM reads it


def test_gem_constructor_options_pass_and_misspellings_fail():
    env = make_env("game:GuessTheNumber-v0-easy", seed=0, max_number=50)
    assert "between 1 and 50" in env.reset()[0]
    with pytest.raises(EnvOptionError, match="no option max_numbr; its constructor takes max_number, max_turns, "
                                             "min_number"):
        make_env("game:GuessTheNumber-v0-easy", seed=0, max_numbr=50)
    # GEM's reasoning-gym envs take no task settings (its constructor swallows them).
    with pytest.raises(EnvOptionError, match="rg:arc_1d has no option max_size"):
        make_env("rg:arc_1d", seed=0, max_size=12)


def test_env_option_parsing():
    cfg = TrainConfig(env_option=("max_number=50", "operators=+,-", "allow_negation=false"))
    assert env_options(cfg) == {"max_number": 50, "operators": "+,-", "allow_negation": False}
    # A text keeps its line breaks (a suffix on its own line); spaces around a value go.
    spaced = TrainConfig(env_option=("obs_suffix=\nAnswer now.", "history= last ", "max_number= 7"))
    assert env_options(spaced) == {"obs_suffix": "\nAnswer now.", "history": "last", "max_number": 7}
    for bad, message in [(("max_number",), "expected NAME=VALUE"), (("a=1", "a=2"), "a is given twice"),
                         (("max_turns=3",), "use --max-turns"), (("format_penalty=-1",), "use --format-penalty")]:
        with pytest.raises(ConfigError, match=message):
            env_options(TrainConfig(env_option=bad))
    # config.json holds a list; reading it back gives the tuple.
    assert from_dict(json.loads(json.dumps(to_dict(cfg)))).env_option == cfg.env_option


@pytest.mark.parametrize("args, message", [
    (["--env-option", "max_numbr=5"], "error: game:GuessTheNumber-v0-easy has no option max_numbr"),
    (["--env", "math:procedural", "--env-option", "max_digit=1"], "error: math:procedural has no option max_digit"),
    (["--env", "math:procedural", "--env-option", "tasks=simple_equations", "--env-option", "max_value=-3"],
     "error: math:procedural: reasoning-gym's simple_equations refuses max_value=-3: max_value must be >= min_value"),
    (["--env-option", "max_turns=3"], "error: --env-option max_turns: use --max-turns"),
    (["--env", "math:procedural", "--env-option", "answer=digits"],
     "error: --env math:procedural: answer='digits': the grading rule is one of any, number"),
])
def test_a_bad_env_option_is_one_error_and_no_run(tmp_path, capsys, args, message):
    run_dir = tmp_path / "never"
    assert main(["--model", "tiny-qwen3", "--engine", "hf", *args, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith(message), errors
    assert "run dir" not in err  # no directory named for a run that was never built
    assert not run_dir.exists()


@pytest.mark.usefixtures("one_thread")
def test_a_run_records_its_env_options(tmp_path):
    run_dir = tmp_path / "run"
    opts = [f"--env-option={k}={v}" for k, v in EASY_ARITHMETIC.items()]
    assert main(["--model", "tiny-qwen3", "--engine", "hf", "--env", "math:procedural", *opts, "--iterations", "1",
                 "--episodes-per-iteration", "2", "--mini-batch-size", "2", "--micro-batch-size", "2",
                 "--max-new-tokens", "3", "--eval-every", "0", "--log", "none", "--no-progress", "--threads", "1",
                 "--log-episodes", "2", "--run-dir", str(run_dir)]) == 0
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env_option"] == [f"{k}={v}" for k, v in EASY_ARITHMETIC.items()]
    prompts = [json.loads(line)["turns"][0]["prompt"] for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(prompts) == 2 and all(ONE_DIGIT.search(p) for p in prompts)
