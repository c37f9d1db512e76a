"""The main job end to end on real GEM environments with a tiny model: runs, run dirs, resume,
interruption, learning, and bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.child import child_env

from oat_dppo.backends.oat.availability import missing_packages
from oat_dppo.main import main

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model", "tiny-qwen3", "--engine", "hf", "--max-new-tokens", "8", "--threads", "1", "--no-progress", "--log", "none"]


def run_main(tmp_path: Path, *args: str, name: str = "run") -> tuple[int, Path]:
    run_dir = tmp_path / name
    code = main([*TINY, "--run-dir", str(run_dir), *args])
    return code, run_dir


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "env, extra",
    [
        ("game:Sudoku-v0-easy", ["--max-turns", "3"]),
        ("rg:arc_1d", []),
        ("rg:acre", []),
        ("math:procedural", []),
    ],
)
def test_trains_end_to_end_on_gem_envs(tmp_path, env, extra):
    code, run_dir = run_main(tmp_path, "--env", env, "--iterations", "2", "--episodes-per-iteration", "2",
                             "--eval-every", "2", "--eval-episodes", "2", *extra)
    assert code == 0
    rows = metrics(run_dir)
    assert [r["iteration"] for r in rows] == [-1, 0, 1]
    before, rows = rows[0], rows[1:]  # -1: the held-out evaluation before any update, nothing else
    assert "eval/reward_mean" in before and not any(k.startswith(("train/", "rollout/")) for k in before)
    for key in ("rollout/reward_mean", "rollout/success_rate", "rollout/turns_mean", "rollout/uncredited_turn_rate",
                "train/kept_frac", "train/prob_diff_mean", "train/entropy", "time/generate_s", "time/train_s",
                "perf/generated_tokens_per_s"):
        assert key in rows[0], key
    assert "eval/reward_mean" in rows[1] and "eval/reward_mean" not in rows[0]
    # On the first mini-batch pi = mu up to float error: the engine's mu is the learner's pi.
    assert rows[0]["train/prob_diff_max"] < 1e-4
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env"] == env and config["trust_region"] == "dppo_binary_tv"
    assert {p.name for p in (run_dir / "checkpoint").iterdir()} == {"trainable.safetensors", "state.safetensors",
                                                                    "state.json"}
    assert not (run_dir / "checkpoint.prev").exists()  # one complete copy at rest
    assert config["delta"] == 0.2 and config["gamma"] == (0.9 if env.startswith("game") else 1.0)  # effective values
    assert config["max_new_tokens"] == 8 and config["template"] == "chatml" and config["engine"] == "hf"
    assert "_oat_dppo_version" in config and "_git_commit" in config
    assert config["_machine"]["torch"].startswith("torch ") and config["_machine"]["cpu_cores"] >= 1
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert episodes and episodes[0]["turns"][0]["prompt"]


def test_logits_chunk_tokens_changes_memory_not_results(tmp_path):
    """The LM head in 3-token checkpointed blocks trains the same run as one block."""
    dirs = [run_main(tmp_path, "--env", "rg:arc_1d", "--iterations", "2", "--episodes-per-iteration", "4",
                     "--logits-chunk-tokens", chunk, name=f"chunk{chunk}")[1] for chunk in ("0", "3")]
    whole, blocks = ([r for r in metrics(d) if r["iteration"] >= 0] for d in dirs)
    assert [json.loads((d / "config.json").read_text())["logits_chunk_tokens"] for d in dirs] == [0, 3]
    for a, b in zip(whole, blocks):
        assert a["train/train_tokens"] == b["train/train_tokens"] > 3  # more tokens than one block
        for key in a:
            if key.startswith(("train/", "rollout/reward")):
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def test_offline_math_file(tmp_path):
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(20)))
    code, run_dir = run_main(tmp_path, "--env", "math", "--math-data", str(data), "--iterations", "1",
                             "--episodes-per-iteration", "2", "--eval-every", "0")
    assert code == 0 and len(metrics(run_dir)) == 1
    assert "rollout/repeat_rate" not in metrics(run_dir)[0]  # one turn per episode: nothing to repeat


def test_multi_turn_sudoku_plays_every_turn(tmp_path):
    # A pre-filled well-formed move keeps a random model in the game: every episode runs to max_turns,
    # and the observation grows turn by turn (history + the board).
    code, run_dir = run_main(tmp_path, "--env", "game:Sudoku-v0-easy", "--response-prefix", "\\boxed{1 1 1} ",
                             "--max-turns", "3", "--iterations", "1", "--episodes-per-iteration", "2", "--eval-every", "0")
    assert code == 0
    row = metrics(run_dir)[0]
    assert row["rollout/turns_mean"] == 3 and 0.0 <= row["rollout/repeat_rate"] <= 1.0
    ep = json.loads((run_dir / "episodes.jsonl").read_text().splitlines()[0])
    prompts = [t["prompt"] for t in ep["turns"]]
    assert len(prompts) == 3 and len(prompts[0]) < len(prompts[1]) < len(prompts[2])
    assert "Here is the current board layout" in prompts[2]
    assert all(t["well_formed"] for t in ep["turns"])


def test_reward_rises_on_a_small_task(tmp_path):
    code, run_dir = run_main(tmp_path, "--env", "helpers.toy_envs:DigitsEnv", "--iterations", "10",
                             "--episodes-per-iteration", "16", "--learning-rate", "3e-3", "--mini-batch-size", "8",
                             "--micro-batch-size", "8", "--eval-every", "0", "--template", "none")
    assert code == 0
    rewards = [r["rollout/reward_mean"] for r in metrics(run_dir)]
    assert rewards[0] < 0.2
    assert sum(rewards[-2:]) / 2 > rewards[0] + 0.2, rewards


def test_resume_refuses_options_that_would_change_the_run_and_keeps_the_others(tmp_path):
    code, run_dir = run_main(tmp_path, "--env", "rg:arc_1d", "--iterations", "1", "--episodes-per-iteration", "2",
                             "--eval-every", "0")
    assert code == 0
    p = cli("--resume", str(run_dir), "--iterations", "2", "--learning-rate", "0.5", "--trust-region", "pg_is")
    assert p.returncode == 2 and "--trust-region, --learning-rate cannot change" in p.stderr
    assert len(metrics(run_dir)) == 1  # nothing ran
    p = cli("--resume", str(run_dir))  # all iterations done
    assert p.returncode == 0 and "nothing to do" in p.stderr and "raise --iterations" in p.stderr
    assert main(["--resume", str(run_dir), "--iterations", "2", "--threads", "1", "--no-progress"]) == 0
    assert [r["iteration"] for r in metrics(run_dir)] == [0, 1]
    assert json.loads((run_dir / "config.json").read_text())["iterations"] == 2


def test_no_progress_prints_a_line_per_iteration_and_no_deepspeed_chatter(tmp_path):
    """Batch jobs get a text log; DeepSpeed (installed beside the project for the Oat profile) says nothing."""
    p = cli(*TINY, "--run-dir", str(tmp_path / "r"), "--env", "smoke:digits", "--iterations", "2",
            "--episodes-per-iteration", "2", "--eval-every", "0", "--no-keep-checkpoint")
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [line for line in p.stderr.splitlines() if line.startswith("iteration ")]
    assert len(lines) == 2 and lines[0].startswith("iteration 1/2: reward ") and "kept" in lines[0] and " s" in lines[0]
    assert "mismatch 0.0000" in lines[0] and "|pi-mu|" in lines[0]  # the learner's own model samples: no mismatch
    assert "DeepSpeed" not in p.stderr + p.stdout and "real_accelerator" not in p.stderr + p.stdout
    assert not (tmp_path / "r" / "checkpoint").exists()  # --no-keep-checkpoint: deleted at the end


def test_learning_rate_schedule_is_logged_and_follows_the_iterations(tmp_path):
    code, run_dir = run_main(tmp_path, "--env", "smoke:digits", "--iterations", "4", "--episodes-per-iteration", "2",
                             "--eval-every", "0", "--learning-rate", "1e-3", "--lr-schedule", "cosine",
                             "--lr-warmup-iterations", "1")
    assert code == 0
    lrs = [r["train/lr"] for r in metrics(run_dir)]
    assert lrs[0] == pytest.approx(5e-4) and lrs[1] == pytest.approx(1e-3)  # warm-up, then the peak
    assert lrs[1] > lrs[2] > lrs[3] > 0  # cosine decay over the remaining iterations


def _comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(("time/", "perf/")) and k != "wall_time"}


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    common = ["--env", "rg:arc_1d", "--episodes-per-iteration", "4", "--mini-batch-size", "2", "--micro-batch-size", "2",
              "--learning-rate", "1e-3", "--eval-every", "2", "--eval-episodes", "2", "--save-every", "1"]
    code, full = run_main(tmp_path, *common, "--iterations", "4", name="full")
    assert code == 0
    code, part = run_main(tmp_path, *common, "--iterations", "2", name="part")
    assert code == 0
    assert main(["--resume", str(part), "--iterations", "4"]) == 0
    a, b = metrics(full), metrics(part)
    assert [r["iteration"] for r in b] == [-1, 0, 1, 2, 3]  # -1: the evaluation before the first update, once
    assert [_comparable(r) for r in a] == [_comparable(r) for r in b]


def test_save_every_0_checkpoints_only_at_the_end(tmp_path):
    code, run_dir = run_main(tmp_path, "--env", "rg:arc_1d", "--iterations", "2", "--episodes-per-iteration", "2",
                             "--mini-batch-size", "2", "--micro-batch-size", "2", "--eval-every", "0", "--save-every", "0")
    assert code == 0
    state = json.loads((run_dir / "checkpoint" / "state.json").read_text())
    assert state["iteration"] == 1  # the last iteration's, written once at the end


def test_env_errors_lose_only_their_episodes(tmp_path):
    code, run_dir = run_main(tmp_path, "--env", "helpers.toy_envs:FlakyEnv", "--iterations", "1",
                             "--episodes-per-iteration", "8", "--eval-every", "0", "--template", "none")
    assert code == 0
    row = metrics(run_dir)[0]
    assert row["rollout/env_errors"] > 0
    assert row["rollout/episodes"] == 8 - row["rollout/env_errors"]


# ---- bad input, in a subprocess: exit status and message ----------------------------------------
def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oat_dppo.main", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=child_env())


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--env", "game:Sudok-v0-easy"], ["game:Sudoku-v0-easy", "python -m oat_dppo.envs --list"]),
        (["--trust-region", "dppo_binary_tvv"], ["did you mean 'dppo_binary_tv'"]),
        (["--temperature", "0.7"], ["temperature 1"]),
        (["--trust-region", "ppo_clip", "--delta", "0.2"], ["does not take 'delta'"]),
        (["--delta", "-1"], ["delta must be >= 0"]),
        (["--logits-chunk-tokens", "-1"], ["--logits-chunk-tokens must be >= 0"]),
        (["--reply-effect-turns", "-1"], ["--reply-effect-turns must be >= 0"]),
        pytest.param(["--backend", "oat"], ["--backend oat needs", "docs/oat.md"],
                     marks=pytest.mark.skipif(not missing_packages(), reason="Oat's stack is installed here (.venv-oat)")),
        (["--env", "math"], ["--math-data"]),
        (["--model", "no-such-org/no-such-model"], ["no-such-org/no-such-model"]),
        (["--mini-batch-size", "3", "--micro-batch-size", "2"], ["must be a multiple of --micro-batch-size 2"]),
        (["--tr-param", "delta"], ["expected NAME=VALUE"]),
        (["--tr-param", "delta=0.1", "--delta", "0.2"], ["delta is already set"]),
        (["--tr-param", "beta=1"], ["does not take 'beta'"]),
        (["--tr-param", "delta=abc"], ["--tr-param delta=abc: 'abc' is not a number"]),
        (["--lora-rank", "4", "--trainable-layers", "2"], ["--lora-rank 4 with --trainable-layers 2", "give one"]),
        (["--model", "smolm2", "--env", "rg:arc_1dd"], ["did you mean 'smollm2'", "rg:arc_1d"]),
    ],
)
def test_bad_input_exits_2_with_a_clear_message_and_writes_nothing(tmp_path, args, needles):
    p = cli(*TINY, "--run-dir", str(tmp_path / "r"), *args)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    for n in needles:
        assert n in p.stderr, (n, p.stderr[-1500:])
    assert not (tmp_path / "r").exists()  # validated before anything was created


def test_one_optimizer_step_per_rollout_is_said(tmp_path, capsys):
    """A mini-batch that holds the whole rollout gives one optimizer step: pi = pi_old throughout, so
    the trust region can act on the mismatch only. Said once, not silently accepted."""
    code, _ = run_main(tmp_path, "--env", "rg:arc_1d", "--iterations", "2", "--episodes-per-iteration", "2",
                       "--mini-batch-size", "64", "--micro-batch-size", "2", "--eval-every", "0")
    assert code == 0
    err = capsys.readouterr().err
    assert err.count("note: this rollout has 2 turns and --mini-batch-size is 64: one optimizer step") == 1, err


def test_math_data_directory_without_a_dataset_is_one_clear_line(tmp_path):
    """--math-data naming a directory that holds no saved dataset: exit 2 and one `error:` line
    (not datasets' FileNotFoundError traceback, exit 1)."""
    (tmp_path / "data").mkdir()
    p = cli(*TINY, "--run-dir", str(tmp_path / "r"), "--env", "math", "--math-data", str(tmp_path / "data"))
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == p.stderr.strip().splitlines()[-1], p.stderr
    assert f"{tmp_path / 'data'} is a directory but not a saved dataset" in errors[0]
    assert not (tmp_path / "r").exists()


def test_unwritable_run_dir(tmp_path):
    # A path below a regular file cannot be created, even by root.
    (tmp_path / "file").write_text("x")
    p = cli(*TINY, "--run-dir", str(tmp_path / "file" / "run"), "--env", "rg:arc_1d")
    assert p.returncode == 2 and "cannot write to run directory" in p.stderr


def test_resume_without_checkpoint_or_config(tmp_path):
    p = cli("--resume", str(tmp_path / "nothing"))
    assert p.returncode == 2 and "does not exist" in p.stderr
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env": "rg:arc_1d", "model": "tiny-qwen3", "log": "none"}))
    p = cli("--resume", str(run))
    assert p.returncode == 2 and "has no checkpoint yet" in p.stderr


def test_a_save_cut_short_falls_back_to_the_previous_checkpoint(tmp_path):
    """A crash while a new checkpoint is swapped in leaves the old one as checkpoint.prev and a
    broken new one: --resume uses the old one and redoes the iteration after it."""
    code, run_dir = run_main(tmp_path, "--env", "rg:arc_1d", "--iterations", "1", "--episodes-per-iteration", "2",
                             "--eval-every", "0")
    assert code == 0
    (run_dir / "checkpoint").rename(run_dir / "checkpoint.prev")  # iteration 0's checkpoint
    (run_dir / "checkpoint").mkdir()
    (run_dir / "checkpoint" / "state.json").write_text('{"format": 2, "iter')  # the cut-short new one
    assert main(["--resume", str(run_dir), "--iterations", "2"]) == 0
    assert [r["iteration"] for r in metrics(run_dir)] == [0, 1]
    assert not (run_dir / "checkpoint.prev").exists()


def test_a_corrupt_only_checkpoint_is_one_clear_line(tmp_path):
    code, run_dir = run_main(tmp_path, "--env", "rg:arc_1d", "--iterations", "1", "--episodes-per-iteration", "2",
                             "--eval-every", "0")
    (run_dir / "checkpoint" / "trainable.safetensors").write_bytes(b"not a checkpoint")
    p = cli("--resume", str(run_dir), "--iterations", "2")
    assert p.returncode == 2 and "no usable checkpoint" in p.stderr and len(p.stderr.strip().splitlines()) == 2


def test_existing_run_dir_is_not_overwritten(tmp_path):
    code, run_dir = run_main(tmp_path, "--env", "rg:arc_1d", "--iterations", "1", "--episodes-per-iteration", "2",
                             "--eval-every", "0")
    assert code == 0
    p = cli(*TINY, "--run-dir", str(run_dir), "--env", "rg:arc_1d")
    assert p.returncode == 2 and "--resume" in p.stderr


def test_sigint_before_the_first_checkpoint_leaves_nothing(tmp_path):
    """Ctrl-C in the first rollout: there is nothing to resume from, so no run directory (config.json,
    events/) is left behind, and no resume command is offered."""
    run_dir = tmp_path / "r"
    cmd = [sys.executable, "-m", "oat_dppo.main", *TINY, "--run-dir", str(run_dir), "--env", "rg:arc_1d",
           "--iterations", "50", "--episodes-per-iteration", "64", "--max-new-tokens", "64", "--eval-every", "0"]
    cmd[cmd.index("none")] = "tensorboard"  # --log tensorboard: an events/ directory too
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=child_env())
    deadline = time.time() + 120
    while time.time() < deadline and not ((run_dir / "config.json").exists() and (run_dir / "events").is_dir()):
        time.sleep(0.05)
    assert (run_dir / "events").is_dir(), "the run never started"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert f"interrupted before the first checkpoint: nothing was saved, and {run_dir} was removed" in err
    assert "resume with" not in err and not run_dir.exists()


