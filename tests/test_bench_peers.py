"""`python -m benchmarks peers`: its refusals, Oat's metrics read per round, and the tables it prints
from per-step results (no model runs here; the benchmark itself is docs/benchmarks_peers.md)."""

from __future__ import annotations

import importlib.util

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
         "rollout/num_transitions": 64, "rollout/response_tokens_mean": 7.0, "rollout/prompt_tokens_mean": 41.0},
        {"iteration": 0},  # a row without a learning step
    ]
    steps = peers.oat_steps(rows)
    assert [s["total"] for s in steps] == [100.0, 60.0]
    assert steps[1]["gen_tokens"] == 64 * 7 and steps[1]["trained_tokens"] == 64 * 48 and steps[1]["sequences"] == 64


def test_stock_oat_rounds_use_its_actors_names_and_the_given_prompt_length():
    """Oat's own actor logs `num_data` and `response_tok_len` (no prompt length): the same step, read alike."""
    rows = [{"misc/policy_sgd_step": 1, "misc/elapse": 80.0, "train/learn_batch_time": 60.0,
             "rollout/generate_time": 11.0, "rollout/num_data": 64, "rollout/response_tok_len": 7.5,
             "rollout/rewards": 0.0}]
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


def _result(gen: float, learn: float, prompts: str = "abc", peak_kib: int = 1024 * 1000) -> dict:
    step = dict(generate=gen, learn=learn, total=gen + learn + 1, gen_tokens=500, trained_tokens=3000, sequences=64,
                cpu=(gen + learn) / 2)
    return dict(steps=[dict(step, total=999.0), step, step], prompts=prompts, peak_kib=peak_kib)


def test_tables_give_ratios_to_trl_and_flag_the_target():
    cfg = peers.Config(sides="trl,local-hf,local-vllm,oat-stock", steps=2, warmup=1)
    results = {"trl": _result(10, 48), "local-hf": _result(10, 18), "local-vllm": _result(5, 40, "other"),
               "oat-stock": "not measured: run `x`"}
    text = peers.format_tables(results, cfg, (1.0, 2.0))
    measured, ratios = text.split("Each as a ratio to TRL's")
    rows = {line.split(" | ")[0].strip("| "): line for line in ratios.splitlines() if line.startswith("| ")}
    # the warm-up step (total 999) is left out; TRL's total 59 over local's 29: 2.03 steps/s ratio, target met
    local = rows[peers.LABELS["local-hf"]]
    assert "**2.03**" in local and "**2.07**" in local  # wall 59 / 29; CPU time 29 / 14
    assert ">= 1.5 (wall ok, CPU ok)" in local
    assert "not measured: run `x`" in text
    assert "DIFFER" in text  # one side reported other prompt texts
    trl = next(line for line in measured.splitlines() if line.startswith(f"| {peers.LABELS['trl']}"))
    assert "39.1 + 7.8" in trl  # tokens per sequence: (3000 - 500) / 64 + 500 / 64
