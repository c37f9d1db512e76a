"""`python -m benchmarks peers`: its refusals, Oat's metrics read per round, and the tables it prints
from per-step results (no model runs here; the benchmark itself is docs/benchmarks_peers.md)."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import List, Literal, Optional, Tuple  # noqa: UP035  (tyro reads them as Oat writes them)

import pytest

from benchmarks import peers


def test_an_unknown_side_is_one_line_naming_the_sides(capsys):
    assert peers.main(["--sides", "trl,nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'nope'" in err and "local-vllm" in err


def test_a_batch_the_micro_batch_does_not_divide_is_refused(capsys):
    assert peers.main(["--sides", "local-hf", "--prompts", "3", "--samples", "3", "--micro-batch", "2"]) == 2
    assert "--micro-batch 2" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("trl") is not None, reason="TRL is installed here")
def test_without_trl_the_trl_side_says_make_setup_peers(capsys):
    assert peers.main(["--sides", "trl"]) == 2
    assert "make setup-peers" in capsys.readouterr().err


def test_the_job_is_the_same_options_on_both_backends():
    argv = peers.job_argv(peers.Config(), "pg_is")
    for flag, value in [("--episodes-per-iteration", "64"), ("--group-size", "4"), ("--mini-batch-size", "64"),
                        ("--micro-batch-size", "8"), ("--max-new-tokens", "8"), ("--aggregation", "token_mean"),
                        ("--dtype", "float32"), ("--iterations", "4")]:
        assert argv[argv.index(flag) + 1] == value
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--env-option"] == list(peers.ENV_OPTIONS)


def test_the_local_sides_run_the_jobs_argv():
    """The local sides' TrainConfig is the job's argv parsed by the main parser: every option the Oat side
    gets, the local side gets too (one argv, not two copies that can drift)."""
    from oat_dppo.main import parse

    cfg = peers.Config()
    local = peers._train_config(cfg, "hf")
    job = parse(peers.job_argv(cfg, "pg_is"))
    for f in ("model", "env", "env_option", "response_prefix", "max_new_tokens", "dtype", "trust_region",
              "aggregation", "advantage", "episodes_per_iteration", "group_size", "mini_batch_size",
              "micro_batch_size", "learning_rate", "lr_schedule", "max_grad_norm", "iterations", "seed",
              "eval_every", "eval_episodes"):
        assert getattr(local, f) == getattr(job, f), f
    assert (local.engine, local.threads, local.log, local.progress) == ("hf", cfg.threads, "none", False)


def test_oat_rounds_are_read_once_each_with_their_wall_time():
    rows = [
        {"misc/policy_sgd_step": 1, "misc/elapse": 100.0, "train/learn_batch_time": 40.0, "rollout/generate_time": 9.0,
         "rollout/num_transitions": 64, "rollout/response_tokens_mean": 8.0, "rollout/prompt_tokens_mean": 41.0},
        {"misc/policy_sgd_step": 1, "misc/elapse": 100.5, "train/learn_batch_time": 40.0},  # same round, logged again
        {"misc/policy_sgd_step": 2, "misc/elapse": 160.0, "train/learn_batch_time": 45.0, "rollout/generate_time": 8.0,
         "rollout/num_transitions": 64, "rollout/response_tokens_mean": 7.0, "rollout/prompt_tokens_mean": 41.0,
         "train/decoder_tokens_per_token": 2.5},  # the adapter's learner counts what its decoder computed
        {"iteration": 0},  # a row without a learning step
    ]
    steps = peers.oat_steps(rows)
    assert [s["total"] for s in steps] == [100.0, 60.0]
    assert steps[1]["gen_tokens"] == 64 * 7 and steps[1]["trained_tokens"] == 64 * 48 and steps[1]["sequences"] == 64
    assert steps[1]["decoder_per_token"] == 2.5 and math.isnan(steps[0]["decoder_per_token"])


def test_stock_oat_rounds_use_its_actors_names_and_the_given_prompt_length():
    """Oat's own learner logs its actor's `actor/num_data` and `actor/response_tok_len` (no prompt length;
    the adapter's file names them `rollout/`): the same step, read alike."""
    rows = [{"misc/policy_sgd_step": 1, "misc/elapse": 80.0, "train/learn_batch_time": 60.0,
             "actor/generate_time": 11.0, "actor/num_data": 64, "actor/response_tok_len": 7.5,
             "actor/rewards": 0.0}]
    [step] = peers.oat_steps(rows, prompt_tokens=41.0)
    assert (step["sequences"], step["gen_tokens"], step["trained_tokens"], step["reward"]) == (64, 480, 64 * 48.5, 0)


def test_the_stock_program_gets_the_adapters_oat_settings_and_its_own_data(tmp_path):
    import dataclasses

    from benchmarks import oat_stock

    @dataclasses.dataclass
    class Adapter:  # stands for DPPOArgs: Oat's fields as resolved for the job, and one of the project's
        pretrain: str = "m"
        learning_rate: float = 1e-6
        cliprange: object = None
        trust_region: str = "pg_is"

    @dataclasses.dataclass
    class Script:  # stands for the script's ZeroMathArgs
        pretrain: str = "hub/id"
        learning_rate: float = 5e-7
        cliprange: float = 0.2
        prompt_template: str = "qwen_math"
        max_train: str = "999999"

    values = oat_stock.stock_values(Adapter(pretrain="/models/smollm2", learning_rate=2e-5), tmp_path / "train",
                                    tmp_path / "eval", 64)
    args = oat_stock.oat_arguments(Script, values)
    assert (args.pretrain, args.learning_rate) == ("/models/smollm2", 2e-5)  # the adapter's Oat settings
    assert args.cliprange == 0.2  # None on the adapter (its trust region's): Oat's own default
    assert (args.prompt_template, args.max_train) == ("no", "64")  # the job's texts as they are, all of them


@dataclasses.dataclass
class _Script:  # stands for the script's ZeroMathArgs: the kinds of fields Oat's arguments have
    use_fused_lm_head: bool = True
    flash_attn: bool = True
    collocate: bool = False
    master_port: Optional[int] = 5000
    disable_cascade_attn: Optional[bool] = None
    cliprange: float = 0.2
    beta: float = 0.1
    lr_scheduler: Literal["cosine_with_min_lr", "constant"] = "cosine_with_min_lr"
    shape: Tuple[int, int] = (1, 2)
    names: List[str] = dataclasses.field(default_factory=lambda: ["a"])
    oracle: str = "pairrm"
    max_train: str = "999999"


def test_the_scripts_command_line_gives_back_every_value():
    """Oat's `get_default_args` parses the script's command line with tyro: the flags written from the
    resolved values (bools as --x / --no-x, None, tuples, lists, floats exactly) parse back to those values,
    and a flag that would not is caught before anything starts."""
    tyro = pytest.importorskip("tyro", reason="Oat's parser (in .venv-oat; .venv has it too)")
    from benchmarks import oat_stock

    wanted = _Script(use_fused_lm_head=False, collocate=True, master_port=None, disable_cascade_attn=True,
                    beta=0.0, cliprange=2e-05 / 3, lr_scheduler="constant", shape=(3, 4), names=[], oracle="",
                    max_train="64")
    flags = oat_stock.script_flags(wanted)
    assert "--no-use-fused-lm-head" in flags and "--collocate" in flags and "--flash-attn" not in flags  # default
    assert flags[flags.index("--master-port") + 1] == "None"
    oat_stock.check_flags(wanted, flags)
    assert tyro.cli(_Script, args=flags) == wanted
    with pytest.raises(ValueError, match="beta"):
        oat_stock.check_flags(wanted, [f for f in flags if f not in ("--beta", "0.0")])


def _decorated(node: str, text: str, colour: int = 33) -> str:
    """A line as launchpad's `decorate_output` passes it on: the node's name in colour."""
    return f"\x1b[1;{colour}m[{node}] {text}\x1b[0;0m\n"


def test_the_learners_log_rows_are_read_from_its_printed_dicts():
    """Oat's learner pprints each log row; lines of the actor and the launcher come between, a dict cut off
    is left out, nan and inf are numbers, a tensor-valued entry is left out."""
    import pprint

    from benchmarks import oat_stock

    def rich_text(row: dict) -> str:  # as Oat's `strategy.pprint` prints it: rich's pprint, indent guides
        from rich.console import Console
        from rich.pretty import pprint as rich_pprint

        console = Console(file=io.StringIO(), width=80)
        rich_pprint(row, console=console)
        return console.file.getvalue()

    def printed(row: dict, text=rich_text) -> list[str]:
        return [_decorated("learner_0_0/0", line) for line in ("", *text(row).splitlines(), "")]

    first = {"misc/policy_sgd_step": 1, "misc/elapse": 100.5, "train/learn_batch_time": 40.0,
             "actor/generate_time": 9.0, "actor/num_data": 4, "actor/response_tok_len": 3.5,
             "actor/rewards": 0.0, "train/ratio": float("nan"), "misc/lr": 2e-05, "train/entropy": -1.5,
             "misc/vram_allocated": float("inf")}
    second = dict(first, **{"misc/policy_sgd_step": 2, "misc/elapse": 160.0, "train/ratio": 0.5})
    lines = printed({"eval/accuracy": 0.0, "misc/policy_sgd_step": 0})  # the evaluation before the first round
    one = printed(first)
    lines += one[:4] + [_decorated("actor_0_0", "INFO vLLM: {'a': 1}", 32), "launcher line\n"] + one[4:]
    lines += printed(second)[:5]  # cut off: the node was stopped mid-row
    lines += printed(second, pprint.pformat)  # the standard library's pprint reads alike
    lines += [_decorated("learner_0_0", "{'train/loss': tensor([1., 2.]),"),
              _decorated("learner_0_0", " 'train/learn_batch_time': 3.0}")]
    seen = []
    rows = oat_stock.LogRows(seen.append)
    for line in lines:
        rows.feed(line)
    assert rows.rows == seen and len(seen) == 4
    assert seen[1]["misc/elapse"] == 100.5 and seen[1]["train/entropy"] == -1.5 and seen[1]["misc/lr"] == 2e-05
    assert math.isnan(seen[1]["train/ratio"]) and seen[1]["misc/vram_allocated"] == math.inf
    assert seen[2] == second
    assert seen[3] == {"train/learn_batch_time": 3.0}  # the tensor's entry left out
    assert rows.rounds() == 3  # policy steps 1, 2 and the last row's (no step): the evaluation row is no round
    [a, b] = peers.oat_steps(seen[:3])
    assert (a["total"], b["total"], b["sequences"], b["gen_tokens"]) == (100.5, 59.5, 4, 14.0)


def _program(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "program.py"
    script.write_text("import os, signal, subprocess, sys, time\n" + body)
    return [sys.executable, str(script)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[-1][0] != "Z"
    except OSError:
        return False


def test_a_program_that_never_ends_is_ended_with_its_whole_group(tmp_path):
    """Oat's program on this CPU waits forever after a learner fails: the watchdog ends it, and every process
    it started (a node that ignores SIGTERM included), at the timeout."""
    from benchmarks import oat_stock

    argv = _program(tmp_path, (
        "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(\"node up\", flush=True); time.sleep(600)'])\n"
        "print('child', child.pid, flush=True)\n"
        "time.sleep(600)\n"))
    lines, out = [], (tmp_path / "out").open("wb")
    t0 = time.monotonic()
    ended = oat_stock.run_program(argv, dict(os.environ), 3.0, lines.append, kill_after_s=2.0, out=out)
    assert ended.timed_out and ended.status is None and time.monotonic() - t0 < 30
    child = int(next(line for line in lines if line.startswith("child")).split()[1])
    assert "node up\n" in lines and not _alive(child)
    with pytest.raises(ProcessLookupError):
        os.killpg(ended.pgid, 0)
    assert oat_stock.verdict(ended, rounds=1, expected=2)[0] == 1
    out.close()
    assert b"node up" in (tmp_path / "out").read_bytes()  # the program's output is passed on


def test_oats_own_end_a_sigterm_to_its_launcher_is_success_once_every_round_is_logged(tmp_path):
    """Oat's learner ends the program with `lp.stop()`, a SIGTERM to the launcher: after the expected rounds
    that is the normal end, whatever status it leaves; the same end before them is a failure."""
    from benchmarks import oat_stock

    argv = _program(tmp_path, "print('rounds done', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)\n")
    ended = oat_stock.run_program(argv, dict(os.environ), 60.0, lambda line: None, out=io.BytesIO())
    assert ended.status == -signal.SIGTERM and not ended.timed_out
    assert oat_stock.verdict(ended, rounds=4, expected=4)[0] == 0
    status, line = oat_stock.verdict(ended, rounds=3, expected=4)
    assert status == 1 and "3 of 4" in line


def test_a_program_that_does_not_end_after_its_last_round_is_ended_after_the_grace(tmp_path):
    from benchmarks import oat_stock

    argv = _program(tmp_path, "print('round 1', flush=True)\ntime.sleep(600)\n")
    lines: list[str] = []
    t0 = time.monotonic()
    ended = oat_stock.run_program(argv, dict(os.environ), 600.0, lines.append, done=lambda: bool(lines),
                                  end_grace_s=1.0, out=io.BytesIO())
    assert ended.timed_out and time.monotonic() - t0 < 60
    assert oat_stock.verdict(ended, rounds=1, expected=1)[0] == 0


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="TRL is not installed: `make setup-peers`")
def test_the_trl_side_is_timed_through_trls_public_hooks(tmp_path, monkeypatch):
    """A real GRPOTrainer on a tiny Qwen3, two steps of 2 prompts x 2 samples: each step's generation ends at
    the reward call, its learning starts after it, and the token counts TRL logged match the prompt texts the
    project built (TRL trained on exactly those, step by step)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from oat_dppo.models import load_policy
    from oat_dppo.models.loading import load_tokenizer

    model, tok = load_policy("tiny-qwen3", seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    cfg = peers.Config(sides="trl", steps=1, warmup=1, prompts=2, samples=2, max_new_tokens=4, micro_batch=2,
                       model=str(tmp_path / "tiny"))
    res = peers.run_trl(cfg)
    texts, _ = peers.step_prompts(cfg)
    per_step = [texts[i * cfg.prompts:(i + 1) * cfg.prompts] for i in range(2)]
    assert res["prompts"] == peers.digest(per_step)
    tok = load_tokenizer(cfg.model)
    for step, prompts in zip(res["steps"], per_step):
        assert step["sequences"] == 4 and 0 < step["gen_tokens"] <= 4 * cfg.max_new_tokens
        prompt_tokens = cfg.samples * sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in prompts)
        assert step["trained_tokens"] == prompt_tokens + step["gen_tokens"]
        assert step["generate"] > 0 and step["learn"] > 0 and step["generate"] + step["learn"] <= step["total"]


def test_trl_steps_refuse_hooks_that_did_not_each_see_every_step():
    marks = {"begin": [0.0, 10.0], "end": [9.0, 19.0], "cpu_begin": [0.0, 5.0], "cpu_end": [4.0, 9.0],
             "reward_in": [2.0, 13.0], "reward_out": [2.5, 13.5], "prompts": [["a", "a"], ["b", "b"]],
             "logs": [{"num_tokens": 100, "completions/mean_length": 3.0},
                      {"num_tokens": 190, "completions/mean_length": 2.5}]}
    [first, second] = peers.trl_steps(marks, 2)["steps"]
    assert (first["generate"], first["learn"], first["total"], first["cpu"]) == (2.0, 6.5, 9.0, 4.0)
    assert (second["gen_tokens"], second["trained_tokens"]) == (5.0, 90.0)
    with pytest.raises(RuntimeError, match="reward_in"):
        peers.trl_steps(dict(marks, reward_in=[2.0]), 2)  # two steps, one generation: TRL reused a batch
    with pytest.raises(RuntimeError, match="not inside"):
        peers.trl_steps(dict(marks, reward_in=[2.0, 20.0], reward_out=[2.5, 21.0]), 2)


def _result(gen: float, learn: float, prompts: str = "abc", peak_kib: int = 1024 * 1000, **extra) -> dict:
    step = dict(generate=gen, learn=learn, total=gen + learn + 1, gen_tokens=500, trained_tokens=3000, sequences=64,
                cpu=(gen + learn) / 2, **extra)
    return dict(steps=[dict(step, total=999.0), step, step], prompts=prompts, peak_kib=peak_kib)


def test_tables_give_ratios_to_trl_and_flag_the_target():
    cfg = peers.Config(sides="trl,local-hf,local-vllm,oat-stock,oat-dppo_binary_tv", steps=2, warmup=1)
    pieces = dict(collate=0.5, forward=3.0, trust_region=0.5, backward=4.0, optimizer=1.0)
    results = {"trl": _result(10, 48), "local-hf": _result(10, 10, decoder_per_token=3.14, pieces=pieces),
               "local-vllm": _result(5, 40, "other"), "oat-stock": "not measured: run `x`",
               "oat-dppo_binary_tv": _result(9, 30, decoder_per_token=2.0)}
    text = peers.format_tables(results, cfg, (1.0, 2.0))
    measured, ratios = text.split("Each as a ratio to TRL's")
    ratios, timing = ratios.split("Where the local learning time goes")
    rows = {line.split(" | ")[0].strip("| "): line for line in ratios.splitlines() if line.startswith("| ")}
    # the warm-up step (total 999) is left out; TRL's total 59 over local's 21: 2.81 steps/s ratio, target met
    local = rows[peers.LABELS["local-hf"]]
    assert "**2.81**" in local and "**2.90**" in local  # wall 59 / 21; CPU time 29 / 10
    assert ">= 2.5 (wall ok, CPU ok)" in local
    assert ">= 3.5 (wall MISSED, CPU MISSED)" in rows[peers.LABELS["local-vllm"]]  # 59 / 46
    assert "not measured: run `x`" in text
    assert "DIFFER" in text  # one side reported other prompt texts
    trl = next(line for line in measured.splitlines() if line.startswith(f"| {peers.LABELS['trl']}"))
    assert "39.1 + 7.8" in trl  # tokens per sequence: (3000 - 500) / 64 + 500 / 64
    assert trl.rstrip(" |").endswith(">= 6.0")  # TRL's real tokens per completion token, (39.1 + 7.8) / 7.8
    local_measured = next(line for line in measured.splitlines() if line.startswith(f"| {peers.LABELS['local-hf']}"))
    assert local_measured.rstrip(" |").endswith("3.1")  # the learner's own count
    oat = next(line for line in measured.splitlines() if line.startswith(f"| {peers.LABELS['oat-dppo_binary_tv']}"))
    assert oat.rstrip(" |").endswith("2.0")  # the Oat learner's own count
    assert f"| {peers.LABELS['local-hf']} | 0.50 | 3.00 | 0.50 | 4.00 | 1.00 | 1.00 |" in timing  # other: 10 - 9
    assert peers.LABELS["local-vllm"] not in timing  # a side without the hook's pieces has no row