def test_a_stop_after_the_first_evaluation_keeps_it_and_the_run_resumes(tmp_path):
    """Ctrl-C in iteration 0's rollout, after the evaluation before any update (iteration -1): the run keeps
    that evaluation (saved as the checkpoint before iteration 0), offers the resume, and resumes at iteration 0."""
    run_dir = tmp_path / "r"
    proc = subprocess.Popen(
        [sys.executable, "-m", "oat_dppo.main", *TINY, "--run-dir", str(run_dir), "--env", "rg:arc_1d",
         "--iterations", "50", "--episodes-per-iteration", "64", "--max-new-tokens", "64", "--eval-every", "50",
         "--eval-episodes", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=child_env())
    metrics_file = run_dir / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics_file.exists() and metrics_file.read_text().count("\n") >= 1):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "resume with" in err and metrics(run_dir)[0]["iteration"] == -1
    evaluated = metrics(run_dir)[0]
    assert "eval/reward_mean" in evaluated
    saved = len(metrics(run_dir)) - 1  # 0, or 1 where the signal came during iteration 0's update
    assert main(["--resume", str(run_dir), "--iterations", str(saved + 1)]) == 0
    assert [r["iteration"] for r in metrics(run_dir)] == list(range(-1, saved + 1))
    assert metrics(run_dir)[0] == evaluated


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_saves_and_the_run_resumes(tmp_path, capsys, sig):
    """Ctrl-C, and SIGTERM as a scheduler sends it: the update finishes, a checkpoint is saved, the exit
    status names the signal (130, 143), and the run resumes."""
    run_dir = tmp_path / "r"
    proc = subprocess.Popen(
        [sys.executable, "-m", "oat_dppo.main", *TINY, "--run-dir", str(run_dir), "--env", "rg:arc_1d",
         "--iterations", "50", "--episodes-per-iteration", "2", "--eval-every", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=child_env())
    metrics_file = run_dir / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics_file.exists() and metrics_file.read_text().count("\n") >= 1):
        time.sleep(0.2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-2000:]
    # The hint names this interpreter: `python` where PATH finds it (an activated venv), else its path.
    on_path = shutil.which("python")
    same = on_path is not None and os.path.abspath(on_path) == os.path.abspath(sys.executable)
    assert f"resume with: {'python' if same else os.path.relpath(sys.executable, REPO)} -m oat_dppo.main --resume" in err
    done = len(metrics(run_dir))
    assert done >= 1 and (run_dir / "checkpoint" / "state.json").exists()
    assert main(["--resume", str(run_dir), "--iterations", str(done + 1)]) == 0
    assert [r["iteration"] for r in metrics(run_dir)] == list(range(done + 1))
    capsys.readouterr()
    assert main(["--resume", str(run_dir), "--iterations", "1"]) == 0  # fewer than it has: nothing to do
    assert (f"nothing to do: {run_dir} has {done + 1} iterations, and --iterations is 1; raise --iterations above "
            f"{done + 1} to train longer") in capsys.readouterr().err


