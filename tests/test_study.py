"""The study runner (`python -m oat_dppo.study`): parsing and grid expansion, bad input with line
numbers, run names, the run states (skip / resume / restart), real tiny runs (resume, failure,
Ctrl-C), the report's numbers from synthetic metrics, and the Oat launch script."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.child import child_env

from oat_dppo.config import TrainConfig, to_dict
from oat_dppo.study import StudyError, load_study
from oat_dppo.study import runner as runner_module
from oat_dppo.study.cli import main
from oat_dppo.study.runner import LocalRunner, conflicts, has_checkpoint, log_path, main_command, run_state

REPO = Path(__file__).resolve().parents[1]
ENV = child_env(TOKENIZERS_PARALLELISM="false")


def write(tmp_path: Path, text: str, name: str = "study.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def study_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oat_dppo.study", *args], capture_output=True, text=True,
                          env=ENV, cwd=REPO, timeout=timeout)


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def errors_of(path: Path) -> list[str]:
    with pytest.raises(StudyError) as e:
        load_study(path)
    return e.value.errors


# ---- parsing and expansion ----------------------------------------------------------------------

SMALL = """
    [study]
    name = "small"
    out = "{out}"
    threshold = 0.5

    [base]
    model = "tiny-qwen3"
    env = "rg:arc_1d"
    learning_rate = 3e-5
    response_prefix = "\\\\boxed{{"

    [grid]
    variant = [
        {{trust_region = "dppo_binary_tv", delta = 0.1}},
        {{trust_region = "ppo_clip"}},
    ]
    seed = [0, 1]
    """


def test_grid_expands_to_the_exact_runs(tmp_path):
    study = load_study(write(tmp_path, SMALL.format(out=tmp_path / "out")))
    assert (study.name, study.parallel, study.threshold, study.backend) == ("small", 1, 0.5, "local")
    assert [r.name for r in study.runs] == [
        "tiny-qwen3__rg_arc_1d__dppo_binary_tv__delta-0.1__s0",
        "tiny-qwen3__rg_arc_1d__dppo_binary_tv__delta-0.1__s1",
        "tiny-qwen3__rg_arc_1d__ppo_clip__s0",
        "tiny-qwen3__rg_arc_1d__ppo_clip__s1",
    ]
    first, last = study.runs[0], study.runs[-1]
    assert first.options == {"response_prefix": "\\boxed{", "model": "tiny-qwen3", "env": "rg:arc_1d",
                             "trust_region": "dppo_binary_tv", "delta": 0.1, "learning_rate": 3e-5, "seed": 0}
    assert last.config.delta is None and last.config.trust_region == "ppo_clip" and last.config.seed == 1
    assert last.run_dir == tmp_path / "out" / last.name
    # Options the study does not set keep TrainConfig's defaults.
    assert first.config.iterations == TrainConfig().iterations
    # Each of N parallel runs gets cores // N torch threads (at least 1), unless [base] sets threads.
    cores = len(os.sched_getaffinity(0))
    assert {r.config.threads for r in study.runs} == {cores}
    assert {r.config.threads for r in load_study(study.path, parallel=2).runs} == {max(1, cores // 2)}
    assert {r.config.threads for r in load_study(study.path, parallel=4 * cores).runs} == {1}
    pinned = write(tmp_path, SMALL.format(out=tmp_path / "out").replace('env = "rg:arc_1d"', 'env = "rg:arc_1d"\nthreads = 3'),
                   "pinned.toml")
    run = load_study(pinned, parallel=2).runs[0]
    assert run.config.threads == 3 and main_command(run).count("--threads") == 1


def test_commands_parse_back_to_the_resolved_config(tmp_path):
    from oat_dppo.main import parse

    study = load_study(write(tmp_path, SMALL.format(out=tmp_path / "out")))
    for run in study.runs:
        cmd = main_command(run)
        assert cmd[:3] == ["python", "-m", "oat_dppo.main"]
        assert to_dict(parse(cmd[3:])) == to_dict(run.config)
        assert cmd[-3:] == ["--threads", str(run.config.threads), "--no-progress"]
    assert "--response-prefix" in main_command(study.runs[0])


def test_repeatable_options_take_lists(tmp_path):
    """--env-option and --tr-param are lists in a study file: the flag once per item on the command line."""
    from oat_dppo.main import parse

    study = load_study(write(tmp_path, """
        [base]
        env = "math:procedural"
        env_option = ["tasks=basic_arithmetic", "operators=+,-", "min_digits=-1"]
        [grid]
        tr_param = [["delta=0.1"], ["delta=0.2", "C=3"]]
        """))
    assert [r.config.tr_param for r in study.runs] == [("delta=0.1",), ("delta=0.2", "C=3")]
    cmd = main_command(study.runs[1])
    assert "--env-option=operators=+,-" in cmd and "--env-option=min_digits=-1" in cmd
    assert cmd.count("--tr-param=delta=0.2") == 1 and "--tr-param=C=3" in cmd
    for run in study.runs:
        assert to_dict(parse(main_command(run)[3:])) == to_dict(run.config)
    assert study.runs[1].name.endswith("tr_param-delta_0.2_C_3__s0")
    bad = write(tmp_path, '[base]\nenv_option = "tasks=basic_arithmetic"\n', "bad.toml")
    with pytest.raises(StudyError, match="env_option must be a list of strings"):
        load_study(bad)


def test_run_names_are_stable(tmp_path):
    # Same runs, keys in another order, model/env moved between [base] and [grid]: same names.
    a = write(tmp_path, """
        [base]
        model = "smollm2"
        env = "game:GuessTheNumber-v0-easy"
        [grid]
        seed = [0, 1]
        trust_region = ["dppo_binary_tv", "ppo_clip"]
        """, "a.toml")
    b = write(tmp_path, """
        [grid]
        trust_region = ["ppo_clip", "dppo_binary_tv"]
        env = ["game:GuessTheNumber-v0-easy"]
        seed = [1, 0]
        [base]
        model = "smollm2"
        """, "b.toml")
    names_a = sorted(r.name for r in load_study(a).runs)
    assert names_a == sorted(r.name for r in load_study(b).runs)
    assert "smollm2__game_GuessTheNumber-v0-easy__dppo_binary_tv__s0" in names_a
    assert load_study(a).runs[0].name == load_study(a).runs[0].name  # and deterministic across loads
    # Hub ids keep their organization (no collisions), slashes become underscores.
    c = write(tmp_path, '[grid]\nmodel = ["Qwen/Qwen3-1.7B-Base"]\nlearning_rate = [1e-6]\n', "c.toml")
    assert load_study(c).runs[0].name == "Qwen_Qwen3-1.7B-Base__game_GuessTheNumber-v0-easy__dppo_binary_tv__learning_rate-1e-06__s0"


def test_a_name_too_long_for_a_directory_ends_in_a_hash_and_the_seed(tmp_path):
    """Run names are directory names (and, with ".log", file names): file systems allow 255 bytes. Two long
    prompts that differ only at their ends get two names, each short enough, the seed still last."""
    prompt = "Answer with one move for an empty cell. " * 5
    study = write(tmp_path, f"""
        [study]
        out = "{tmp_path / 'out'}"
        [base]
        model = "smollm2"
        env = "game:Sudoku-v0-easy"
        seed = 3
        [grid]
        setting = [{{env_option = ["obs_suffix={prompt}A"]}}, {{env_option = ["obs_suffix={prompt}B"]}},
                   {{env_option = ["obs_suffix=short"]}}]
        """)
    runs = load_study(study).runs
    names = [r.name for r in runs]
    assert len(set(names)) == 3
    assert all(len(n) + len(".log") <= 255 and n.endswith("__s3") for n in names)
    assert re.search(r"__h[0-9a-f]{10}__s3$", names[0]) and re.search(r"__h[0-9a-f]{10}__s3$", names[1])
    assert names[2] == "smollm2__game_Sudoku-v0-easy__dppo_binary_tv__env_option-obs_suffix_short__s3"  # as before
    assert names == [r.name for r in load_study(study).runs]
    for run in runs:  # the directory and its log can be made
        assert run.run_dir.parent == tmp_path / "out"
        run.run_dir.mkdir(parents=True)
        log_path(run).write_text("")


def test_example_study_files():
    gtn = load_study(REPO / "experiments" / "smollm2_gtn.toml")
    assert len(gtn.runs) == 9 and gtn.backend == "local"
    cfg = gtn.runs[0].config
    assert (cfg.model, cfg.env, cfg.response_prefix, cfg.max_new_tokens, cfg.trainable_layers, cfg.learning_rate,
            cfg.episodes_per_iteration, cfg.iterations) == (
        "smollm2", "game:GuessTheNumber-v0-easy", "\\boxed{", 6, 6, 3e-5, 16, 20)
    assert {r.config.trust_region for r in gtn.runs} == {"ppo_clip", "dppo_binary_tv", "dppo_binary_kl"}
    assert sorted({r.seed for r in gtn.runs}) == [0, 1, 2]
    smoke = load_study(REPO / "experiments" / "tiny_smoke.toml")
    assert len(smoke.runs) == 4 and {r.config.iterations for r in smoke.runs} == {2}
    math = load_study(REPO / "experiments" / "gpu_mismatch_math.toml")
    assert len(math.runs) == 5 * 2 * 2 and {r.config.env for r in math.runs} == {"math:procedural"}
    assert "tasks=simple_equations" in math.runs[0].config.env_option
    fam = load_study(REPO / "experiments" / "model_families.toml")
    assert fam.backend == "oat" and len(fam.runs) == 3 * 3 * 2 * 2
    assert {r.config.model for r in fam.runs} == {"Qwen/Qwen3-1.7B-Base", "OctoThinker/OctoThinker-3B-Hybrid-Base",
                                                   "meta-llama/Llama-3.2-3B-Instruct"}
    assert {(r.config.trust_region, r.config.delta) for r in fam.runs} == {("ppo_clip", None), ("dppo_binary_tv", 0.2)}
    # Their commands mean what the files say (backend oat: the Oat command line).
    from oat_dppo.main import parse

    for study in (gtn, smoke, math, fam):
        run = study.runs[-1]
        assert to_dict(parse(main_command(run, backend=study.backend)[3:])) == to_dict(run.config)


def test_every_study_file_loads_and_its_committed_runs_are_its_own():
    """Each experiments/*.toml parses, and every run committed under its `[study] results` was run with
    the configuration the file now says (a committed run the file no longer describes would be
    reported, or skipped on resume, as if it were the file's)."""
    from oat_dppo.study.spec import config_differences

    from oat_dppo.study.mission import is_mission_file, load

    files = sorted(p for p in (REPO / "experiments").glob("*.toml") if not is_mission_file(p))
    assert len(files) >= 10
    assert all(load(p).cells for p in (REPO / "experiments").glob("*.toml") if is_mission_file(p))  # mission files load
    committed = 0
    for path in files:
        study = load_study(path)
        assert study.runs, path.name
        for run in study.runs:
            if run.results_dir is None or not (run.results_dir / "config.json").is_file():
                continue
            committed += 1
            diffs = config_differences(json.loads((run.results_dir / "config.json").read_text()), run)
            assert not diffs, f"{path.name}: {run.name}: {diffs}"
    assert committed >= 20


# ---- bad input ----------------------------------------------------------------------------------


def test_bad_key_is_reported_with_its_line_and_the_choices(tmp_path):
    path = write(tmp_path, f"""
        [study]
        out = "{tmp_path / 'out'}"

        [base]
        model = "tiny-qwen3"
        learning_rat = 1e-5
        [grid]
        seed = [0, 1]
        """)
    proc = study_cli(str(path), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"{path}: [base] learning_rat: unknown option 'learning_rat' (did you mean 'learning_rate'?)" in proc.stderr
    assert "valid options" in proc.stderr and "trust_region" in proc.stderr and "episodes_per_iteration" in proc.stderr
    assert "nothing was run" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_bad_values_and_keys_everywhere_are_all_reported(tmp_path):
    path = write(tmp_path, """
        [study]
        paralel = 2
        backend = "slurm"

        [base]
        aggregation = "mean"
        iterations = "10"
        run_dir = "x"

        [grid]
        seed = 0
        variant = [
            {trust_region = "ppo_clip"},
            {trust_regoin = "dppo_binary_tv"},
        ]

        [extra]
        """)
    errors = errors_of(path)
    # Every problem named by its key path, in file order ([study], [base], [grid], the rest).
    expect = [
        "[study] unknown key 'paralel' (did you mean 'parallel'?); valid keys: name, parallel, out, threshold, "
        "final_window, backend",
        "[study] backend 'slurm' is not valid; valid: local, oat",
        "[base] aggregation: 'mean' is not a valid aggregation; valid: token_mean, seq_mean_token_mean",
        "[base] iterations: iterations must be an integer, got '10'",
        "[base] run_dir: run_dir is set by the study runner",
        "[grid] seed must be a list of values (e.g. seed = [0])",
        "[grid] variant.trust_regoin: unknown option 'trust_regoin' (did you mean 'trust_region'?)",
        "[extra]: unknown table or key 'extra'",
    ]
    assert len(errors) == len(expect), errors
    for err, text in zip(errors, expect):
        assert err.startswith(f"{path}: {text}"), (err, text)


def test_option_errors_and_run_errors_are_reported_together(tmp_path):
    """An unknown option does not hide a trust-region typo, an unknown env or a mistyped model: the
    file's every problem comes in one report (docs/studies.md)."""
    path = write(tmp_path, """
        [base]
        model = "smolm2"
        env = "game:GuessNumber"
        learning_rat = 1e-5
        [grid]
        trust_region = ["ppo_clp", "dppo_binary_tv"]
        """)
    errors = errors_of(path)
    assert len(errors) == 4, errors  # in the order of the file
    assert "[base] model: run" in errors[0] and "did you mean 'smollm2'?" in errors[0]
    assert "[base] env: run" in errors[1] and "unknown environment 'game:GuessNumber'" in errors[1]
    assert "[base] learning_rat: unknown option 'learning_rat' (did you mean 'learning_rate'?)" in errors[2]
    text = "\n".join(errors)
    assert "[grid] trust_region = ppo_clp: run" in text and "unknown trust region 'ppo_clp'" in text
    assert "unknown environment 'game:GuessNumber'" in text
    assert "did you mean 'smollm2'?" in text


def test_bad_trust_region_name_line_and_choices(tmp_path):
    from oat_dppo.trust_region import available

    path = write(tmp_path, f"""
        [study]
        out = "{tmp_path / 'out'}"
        [grid]
        trust_region = [
            "ppo_clip",
            "dppo_binary_tvv",
        ]
        """)
    proc = study_cli(str(path), timeout=120)
    assert proc.returncode == 2
    line = next(x for x in proc.stderr.splitlines() if "unknown trust region" in x)
    assert line.startswith(f"error: {path}: [grid] trust_region = dppo_binary_tvv: run ")
    assert "'dppo_binary_tvv' (did you mean 'dppo_binary_tv'?)" in line
    assert "valid: " + ", ".join(available()) in line
    assert not (tmp_path / "out").exists()


def test_combination_errors_are_located(tmp_path):
    path = write(tmp_path, """
        [base]
        delta = 0.1
        episodes_per_iteration = 6
        env = "rg:arc1d"

        [grid]
        trust_region = ["dppo_binary_tv", "ppo_clip"]
        group_size = [2, 4]
        """)
    errors = errors_of(path)
    assert len(errors) == 3, errors
    # GEM ids are checked, with close matches (one error for the runs that share it).
    assert errors[0].startswith(f"{path}: [base] env: run ") and "unknown environment 'rg:arc1d'" in errors[0]
    assert "rg:arc_1d" in errors[0] and "(and 3 more)" in errors[0]
    # ppo_clip does not take delta (set in [base]): found by building the strategy, shown at ppo_clip.
    assert errors[1].startswith(f"{path}: [grid] trust_region = ppo_clip: run ")
    assert "'ppo_clip' does not take 'delta'" in errors[1]
    # validate(): 6 episodes cannot be split into groups of 4 (the grid value that causes it).
    assert errors[2].startswith(f"{path}: [grid] group_size = 4: run ") and "must be a multiple of --group-size 4" in errors[2]


def test_toml_syntax_error_has_a_line(tmp_path):
    path = write(tmp_path, '[base]\nmodel = "tiny-qwen3"\nseed = \n')
    errors = errors_of(path)
    assert len(errors) == 1 and errors[0].startswith(f"{path}: not valid TOML") and "line 3" in errors[0]


def test_duplicate_grid_points_and_conflicting_axes(tmp_path):
    path = write(tmp_path, """
        [grid]
        seed = [0, 0]
        """)
    assert "lists 0 twice" in errors_of(path)[0]
    path = write(tmp_path, """
        [grid]
        trust_region = ["ppo_clip"]
        variant = [{trust_region = "dppo_binary_tv"}]
        """)
    err = errors_of(path)[0]
    assert err.startswith(f"{path}: [grid] variant") and "already varies" in err


def test_only_and_dry_run(tmp_path):
    path = write(tmp_path, SMALL.format(out=tmp_path / "out"))
    code, out, _ = run_cli(str(path), "--dry-run", "--only", "ppo_clip")
    assert code == 0
    lines = [x for x in out.splitlines() if x.startswith("tiny-qwen3__")]
    assert lines == ["tiny-qwen3__rg_arc_1d__ppo_clip__s0  [new]", "tiny-qwen3__rg_arc_1d__ppo_clip__s1  [new]"]
    assert f"--run-dir {tmp_path / 'out' / 'tiny-qwen3__rg_arc_1d__ppo_clip__s0'}" in out
    assert not (tmp_path / "out").exists()
    code, out, _ = run_cli(str(path), "--dry-run", "--only", "*delta-0.1__s1")
    assert code == 0 and "tiny-qwen3__rg_arc_1d__dppo_binary_tv__delta-0.1__s1  [new]" in out and "ppo_clip" not in out
    code, _, err = run_cli(str(path), "--dry-run", "--only", "nothing-like-this")
    assert code == 2 and "matches none of the 4 runs" in err


# ---- run states ---------------------------------------------------------------------------------


def fake_run(run_dir: Path, iterations: int, *, checkpoint: bool, config: dict | None = None,
             rewards=None, extra=None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(iterations):
        row = {"iteration": i, "rollout/reward_mean": (rewards[i] if rewards else 0.0), "wall_time": float(i)}
        row.update((extra or {}).get(i, {}))
        rows.append(json.dumps(row))
    (run_dir / "metrics.jsonl").write_text("".join(r + "\n" for r in rows))
    if checkpoint:
        (run_dir / "checkpoint").mkdir(exist_ok=True)
        (run_dir / "checkpoint" / "state.json").write_text("{}")
    if config is not None:
        (run_dir / "config.json").write_text(json.dumps(config))


def test_a_resume_starts_after_its_checkpoint_not_after_the_last_logged_iteration(tmp_path):
    """A run killed 2 iterations after its last checkpoint resumes from the checkpoint: the plan,
    the start line and the progress lines count from there, and the stale lines are trimmed."""
    path, run = one_run_study(tmp_path, iterations=6)
    fake_run(run.run_dir, 5, checkpoint=True)  # iterations 0-4 logged ...
    (run.run_dir / "checkpoint" / "state.json").write_text('{"iteration": 2}')  # ... 0-2 saved
    state = run_state(run)
    assert (state.status, state.iterations_done, state.resume_from, state.resume_at) == ("resume", 5, 3, 3)
    code, out, _ = run_cli(str(path), "--dry-run")
    assert code == 0 and f"{run.name}  [resume at 3/6]" in out

    # The child is `true`: it exits at once, so what is checked is what the runner itself did.
    out = io.StringIO()
    runner = LocalRunner(load_study(path), [run], parallel=1, out=out, python="true")
    runner.run()
    text = out.getvalue()
    assert f"resume after iteration 3/6 (iterations 4-5, logged after that checkpoint, run again): {run.name}" in text
    assert [json.loads(line)["iteration"] for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert "iteration 3/6" not in text.replace("resume after iteration 3/6", "")  # no stale progress line


def tiny_study(tmp_path: Path, *, iterations: int, grid: str = "", final_window: int = 3) -> Path:
    """A study file of tiny runs (one, or the `grid` lines' product)."""
    grid = f"[grid]\n{grid}" if grid else ""
    return write(tmp_path, f"""
        [study]
        out = "{tmp_path / 'out'}"
        final_window = {final_window}
        [base]
        model = "tiny-qwen3"
        env = "rg:arc_1d"
        iterations = {iterations}
        """ + grid)


def one_run_study(tmp_path: Path, *, iterations: int) -> tuple[Path, object]:
    """A study file of one tiny run, and that run."""
    path = tiny_study(tmp_path, iterations=iterations)
    return path, load_study(path).runs[0]


def test_the_plan_says_how_long_the_study_has_left_at_the_pace_runs_logged(tmp_path):
    """Each run left needs its iterations left times the seconds per iteration its grid point's seeds
    logged (else the mean of all timed runs); the runs fill `parallel` slots in order. Where some runs
    ran on this machine (config.json's `_machine`: the same CPU), only their pace counts."""
    path = tiny_study(tmp_path, iterations=4, grid='trust_region = ["ppo_clip", "pg_is", "dppo_binary_tv"]\n'
                                                   "seed = [0, 1]")
    by = {r.name: r for r in load_study(path).runs}

    def timed(name: str, n: int, seconds: float, **kw) -> None:
        fake_run(by[f"tiny-qwen3__rg_arc_1d__{name}"].run_dir, n, extra={i: {"time/iteration_s": seconds}
                                                                          for i in range(n)}, **kw)

    timed("ppo_clip__s0", 4, 10.0, checkpoint=True)  # done: 10 s per iteration
    timed("pg_is__s0", 2, 30.0, checkpoint=True)  # resumes after its checkpoint's 2 iterations: 2 x 30 s
    (by["tiny-qwen3__rg_arc_1d__pg_is__s0"].run_dir / "checkpoint" / "state.json").write_text('{"iteration": 1}')
    # left: ppo_clip s1 4 x 10, pg_is s1 4 x 30, dppo s0 and s1 (no timings: the mean, 20 s) 4 x 20 each
    runs = load_study(path).runs
    states = {r.name: run_state(r) for r in runs}
    assert runner_module.time_left(runs, states, parallel=1) == (60 + 40 + 120 + 80 + 80, 2, False)
    assert runner_module.time_left(runs, states, parallel=5).seconds == 120  # each run its own slot
    code, out, _ = run_cli(str(path), "--dry-run")
    assert code == 0 and "~0:06:20 left at the pace the runs logged on other machines (time/iteration_s of 2 runs;" in out
    # Where some runs ran on this machine (its CPU), only they set the pace: pg_is s0 here at 30 s,
    # ppo_clip s0 elsewhere (its 10 s no longer counts): 5 runs' iterations left x 30 s.
    here = {"cpu": "Xeon", "cpu_native_bf16": True, "cpu_cores": 2, "gpu": None}
    (by["tiny-qwen3__rg_arc_1d__pg_is__s0"].run_dir / "config.json").write_text(json.dumps({"_machine": here}))
    (by["tiny-qwen3__rg_arc_1d__ppo_clip__s0"].run_dir / "config.json").write_text(
        json.dumps({"_machine": {**here, "cpu": "AMD EPYC", "cpu_native_bf16": False}}))
    assert runner_module.time_left(runs, states, parallel=1, here=here) == ((2 + 4 + 4 + 4 + 4) * 30, 1, True)
    assert runner_module.time_left(runs, states, parallel=1, here={**here, "cpu_cores": 16}).this_machine is False
    fake_run(by["tiny-qwen3__rg_arc_1d__ppo_clip__s0"].run_dir, 4, checkpoint=True)  # no timings logged
    fake_run(by["tiny-qwen3__rg_arc_1d__pg_is__s0"].run_dir, 2, checkpoint=True)
    assert runner_module.time_left(runs, {r.name: run_state(r) for r in runs}, parallel=1) is None
    assert " left at the pace" not in run_cli(str(path), "--dry-run")[1]


def test_a_progress_line_says_how_long_the_run_has_left(tmp_path):
    """Each new iteration: its number, reward, and the time left at the last 3 iterations' pace;
    an unchanged or rewritten file says nothing again."""
    path, run = one_run_study(tmp_path, iterations=6)
    times = [100.0, 7.0, 9.0, 14.0]  # the first (with the model's load) falls out of the window
    fake_run(run.run_dir, 4, checkpoint=False, rewards=[0.1, 0.2, 0.3, 0.25],
             extra={i: {"time/iteration_s": t} for i, t in enumerate(times)})
    progress = runner_module.read_progress(run.run_dir)
    assert progress.iterations == [0, 1, 2, 3] and progress.reward == 0.25 and progress.iteration_s == 10.0
    out = io.StringIO()
    runner = LocalRunner(load_study(path), [run], parallel=1, out=out)
    child = runner_module._Child(run, proc=None, log=None, started=0.0)
    runner._report_progress(child)
    runner._report_progress(child)
    (run.run_dir / "metrics.jsonl").write_text((run.run_dir / "metrics.jsonl").read_text())  # same lines again
    runner._report_progress(child)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"{run.name}: iteration 4/6  reward 0.250, ~0:00:20 left"), lines


def test_run_states_skip_resume_restart(tmp_path):
    path = tiny_study(tmp_path, iterations=3, grid="seed = [0, 1, 2, 3]")
    study = load_study(path)
    r0, r1, r2, r3 = study.runs
    fake_run(r0.run_dir, 3, checkpoint=True)   # finished
    fake_run(r1.run_dir, 2, checkpoint=True)   # interrupted after 2 iterations
    fake_run(r2.run_dir, 1, checkpoint=False)  # interrupted before its first checkpoint
    with open(r0.run_dir / "metrics.jsonl", "a") as f:
        f.write('{"iteration": 2, "rollout/rew')  # a line cut by a kill does not matter
    assert [run_state(r).status for r in study.runs] == ["done", "resume", "restart", "new"]
    assert run_state(r1).iterations_done == 2
    cmd = main_command(r1, resume=True)
    assert cmd[3:7] == ["--resume", str(r1.run_dir), "--iterations", "3"]
    code, out, _ = run_cli(str(path), "--dry-run")
    assert code == 0
    assert f"{r0.name}  [done (skip)]" in out and f"{r1.name}  [resume at 2/3]" in out
    assert f"{r2.name}  [restart]" in out and f"{r3.name}  [new]" in out
    assert "1 done (skipped), 1 to resume, 2 to start" in out
    # Raising iterations turns a finished run into one to resume.
    path.write_text(path.read_text().replace("iterations = 3", "iterations = 4"))
    assert run_state(load_study(path).runs[0]).status == "resume"


def test_a_run_dir_of_another_configuration_is_refused(tmp_path):
    path = write(tmp_path, f"""
        [study]
        out = "{tmp_path / 'out'}"
        [base]
        model = "tiny-qwen3"
        env = "rg:arc_1d"
        learning_rate = 3e-5
        """)
    run = load_study(path).runs[0]
    saved = to_dict(run.config)
    saved.update(threads=7, iterations=99)  # bookkeeping differences are fine
    fake_run(run.run_dir, 1, checkpoint=True, config=saved)
    assert conflicts([run]) == []
    saved["learning_rate"] = 1e-5
    (run.run_dir / "config.json").write_text(json.dumps(saved))
    code, _, err = run_cli(str(path))
    assert code == 2
    assert "holds a run with another configuration (learning_rate: 1e-05 in the run, 3e-05 in the study)" in err



def test_committed_results_continue_a_study_on_another_clone(tmp_path):
    """[study] results: a finished run is copied there (config.json + metrics.jsonl only); a clone
    that has only the committed copies skips those runs and reports from them; an unfinished run is
    not committed; a committed copy of another configuration is refused."""
    study_text = f"""
        [study]
        out = "{{out}}"
        results = "{tmp_path / 'results'}"
        [base]
        model = "tiny-qwen3"
        env = "rg:arc_1d"
        learning_rate = 3e-5
        iterations = 3
        [grid]
        seed = [0, 1, 2]
        """
    path = write(tmp_path, study_text.format(out=tmp_path / "out"))
    done, partial, _ = load_study(path).runs
    assert done.results_dir == tmp_path / "results" / done.name
    fake_run(done.run_dir, 3, checkpoint=True, config=to_dict(done.config), rewards=[0.1, 0.2, 0.6])
    episode = {"iteration": 0, "return": 0.5, "turns": [{"prompt": "long " * 100, "response": "a", "reward": 0.5}]}
    (done.run_dir / "episodes.jsonl").write_text("".join(json.dumps(dict(episode, iteration=i)) + "\n" for i in (0, 1, 2)))
    (done.run_dir / "warm_start.jsonl").write_text('{"step": 0, "nll": 1.5}\n')  # a warm start's steps: kept too
    fake_run(partial.run_dir, 2, checkpoint=True, config=to_dict(partial.config))
    code, out, _ = run_cli(str(path), "--dry-run")  # a dry run writes nothing
    assert code == 0 and not (tmp_path / "results").exists()
    code, out, err = run_cli(str(path), "--report")
    assert code == 0, err
    assert f"committed {done.name} to {done.results_dir}" in out and partial.name not in out.split("|")[0]
    assert sorted(p.name for p in done.results_dir.iterdir()) == ["config.json", "metrics.jsonl", "responses.jsonl",
                                                                  "warm_start.jsonl"]
    responses = [json.loads(line) for line in (done.results_dir / "responses.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in responses] == [0, 1, 2]
    assert responses[0]["turns"] == [{"response": "a", "reward": 0.5}]  # no prompt
    assert not partial.results_dir.exists()

    # Another clone: a fresh out directory, only the committed copies.
    clone = write(tmp_path, study_text.format(out=tmp_path / "clone"), name="clone.toml")
    runs = load_study(clone).runs
    states = [run_state(r) for r in runs]
    assert [(s.status, s.committed) for s in states] == [("done", True), ("new", False), ("new", False)]
    code, out, _ = run_cli(str(clone), "--dry-run")
    assert f"{runs[0].name}  [done, committed (skip)]" in out and "1 done (skipped), 0 to resume, 2 to start" in out
    code, out, err = run_cli(str(clone), "--report")
    assert code == 0, err
    rows = list(csv.DictReader(open(tmp_path / "clone" / "runs.csv")))
    assert [(r["name"], r["iterations"]) for r in rows] == [(done.name, "3")]
    assert float(rows[0]["final_reward"]) == pytest.approx(0.3)

    # A committed copy of another configuration is refused like a run directory.
    saved = json.loads((done.results_dir / "config.json").read_text())
    saved["learning_rate"] = 1e-5
    (done.results_dir / "config.json").write_text(json.dumps(saved))
    code, _, err = run_cli(str(clone))
    assert code == 2
    assert f"{done.results_dir} holds a run with another configuration (learning_rate: 1e-05 in the run" in err
    assert "give the study another [study] results" in err


def test_responses_keep_the_last_logging_of_each_iteration_and_fill_older_committed_copies(tmp_path):
    """responses.jsonl: episodes.jsonl without prompts; an iteration run again after a resume keeps
    its last logging; a line cut by a kill is skipped. A committed copy made before responses were
    kept gets them, but only from the run it was copied from (the same metrics.jsonl)."""
    from oat_dppo.study.committed import commit, compact_episodes

    def line(iteration: int, text: str) -> str:
        return json.dumps({"iteration": iteration, "turns": [{"prompt": "p", "response": text}]}) + "\n"

    src, dst = tmp_path / "episodes.jsonl", tmp_path / "responses.jsonl"
    # iteration 1 logged, then (killed after its checkpoint at 0) logged again with other episodes
    src.write_text(line(0, "a") + line(0, "b") + line(1, "old") + line(1, "new") + '{"iteration": 2, "tur')
    compact_episodes(src, dst)
    got = [(e["iteration"], e["turns"][0]["response"]) for e in map(json.loads, dst.read_text().splitlines())]
    assert got == [(0, "a"), (0, "b"), (1, "old"), (1, "new")]  # one logging of 1, two episodes
    src.write_text(line(0, "a") + line(1, "old") + line(2, "x") + line(1, "rerun"))
    compact_episodes(src, dst)
    got = [(e["iteration"], e["turns"][0]["response"]) for e in map(json.loads, dst.read_text().splitlines())]
    assert got == [(0, "a"), (1, "rerun"), (2, "x")]

    path, run = one_run_study(tmp_path, iterations=2)
    run = dataclasses.replace(run, results_dir=tmp_path / "committed")
    fake_run(run.run_dir, 2, checkpoint=True, config=to_dict(run.config))
    (run.run_dir / "episodes.jsonl").write_text(line(0, "a") + line(1, "b"))
    run.results_dir.mkdir()
    (run.results_dir / "metrics.jsonl").write_text((run.run_dir / "metrics.jsonl").read_text() + "\n")  # another run
    assert not commit(run) and not (run.results_dir / "responses.jsonl").exists()
    shutil.copyfile(run.run_dir / "metrics.jsonl", run.results_dir / "metrics.jsonl")  # this run's copy
    assert commit(run) and (run.results_dir / "responses.jsonl").is_file()
    assert not commit(run)  # nothing left to write


# ---- the report ---------------------------------------------------------------------------------


REPORT_STUDY = """
    [study]
    name = "rep"
    out = "{out}"
    threshold = 0.5
    [base]
    model = "tiny-qwen3"
    env = "rg:arc_1d"
    iterations = 5
    [grid]
    trust_region = ["ppo_clip", "dppo_binary_tv"]
    seed = [0, 1]
    """


def test_report_numbers_from_synthetic_metrics(tmp_path):
    path = write(tmp_path, REPORT_STUDY.format(out=tmp_path / "out"))
    study = load_study(path)
    by = {r.name: r for r in study.runs}
    clip0, clip1 = by["tiny-qwen3__rg_arc_1d__ppo_clip__s0"], by["tiny-qwen3__rg_arc_1d__ppo_clip__s1"]
    tv0 = by["tiny-qwen3__rg_arc_1d__dppo_binary_tv__s0"]  # tv s1 has no metrics
    # The last-3 mean differs from the last-2, last-4 and all-iterations means in every run below.
    # ppo_clip s0: R = 0.1 0.2 0.9 0.4 0.5 -> final 0.6, best 0.9, reach 2 (first R >= 0.5), auc 0.42
    fake_run(clip0.run_dir, 5, checkpoint=True, rewards=[0.1, 0.2, 0.9, 0.4, 0.5],
             extra={i: {"train/kept_frac": 1.0, "train/prob_diff_mean": 0.01} for i in range(5)} | {
                 4: {"train/kept_frac": 0.5, "train/prob_diff_mean": 0.06, "eval/reward_mean": 0.7}})
    # ppo_clip s1: R = 0 0.3 0 0.2 0.4 -> final 0.2, best 0.4, never reaches 0.5, auc 0.18
    fake_run(clip1.run_dir, 5, checkpoint=True, rewards=[0.0, 0.3, 0.0, 0.2, 0.4],
             extra={i: {"train/kept_frac": 0.7, "train/prob_diff_mean": 0.04} for i in range(5)})
    # dppo s0, 4 iterations (partial): R = 0.5 1 0.3 0.2 -> final 0.5, best 1, reach 0, auc 0.5
    fake_run(tv0.run_dir, 4, checkpoint=True, rewards=[0.5, 1.0, 0.3, 0.2],
             extra={0: {"train/kept_frac": None}, 1: {"train/kept_frac": 0.8}, 2: {"train/kept_frac": 0.6},
                    3: {"train/kept_frac": 0.7}})
    code, out, err = run_cli(str(path), "--report")
    assert code == 0, err
    out_dir = tmp_path / "out"
    rows = list(csv.DictReader(open(out_dir / "summary.csv")))
    assert [(r["trust_region"], r["runs"], r["seeds_with_metrics"], r["seeds"]) for r in rows] == [
        ("ppo_clip", "2", "2", "0 1"), ("dppo_binary_tv", "2", "1", "0")]
    clip, tv = rows

    def close(value: str, expected: float) -> bool:
        return math.isclose(float(value), expected, rel_tol=1e-9, abs_tol=1e-12)

    assert clip["family"] == "chatml" and clip["model"] == "tiny-qwen3" and clip["env"] == "rg:arc_1d"
    assert close(clip["final_reward_mean"], 0.4) and close(clip["final_reward_std"], 0.2)
    assert close(clip["best_reward_mean"], 0.65) and close(clip["best_reward_std"], 0.25)
    assert close(clip["iters_to_threshold_mean"], 2.0) and clip["iters_to_threshold_std"] == "0.0"
    assert clip["reached"] == "1"
    assert close(clip["auc_mean"], 0.30) and close(clip["auc_std"], 0.12)
    assert close(clip["kept_frac_mean"], 0.8) and close(clip["kept_frac_std"], 0.1)
    assert close(clip["prob_diff_mean"], 0.03) and close(clip["prob_diff_std"], 0.01)
    assert close(clip["eval_reward_mean"], 0.7) and clip["eval_reward_std"] == "0.0"
    assert (clip["iterations_min"], clip["iterations_max"]) == ("5", "5")
    assert close(tv["final_reward_mean"], 0.5) and close(tv["best_reward_mean"], 1.0)
    assert close(tv["iters_to_threshold_mean"], 0.0) and close(tv["auc_mean"], 0.5)
    assert close(tv["kept_frac_mean"], 0.7) and tv["prob_diff_mean"] == "" and tv["eval_reward_mean"] == ""
    assert (tv["iterations_min"], tv["iterations_max"]) == ("4", "4")
    md = (out_dir / "summary.md").read_text()
    assert ("| chatml | `tiny-qwen3` | `rg:arc_1d` | ppo_clip | 2 | 5 | 0.400 ± 0.200 | 0.650 ± 0.250 | "
            "2.0 (1/2) | 0.300 ± 0.120 | 0.800 ± 0.100 | 0.03 ± 0.01 | 0.700 |") in md
    assert "| chatml | `tiny-qwen3` | `rg:arc_1d` | dppo_binary_tv | 1/2 | 4 | 0.500 | 1.000 | 0.0 | 0.500 | 0.700 | - | - |" in md
    # stability: ppo_clip s1 sits at arc_1d's floor (reward 0) in 2 iterations, s0 in none
    # (final reward, what its final answer earns: no episodes logged, lowest, runs / iterations at the floor,
    # well-formed per seed, kept, mismatch, drift)
    assert ("| `tiny-qwen3` | `rg:arc_1d` | ppo_clip | 2 | 0.400 ± 0.200 | - | 0.050 ± 0.050 | 1/2 | 1.0 ± 1.0 | "
            "-, - | 0.800 ± 0.100 | - | 0.03 ± 0.01 |") in md
    assert "| `tiny-qwen3` | `rg:arc_1d` | dppo_binary_tv | 1/2 | 0.500 | - | 0.200 | 0/1 | 0.0 | - | 0.700 | - | - |" in md
    assert "No metrics yet (1): `tiny-qwen3__rg_arc_1d__dppo_binary_tv__s1`" in md
    assert "Unfinished (1; in the table with the iterations they have, left out of the tests): " \
           "`tiny-qwen3__rg_arc_1d__dppo_binary_tv__s0` (4/5)" in md
    assert not (out_dir / "mismatch.png").exists()  # no run logged train/mismatch_mean
    for png in ("reward.png", "drift.png", "kept.png"):
        assert (out_dir / png).stat().st_size > 5000, png
    assert "| ppo_clip |" in out and f"wrote {out_dir / 'summary.csv'}" in out


def test_report_groups_by_model_and_other_varied_options(tmp_path):
    path = write(tmp_path, f"""
        [study]
        out = "{tmp_path / 'out'}"
        [base]
        env = "rg:arc_1d"
        iterations = 2
        [grid]
        model = ["tiny-llama", "tiny-qwen3"]
        variant = [{{trust_region = "dppo_binary_tv", delta = 0.1}}, {{trust_region = "dppo_binary_tv", delta = 0.3}}]
        """)
    study = load_study(path)
    for i, run in enumerate(study.runs):
        fake_run(run.run_dir, 2, checkpoint=True, rewards=[0.0, float(i)])
    code, _, err = run_cli(str(path), "--report")
    assert code == 0, err
    rows = list(csv.DictReader(open(tmp_path / "out" / "summary.csv")))
    assert [(r["family"], r["model"], r["delta"], r["final_reward_mean"]) for r in rows] == [
        ("llama3", "tiny-llama", "0.1", "0.0"), ("llama3", "tiny-llama", "0.3", "0.5"),
        ("chatml", "tiny-qwen3", "0.1", "1.0"), ("chatml", "tiny-qwen3", "0.3", "1.5")]
    assert "iters_to_threshold_mean" in rows[0] and rows[0]["threshold"] == ""
    assert "iters to" not in (tmp_path / "out" / "summary.md").read_text()


def test_runs_csv_one_row_per_run_with_collapse_count(tmp_path):
    """runs.csv: the columns of the GPU mismatch study, one row per run; an iteration is collapsed
    when its mean reward sits at the env's format-failure floor (GEM games: -0.1, + format_penalty)."""
    path = write(tmp_path, f"""
        [study]
        out = "{tmp_path / 'out'}"
        final_window = 2
        [base]
        env = "game:GuessTheNumber-v0-easy"
        model = "tiny-qwen3"
        iterations = 5
        [grid]
        engine = ["hf", "vllm"]
        seed = [0]
        """)
    study = load_study(path)
    assert study.final_window == 2
    hf, vl = study.runs
    avx2 = {"cpu": "AMD EPYC", "cpu_native_bf16": False, "gpu": None, "torch": "torch 2.13.0+cpu"}
    # well-formed 0.5 0.0 | 0.1 0.9 1.0: the lowest after the first window (2 iterations) is 0.1
    fake_run(hf.run_dir, 5, checkpoint=True, config={"_machine": avx2}, rewards=[0.2, -0.1, -0.095, 0.5, 0.7],
             extra={i: {"train/kept_frac": 0.9, "train/prob_diff_mean": 0.002, "train/entropy": 1.0 - i / 10,
                        "train/mismatch_mean": 0.001 * i, "train/ratio_max": 1.0 + i % 3,
                        "rollout/well_formed_rate": [0.5, 0.0, 0.1, 0.9, 1.0][i],
                        "rollout/feedback_follow_rate": [0.5, 0.5, 0.6, 0.8, 1.0][i],
                        **({"eval/reply_effect": [0.1, 0.6][i // 2 - 1], "eval/outcome_correct": [1.5, 2.5][i // 2 - 1]}
                           if i in (2, 4) else {})} for i in range(5)})
    fake_run(vl.run_dir, 5, checkpoint=True, rewards=[0.1, 0.1, 0.3, 0.2, -0.1])
    code, _, err = run_cli(str(path), "--report")
    assert code == 0, err
    rows = list(csv.DictReader(open(tmp_path / "out" / "runs.csv")))
    assert list(rows[0])[:17] == ["name", "model", "env", "engine", "trust_region", "seed", "iterations",
                                  "final_reward", "min_reward", "collapsed_iterations", "kept_frac_mean",
                                  "prob_diff_mean", "entropy_min", "eval_reward", "mismatch_mean",
                                  "entropy_final", "ratio_max"]
    by = {r["engine"]: r for r in rows}
    assert by["hf"]["collapsed_iterations"] == "2" and by["vllm"]["collapsed_iterations"] == "1"
    assert float(by["hf"]["final_reward"]) == pytest.approx(0.6)  # last 2 iterations
    assert float(by["hf"]["min_reward"]) == pytest.approx(-0.1)
    assert float(by["hf"]["entropy_min"]) == pytest.approx(0.6) and by["vllm"]["entropy_min"] == ""
    assert float(by["hf"]["mismatch_mean"]) == pytest.approx(0.002) and by["vllm"]["mismatch_mean"] == ""
    assert float(by["hf"]["entropy_final"]) == pytest.approx(0.65) and by["vllm"]["entropy_final"] == ""
    assert float(by["hf"]["ratio_max"]) == 3.0 and by["vllm"]["ratio_max"] == ""
    assert float(by["hf"]["well_formed_min"]) == 0.1 and by["vllm"]["well_formed_min"] == ""
    # GuessTheNumber-easy: 4 distinct guesses of 1..10 whatever the replies say; feedback use over the last 2
    assert float(by["hf"]["blind_success"]) == pytest.approx(0.4) == float(by["vllm"]["blind_success"])
    assert float(by["hf"]["hint_direction_agreement_final"]) == pytest.approx(0.9)
    assert by["vllm"]["hint_direction_agreement_final"] == ""
    assert (float(by["hf"]["eval_reply_effect"]), float(by["hf"]["eval_correct_per_episode"])) == (0.6, 2.5)  # the last
    assert by["vllm"]["eval_reply_effect"] == ""
    assert by["hf"]["machine"] == "AMD EPYC (no native bf16), torch 2.13.0+cpu"
    assert by["vllm"]["machine"] == "not recorded"  # a config.json without _machine (runs before it existed)
    assert (tmp_path / "out" / "entropy.png").stat().st_size > 5000
    assert by["hf"]["iterations"] == "5" and by["hf"]["seed"] == "0"
    md = (tmp_path / "out" / "summary.md").read_text()
    # final reward, what its answer earns (no episodes), lowest reward, runs at the floor, iterations at the
    # floor, lowest well-formed rate per seed, kept, mismatch, drift, final entropy, largest pi/mu
    row = "| `tiny-qwen3` | `game:GuessTheNumber-v0-easy` | dppo_binary_tv | {} | 1 | {} | - | -0.100 | 1/1 | {} |"
    assert row.format("hf", "0.600", "2.0 | 0.10 | 0.900 | 0.002 | 0.002 | 0.65 | 3") in md
    assert row.format("vllm", "0.050", "1.0 | - | - | - | - | - | -") in md
    assert "AMD EPYC (no native bf16), torch 2.13.0+cpu: 1 run; not recorded: 1 run" in md


def test_a_batch_of_well_formed_wrong_answers_is_not_a_collapse():
    """math's wrong answers earn its format-failure floor (0) too: only iterations at the floor with
    most turns malformed count as collapsed; where the well-formed rate was not logged, the reward
    alone decides (runs from before it existed)."""
    from oat_dppo.study.run_results import floor_iterations

    nan = math.nan
    reward = np.array([0.0, 0.0, 0.005, 0.3, 0.0, nan])
    well_formed = np.array([1.0, 0.2, 0.49, 0.0, nan, 0.0])
    assert floor_iterations(reward, well_formed, 0.0) == 3  # iterations 1, 2 (malformed) and 4 (not logged)
    assert floor_iterations(reward, np.full(6, nan), 0.0) == 4
    assert floor_iterations(reward, well_formed, -0.1) == 0


def test_report_says_what_each_run_says_at_the_end(tmp_path):
    """From the sample episodes of the final window: the most common response, its share of the
    turns, and how often a turn repeats the turn before word for word."""
    path = tiny_study(tmp_path, iterations=5, grid="seed = [0, 1]", final_window=2)
    said, silent = load_study(path).runs
    fake_run(said.run_dir, 5, checkpoint=True)
    fake_run(silent.run_dir, 5, checkpoint=True)  # no episodes.jsonl

    def episode(iteration: int, *responses: str) -> str:
        return json.dumps({"iteration": iteration, "turns": [{"prompt": "p", "response": r} for r in responses]}) + "\n"

    # before the final window (iterations 3-4): ignored
    (said.run_dir / "episodes.jsonl").write_text(episode(0, "x", "y") + episode(2, "x", "x", "x") +
                                                 episode(3, "a|1\n\x07", "a|1\n\x07", "b") +
                                                 episode(4, "a|1\n\x07", "a|1\n\x07"))
    code, _, err = run_cli(str(path), "--report")
    assert code == 0, err
    rows = {r["seed"]: r for r in csv.DictReader(open(tmp_path / "out" / "runs.csv"))}
    assert rows["0"]["final_response"] == "a|1\n\x07" and float(rows["0"]["final_response_share"]) == pytest.approx(0.8)
    assert float(rows["0"]["repeat_rate_final"]) == pytest.approx(2 / 3)  # a->a, a->b, a->a
    assert rows["1"]["final_response"] == "" and rows["1"]["repeat_rate_final"] == ""
    md = (tmp_path / "out" / "summary.md").read_text()
    # | escaped, the newline shown as \n, the bell byte as \x07: the report stays plain text
    assert "| dppo_binary_tv | 0 | `a\\|1\\n\\x07` | 0.80 | 0.667 |" in md
    assert "| dppo_binary_tv | 1 |" not in md
    assert "| - | - | - | 0.667 |" in md  # stability table: no mismatch, entropy, ratio logged; repeats of 1 seed


def test_report_without_metrics_is_an_error(tmp_path):
    code, _, err = run_cli(str(write(tmp_path, REPORT_STUDY.format(out=tmp_path / "out"))), "--report")
    assert code == 2 and "has metrics" in err


# ---- the Oat backend ----------------------------------------------------------------------------


def test_oat_backend_writes_the_launch_script(tmp_path):
    path = write(tmp_path, SMALL.format(out=tmp_path / "out").replace('threshold = 0.5', 'backend = "oat"'))
    code, out, _ = run_cli(str(path), "--dry-run")
    assert code == 0 and not (tmp_path / "out" / "launch_oat.sh").exists()
    code, out, _ = run_cli(str(path))
    assert code == 0
    script = tmp_path / "out" / "launch_oat.sh"
    assert f"wrote {script}" in out
    lines = script.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash" and os.access(script, os.X_OK)
    cmds = [x for x in lines if x.startswith("python ")]
    study = load_study(path)
    assert len(cmds) == len(study.runs) == 4
    for cmd, run in zip(cmds, study.runs):
        assert cmd.startswith("python -m oat_dppo.main --env rg:arc_1d ")
        assert f"--run-dir {run.run_dir} --backend oat" in cmd and "--threads" not in cmd
    assert "--trust-region dppo_binary_tv --delta 0.1" in cmds[0] and "--seed 1" in cmds[1]
    text = script.read_text()  # how to continue names Oat's own resume option, not the local one
    assert "--resume-dir" in text and "--save-ckpt" in text and "--resume <" not in text
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["launch_oat.sh"]  # nothing ran


# ---- real runs (tiny-qwen3, seconds) -------------------------------------------------------------

TINY = """
    [study]
    name = "tiny"
    out = "{out}"
    parallel = {parallel}
    [base]
    model = "tiny-qwen3"
    engine = "hf"
    env = "rg:arc_1d"
    max_new_tokens = 4
    episodes_per_iteration = 2
    mini_batch_size = 2
    micro_batch_size = 2
    eval_every = 0
    log = "none"
    iterations = {iterations}
    [grid]
    {grid}
    """


def metric_iterations(run_dir: Path) -> list[int]:
    return [json.loads(x)["iteration"] for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def children_of(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


def test_failed_run_is_reported_and_the_study_goes_on(tmp_path):
    (tmp_path / "not_a_model").mkdir()  # a directory: passes the study's checks, fails to load
    grid = f'variant = [{{seed = 0}}, {{seed = 1, model = "{tmp_path / "not_a_model"}"}}]'
    text = TINY.format(out=tmp_path / "out", parallel=2, iterations=1, grid=grid)
    text = text.replace("    [base]", f'    results = "{tmp_path / "results"}"\n    [base]')
    path = write(tmp_path, text)
    good, bad = load_study(path).runs
    code, out, err = run_cli(str(path))
    assert code == 1, out + err
    assert f"FAILED (exit 2): {bad.name}; log: {bad.run_dir}.log" in out
    assert f"Cannot load model '{tmp_path / 'not_a_model'}'" in out  # the log's tail
    assert "Cannot load model" in Path(f"{bad.run_dir}.log").read_text()
    assert f"done: {good.name} (1 iterations" in out
    assert f"; committed to {good.results_dir}" in out and not bad.results_dir.exists()
    assert metric_iterations(good.results_dir) == [0]
    assert metric_iterations(good.run_dir) == [0]
    assert "study tiny: 1 runs done, 1 failed" in out
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "1 have metrics" in md and f"`{bad.name}`" in md


def stop_a_running_study(tmp_path, stop) -> tuple:
    """A one-run study of 500 iterations, `stop(runner_process)` once its run logged an iteration and saved a
    checkpoint; (the runner's exit status, its output, the run, the study file)."""
    path = write(tmp_path, TINY.format(out=tmp_path / "out", parallel=1, iterations=500, grid="seed = [0]"))
    run = load_study(path).runs[0]
    metrics = run.run_dir / "metrics.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "oat_dppo.study", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not (metrics.exists() and metrics.read_text().strip() and has_checkpoint(run.run_dir)):
            assert proc.poll() is None and time.monotonic() < deadline, "the run never logged an iteration"
            time.sleep(0.2)
        stop(proc)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # the test failed: leave no training process behind
            for kid in children_of(proc.pid):
                os.kill(kid, signal.SIGKILL)
            proc.kill()
            proc.wait()
    return proc.returncode, out, run, path


@pytest.mark.timeout(300)
def test_a_run_a_scheduler_stops_is_recorded_as_stopped_not_done(tmp_path):
    """SIGTERM to the run's own process (not the runner), as a scheduler's preemption: the run ends with
    its stop status (143) and a checkpoint, the runner records it as stopped, and the study is not done."""
    def preempt(runner):
        [child] = children_of(runner.pid)
        os.kill(child, signal.SIGTERM)

    code, out, run, _ = stop_a_running_study(tmp_path, preempt)
    assert code == 130, out
    assert f"stopped: {run.name}" in out and "FAILED" not in out and "done:" not in out, out
    assert "0 runs done, 1 stopped by a signal, 0 failed" in out
    assert run_state(run).status == "resume"


@pytest.mark.timeout(300)
def test_ctrl_c_checkpoints_then_resume_then_skip(tmp_path):
    code, out, run, path = stop_a_running_study(tmp_path, lambda runner: runner.send_signal(signal.SIGINT))
    assert code == 130, out
    assert f"stopped: {run.name}" in out and "(checkpoint saved)" in out
    assert (f"continue with (finished runs are skipped, interrupted ones resumed):\n  {os.path.relpath(sys.executable, REPO)} "
            f"-m oat_dppo.study {path}") in out
    assert (run.run_dir / "checkpoint" / "state.json").exists()
    done = len(metric_iterations(run.run_dir))
    assert 1 <= done < 500
    assert run_state(run).status == "resume"

    # Continue, asking for one more iteration than were logged: resumed, not restarted.
    path.write_text(path.read_text().replace("iterations = 500", f"iterations = {done + 1}"))
    code, out2, err2 = run_cli(str(path))
    assert code == 0, out2 + err2
    assert f"resume after iteration {done}/{done + 1}: {run.name}" in out2
    # Progress: elapsed, runs done / total, the run's latest iteration and reward.
    progress = rf"\[\d+:\d\d:\d\d 0/1 done\] {re.escape(run.name)}: iteration {done + 1}/{done + 1}  reward -?\d\.\d{{3}}"
    assert re.search(progress, out2), out2
    assert re.search(rf"\[\d+:\d\d:\d\d 1/1 done\] done: {re.escape(run.name)}", out2), out2
    assert metric_iterations(run.run_dir) == list(range(done + 1))
    log = Path(f"{run.run_dir}.log").read_text()
    assert log.count("=== ") == 2 and f"--resume {run.run_dir} --iterations {done + 1}" in log

    # Everything done: nothing starts, the report is rewritten.
    code, out3, _ = run_cli(str(path))
    assert code == 0 and "every run is done: nothing to run" in out3
    assert Path(f"{run.run_dir}.log").read_text().count("=== ") == 2
    assert (tmp_path / "out" / "summary.csv").exists()


def test_one_runner_per_study_directory(tmp_path):
    import fcntl

    path = write(tmp_path, f"""
        [study]
        out = "{tmp_path / 'out'}"
        [base]
        model = "tiny-qwen3"
        env = "rg:arc_1d"
        """)
    (tmp_path / "out").mkdir()
    with open(tmp_path / "out" / ".study.lock", "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, _, err = run_cli(str(path))
    assert code == 2 and "another `python -m oat_dppo.study` is running the runs in" in err
    assert not log_path(load_study(path).runs[0]).exists()  # nothing was started


DRAWS_STUDY = """
    [study]
    name = "{name}"
    out = "{out}"
    results = "{results}"
    final_window = 2
    [base]
    model = "tiny-qwen3"
    env = "game:GuessTheNumber-v0-easy"
    iterations = 6
    engine = "{engine}"
    [grid]
    seed = [0, 1]
    trust_region = ["pg_is", "dppo_binary_tv"]
    """


def test_report_counts_every_windows_draws_and_compares_each_arm_with_its_control(tmp_path):
    """A grid point run in two GPU windows is two draws: the report reads each window's record
    (`gpu_window_<date>.csv` beside the committed results), counts the finished draws stuck at the floor
    (-0.1 in GuessTheNumber) with a Wilson interval, keeps stopped ones apart, and puts each arm beside
    its control (`<study>_control.toml`): "not run yet" until the control has runs."""
    results = tmp_path / "results"
    results.mkdir()
    path = write(tmp_path, DRAWS_STUDY.format(name="dec", out=tmp_path / "out", results=results / "dec", engine="vllm"),
                 name="dec.toml")
    control = write(tmp_path, DRAWS_STUDY.format(name="dec_control", out=tmp_path / "out_control",
                                                 results=results / "dec_control", engine="hf"), name="dec_control.toml")

    def record(window: str, draws: dict) -> None:
        lines = ["study,trust_region,seed,iteration,rollout_reward_mean"]
        lines += [f"{study},{tr},{seed},{i},{r}" for (study, tr, seed), rewards in draws.items()
                  for i, r in enumerate(rewards)]
        (results / f"gpu_window_{window}.csv").write_text("\n".join(lines) + "\n")

    record("2026-12-01", {("dec", "pg_is", 0): [0.1, 0.5, -0.1, -0.1, -0.1, -0.1],  # stuck from 2
                          ("dec", "pg_is", 1): [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
                          ("dec", "dppo_binary_tv", 0): [0.1, 0.2, -0.1, -0.1],  # stopped at 4 of 6, stuck
                          ("other", "pg_is", 1): [-0.1] * 6})  # another study's run: not this one's
    record("2026-12-02", {("dec", "pg_is", 0): [0.1, 0.5, 0.6, 0.6, 0.6, 0.6],  # the same seed, another draw
                          ("dec", "dppo_binary_tv", 1): [0.2, -0.1, 0.2, 0.2, 0.2, 0.2]})
    first = load_study(path).runs[0]  # the study's committed copy of pg_is s0: the first window's draw
    fake_run(first.results_dir, 6, checkpoint=False, rewards=[0.1, 0.5, -0.1, -0.1, -0.1, -0.1],
             config=to_dict(first.config))
    code, out, err = run_cli(str(path), "--report")
    assert code == 0, err
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| 2026-12-01 | pg_is | 0 | 6 | 2 | 4 | -0.10 |" in md
    assert "| 2026-12-02 | pg_is | 0 | 6 | - | 0 | 0.60 |" in md
    assert "| 2026-12-01 | dppo_binary_tv | 0 | 4 of 6 (stopped) | 2 | 2 | -0.10 |" in md
    assert "| 2026-12-02 | dppo_binary_tv | 1 | 6 | - | 1 | 0.20 |" in md
    assert "other" not in md
    # pg_is: 1 of 3 finished draws stuck, Wilson 95% 0.06-0.79; dppo_binary_tv: 0 of 1, its stopped draw apart
    assert "| pg_is | vllm float32 | 1/3 | 0.06-0.79 | 1.3 ± 1.9 | 0.350 ± 0.319 | - |" in md
    assert "| dppo_binary_tv | vllm float32 | 0/1 | 0.00-0.79 | 1.0 | 0.200 | 4/6 (stuck) |" in md
    assert "| pg_is | hf float32 (control) | " + " | ".join(["not run yet"] * 5) + " |" in md
    assert "pg_is vs dppo_binary_tv: p = 1.000; pg_is vs its control: not run yet" in md
    # Once the control has a run (here a committed one, no window record): it fills its row.
    study = load_study(control)
    fake_run(study.runs[0].results_dir, 6, checkpoint=False, rewards=[0.1, 0.5, 0.7, 0.7, 0.8, 0.8],
             config=to_dict(study.runs[0].config))
    assert run_cli(str(path), "--report")[0] == 0
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| pg_is | hf float32 (control) | 0/1 | 0.00-0.79 | 0.0 | 0.800 | - |" in md
    assert "pg_is vs its control: p = 1.000; dppo_binary_tv vs its control: not run yet" in md


def test_iterations_without_reward_spread_are_counted_per_run_where_the_std_was_logged(tmp_path):
    """The absorbing floor: an iteration whose episodes all earned the same reward (rollout/reward_std
    0) gives every turn a normalised advantage of 0 and moves nothing. The report counts such
    iterations per run (runs.csv `zero_spread_iterations`, the stability table's last column),
    whatever the reward; a run that never logged the std has no count (blank), not 0."""
    from oat_dppo.study.run_results import zero_spread_iterations

    nan = math.nan
    assert zero_spread_iterations(np.array([0.0, 0.3, 0.0, nan, 1e-12])) == 3.0
    assert math.isnan(zero_spread_iterations(np.array([nan, nan])))
    path = write(tmp_path, f"""
        [study]
        out = "{tmp_path / 'out'}"
        [base]
        env = "rg:arc_1d"
        model = "tiny-qwen3"
        iterations = 4
        [grid]
        seed = [0, 1]
        """)
    s0, s1 = load_study(path).runs
    # s0: stuck at reward 1.0 (not a format failure) for its last 3 iterations; s1 logged no std (older runs)
    fake_run(s0.run_dir, 4, checkpoint=True, rewards=[0.4, 1.0, 1.0, 1.0],
             extra={i: {"rollout/reward_std": [0.2, 0.0, 0.0, 0.0][i]} for i in range(4)})
    fake_run(s1.run_dir, 4, checkpoint=True, rewards=[0.1, 0.2, 0.3, 0.4])
    code, _, err = run_cli(str(path), "--report")
    assert code == 0, err
    rows = {r["seed"]: r for r in csv.DictReader(open(tmp_path / "out" / "runs.csv"))}
    assert rows["0"]["zero_spread_iterations"] == "3.0" and rows["1"]["zero_spread_iterations"] == ""
    assert rows["0"]["collapsed_iterations"] == "0"  # not the format-failure floor: a different count
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "iterations with no reward spread |" in md
    assert re.search(r"\| `tiny-qwen3` \| `rg:arc_1d` \| dppo_binary_tv \|.*\| 3\.0 \|\n", md), md