def test_a_closed_terminal_saves_and_exits_129(tmp_path):
    """The run's terminal closes (an ssh session dies): SIGHUP, and every later write to the terminal fails
    with EIO. The run still finishes its update, saves, exits 129 and resumes; with or without the
    progress bar (before the shared stop path: exit status 1, the handler's own message raised EIO)."""
    from helpers.terminal import Terminal  # noqa: PLC0415

    for progress in ("--progress", "--no-progress"):
        run_dir = tmp_path / progress
        argv = [sys.executable, "-m", "oat_dppo.main", *TINY, progress, "--run-dir", str(run_dir), "--env",
                "rg:arc_1d", "--iterations", "50", "--episodes-per-iteration", "2", "--eval-every", "0"]
        term = Terminal(argv, env=child_env(), cwd=REPO)
        metrics_file = run_dir / "metrics.jsonl"
        assert term.read_until(lambda _: metrics_file.exists() and metrics_file.read_text().count("\n") >= 1, 120), \
            term.text[-2000:]
        assert term.hang_up(timeout=120) == 129, progress
        done = len(metrics(run_dir))
        assert json.loads((run_dir / "checkpoint" / "state.json").read_text())["iteration"] == done - 1
    assert main(["--resume", str(run_dir), "--iterations", str(done + 1)]) == 0


@pytest.mark.parametrize("evaluation_due, said", [
    (True, "SIGINT: finishing this update and its held-out evaluation (64 episodes), then saving a checkpoint"),
    (False, "SIGINT: finishing this update, then saving a checkpoint"),
])
def test_a_stop_during_an_update_says_whether_an_evaluation_comes_first(evaluation_due, said):
    """An update whose iteration ends with a held-out evaluation finishes both before the checkpoint (the
    evaluation can take many minutes): the message says so; a second signal still stops at once."""
    import io  # noqa: PLC0415

    from oat_dppo.backends.local.trainer import Interrupted, LocalTrainer  # noqa: PLC0415

    trainer = LocalTrainer.__new__(LocalTrainer)  # only the signal handler's state
    trainer.out, trainer.eval_envs = io.StringIO(), [None] * 64
    trainer._phase, trainer._evaluation_due, trainer._stop_requested, trainer._stop_signal = "train", evaluation_due, False, 0
    trainer._on_signal(signal.SIGINT, None)
    assert said in trainer.out.getvalue() and trainer._stop_requested
    trainer._phase = "rollout"  # the evaluation, or the next rollout
    with pytest.raises(Interrupted):
        trainer._on_signal(signal.SIGINT, None)
