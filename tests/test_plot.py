"""`python -m oat_dppo.plot`: reading metrics.jsonl, seed aggregation (exact numbers), PNGs, bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.child import child_env

from oat_dppo.plot import (
    Series,
    aggregate,
    find_run_dirs,
    group_runs,
    load_run,
    main,
    parse_metrics,
    read_metrics,
    resolve_panels,
    trailing_mean,
)

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TRUST_REGIONS = ("dppo_binary_tv", "ppo_clip")
SEEDS = (0, 1, 2)


def write_run(run_dir: Path, config: dict, rows: list, tail: str = "") -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config))
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    (run_dir / "metrics.jsonl").write_text(text + tail)
    return run_dir


def fake_rows(trust_region: str, seed: int, iterations: int = 30, eval_every: int = 5) -> list[dict]:
    """Plausible curves: DPPO's reward rises faster and its mismatch stays lower than PPO-clip's."""
    rng = np.random.default_rng(100 * seed + len(trust_region))
    fast = trust_region.startswith("dppo")
    rows = []
    t = 0.0
    for it in range(1, iterations + 1):
        t += 20 + rng.uniform(0, 5)
        progress = 1 - math.exp(-it / (8 if fast else 15))
        row = {
            "iteration": it,
            "wall_time": round(t, 2),
            "rollout/reward_mean": 0.1 + 0.7 * progress + rng.normal(0, 0.05),
            "rollout/return_mean": 0.1 + 0.6 * progress,
            "rollout/success_rate": min(1.0, max(0.0, 0.6 * progress + rng.normal(0, 0.05))),
            "rollout/turns_mean": 4 + rng.uniform(0, 2),
            "rollout/response_tokens_mean": 80 + rng.uniform(0, 40),
            "train/kept_frac": (0.97 if fast else 0.90) + rng.uniform(-0.02, 0.02),
            "train/kept_frac_pos": 0.95,
            "train/kept_frac_neg": 0.93,
            "train/prob_diff_mean": (0.01 if fast else 0.02) * (1 + 0.05 * it) + rng.uniform(0, 0.003),
            "train/prob_diff_max": 0.6 + rng.uniform(0, 0.3),
            "train/mismatch_mean": 0.005 + rng.uniform(0, 0.001),
            "train/entropy": 1.2 - 0.5 * progress + rng.normal(0, 0.02),
            "train/loss": rng.normal(0, 0.1),
            "train/grad_norm": 0.5 + rng.uniform(0, 0.5),
            "train/masked_mu_mean": None if fast and it % 7 == 0 else 0.3,
            "train/bad_update_frac": 0.0,
            "time/generate_s": 15.0,
            "time/train_s": 5.0,
        }
        if it % eval_every == 0:
            row["eval/reward_mean"] = 0.05 + 0.7 * progress
            row["eval/success_rate"] = 0.5 * progress
        rows.append(row)
    return rows


@pytest.fixture
def runs_root(tmp_path: Path) -> Path:
    """runs/<env>-<trust region>-s<seed>/: two trust regions x three seeds, the way the trainer names them."""
    root = tmp_path / "runs"
    for tr in TRUST_REGIONS:
        for seed in SEEDS:
            name = f"sudoku-{tr}-s{seed}"
            cfg = {
                "env": "game:Sudoku-v0-easy",
                "trust_region": tr,
                "model": "smollm2",
                "seed": seed,
                "run_dir": str(root / name),
                "iterations": 30,
                "learning_rate": 1e-5,
            }
            rows = fake_rows(tr, seed)
            tail = ""
            if seed == 1:  # resumed at iteration 20: 21..24 logged twice
                rows = rows[:24] + rows[20:]
            if seed == 2:  # killed mid-write
                tail = '{"iteration": 31, "rollout/rew'
            write_run(root / name, cfg, rows, tail)
    return root


def assert_png(path: Path, min_bytes: int = 15_000) -> None:
    assert path.is_file(), path
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > min_bytes, (path, len(data))


# ---- reading ------------------------------------------------------------------------------------


def test_parse_resumed_duplicates_last_wins_truncated_line_skipped_nulls_are_nan():
    warnings: list[str] = []
    lines = [
        '{"iteration": 1, "wall_time": 1.0, "m": 1.0, "only_first": 5}',
        '{"iteration": 2, "wall_time": 2.0, "m": 2.0}',
        '{"iteration": 3, "wall_time": 3.0, "m": 3.0}',
        # resumed from the checkpoint after iteration 1: 2 and 3 again, whole lines replace the old ones
        '{"iteration": 2, "wall_time": 12.0, "m": 20.0}',
        '{"iteration": 3, "wall_time": 13.0, "m": null, "x": "text", "b": true}',
        "",
        '{"iteration": 4, "wall_time": 14.0, "m": 4',  # killed mid-write
    ]
    t = parse_metrics(lines, source="metrics.jsonl", warn=warnings.append)
    assert t.iterations.tolist() == [1, 2, 3]
    assert t.columns["wall_time"].tolist() == [1.0, 12.0, 13.0]
    m = t.columns["m"]
    assert m[:2].tolist() == [1.0, 20.0] and math.isnan(m[2])
    assert t.columns["only_first"][0] == 5.0 and np.isnan(t.columns["only_first"][1:]).all()
    assert np.isnan(t.columns["x"]).all() and np.isnan(t.columns["b"]).all()  # not numbers
    assert t.keys() == ["m", "only_first", "wall_time"]
    assert len(warnings) == 1 and "last line" in warnings[0] and "killed" in warnings[0]


def test_parse_skips_bad_lines_in_the_middle_with_a_warning():
    warnings: list[str] = []
    t = parse_metrics(['{"iteration": 1, "m": 1}', "garbage", "[1, 2]", '{"m": 3}', '{"iteration": 2, "m": 2}'],
                      warn=warnings.append)
    assert t.iterations.tolist() == [1, 2] and t.columns["m"].tolist() == [1.0, 2.0]
    assert len(warnings) == 3 and "line 2" in warnings[0] and "line 3" in warnings[1] and "line 4" in warnings[2]


def test_parse_recovers_a_line_glued_to_a_cut_off_one():
    # killed mid-write, then the resumed run appended without a newline in between
    warnings: list[str] = []
    t = parse_metrics(['{"iteration": 1, "m": 1}', '{"iteration": 2, "m": 2.5, "x": {"iteration": 2, "m": 2}',
                       '{"iteration": 3, "m": 3}', "", ""], warn=warnings.append)
    assert t.iterations.tolist() == [1, 2, 3] and t.columns["m"].tolist() == [1.0, 2.0, 3.0]
    assert len(warnings) == 1 and "glued" in warnings[0]
    warnings.clear()
    parse_metrics(['{"iteration": 1, "m": 1}', '{"itera', "", ""], warn=warnings.append)
    assert len(warnings) == 1 and "last line" in warnings[0]


def test_read_metrics_from_file_and_empty_file(tmp_path: Path):
    d = write_run(tmp_path / "r", {}, [{"iteration": 0, "m": 1.5}])
    assert read_metrics(d).columns["m"].tolist() == [1.5]
    (d / "metrics.jsonl").write_text("")
    assert len(read_metrics(d / "metrics.jsonl", warn=lambda m: None)) == 0


# ---- aggregation --------------------------------------------------------------------------------


def table(rows: list[dict]):
    return parse_metrics([json.dumps(r) for r in rows], warn=pytest.fail)


def test_aggregate_mean_std_and_minmax_over_seeds_exact():
    a = table([{"iteration": i, "wall_time": 10.0 * i, "r": v} for i, v in [(1, 1.0), (2, 2.0), (3, 3.0)]])
    b = table([{"iteration": i, "wall_time": 10.0 * i + 2, "r": v} for i, v in [(1, 3.0), (2, 4.0), (3, 5.0)]])
    # c: null at iteration 2 (left out there, not a 0), missing key at 3, one iteration further
    c = table([{"iteration": 1, "wall_time": 16.0, "r": 5.0}, {"iteration": 2, "r": None}, {"iteration": 3},
               {"iteration": 4, "wall_time": 40.0, "r": 7.0}])
    cur = aggregate([a, b, c], "r", band="std")
    assert cur.iterations.tolist() == [1, 2, 3, 4]
    assert cur.x.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert cur.n.tolist() == [3, 2, 2, 1]
    assert cur.mean.tolist() == [3.0, 3.0, 4.0, 7.0]
    sd1 = math.sqrt(8 / 3)  # population std of 1, 3, 5
    np.testing.assert_allclose(cur.lo, [3 - sd1, 2.0, 3.0, 7.0])
    np.testing.assert_allclose(cur.hi, [3 + sd1, 4.0, 5.0, 7.0])

    mm = aggregate([a, b, c], "r", band="minmax")
    assert mm.lo.tolist() == [1.0, 2.0, 3.0, 7.0] and mm.hi.tolist() == [5.0, 4.0, 5.0, 7.0]

    wt = aggregate([a, b, c], "r", x="wall_time")  # x: mean wall time of the runs with a point there
    assert wt.x.tolist() == [(10 + 12 + 16) / 3, 21.0, 31.0, 40.0]


def test_aggregate_smooths_each_run_over_its_own_points_then_averages():
    assert trailing_mean(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), 2).tolist() == [1.0, 1.5, 2.5, 3.5, 4.5]
    assert trailing_mean(np.array([2.0, 4.0]), 5).tolist() == [2.0, 3.0]
    # eval logged every 2nd iteration: smoothing spans evaluations, not the gaps between them
    a = table([{"iteration": i, "e": (float(i) if i % 2 == 0 else None)} for i in range(1, 7)])
    b = table([{"iteration": i, "e": (float(i) + 2 if i % 2 == 0 else None)} for i in range(1, 7)])
    cur = aggregate([a, b], "e", smooth=2)
    assert cur.iterations.tolist() == [2, 4, 6]
    # a smoothed: 2, 3, 5; b smoothed: 4, 5, 7
    assert cur.mean.tolist() == [3.0, 4.0, 6.0]
    assert cur.lo.tolist() == [2.0, 3.0, 5.0] and cur.hi.tolist() == [4.0, 5.0, 7.0]


def test_aggregate_metric_absent_everywhere_is_empty_and_bad_band_raises():
    a = table([{"iteration": 1, "r": 1.0}])
    assert len(aggregate([a], "nope")) == 0
    with pytest.raises(ValueError, match="band"):
        aggregate([a], "r", band="sem")


def test_aggregate_on_the_fake_runs_dedups_resumed_and_skips_truncated(runs_root: Path):
    tables = {s: read_metrics(runs_root / f"sudoku-dppo_binary_tv-s{s}", warn=lambda m: None) for s in SEEDS}
    assert all(t.iterations.tolist() == list(range(1, 31)) for t in tables.values())
    cur = aggregate(list(tables.values()), "rollout/reward_mean")
    assert cur.n.tolist() == [3] * 30
    expected = np.mean([[r["rollout/reward_mean"] for r in fake_rows("dppo_binary_tv", s)] for s in SEEDS], axis=0)
    np.testing.assert_allclose(cur.mean, expected, rtol=0, atol=1e-12)
    ev = aggregate(list(tables.values()), "eval/reward_mean")
    assert ev.iterations.tolist() == [5, 10, 15, 20, 25, 30]


# ---- grouping, discovery, metric names ----------------------------------------------------------


def test_group_runs_by_trust_region_splits_on_other_config_differences(runs_root: Path):
    runs = [load_run(d, warn=lambda m: None) for d in find_run_dirs(runs_root)]
    assert len(runs) == 6
    series = group_runs(runs, by="trust_region", warn=pytest.fail)
    assert [(s.label, len(s.runs), s.legend) for s in series] == [
        ("dppo_binary_tv", 3, "dppo_binary_tv (3 seeds)"),
        ("ppo_clip", 3, "ppo_clip (3 seeds)"),
    ]
    for i, run in enumerate(runs):  # seeds run at other commits, on other machines: still one group each
        run.config.update(_git_commit=f"c{i}", _machine={"cpu": f"cpu{i % 2}", "cpu_native_bf16": i % 2 == 0})
    assert [len(s.runs) for s in group_runs(runs, by="trust_region", warn=pytest.fail)] == [3, 3]
    by_seed = group_runs(runs, by="seed", warn=lambda m: None)
    assert [s.label for s in by_seed] == [
        f"seed={s} [trust_region={tr}]" for s in SEEDS for tr in TRUST_REGIONS
    ]
    runs[0].config["learning_rate"] = 3e-5
    warnings: list[str] = []
    split = group_runs(runs, by="trust_region", warn=warnings.append)
    assert [(s.label, len(s.runs)) for s in split] == [
        ("dppo_binary_tv [learning_rate=1e-05]", 2),
        ("dppo_binary_tv [learning_rate=3e-05]", 1),
        ("ppo_clip", 3),
    ]
    assert len(warnings) == 1 and "learning_rate" in warnings[0]
    assert [len(s.runs) for s in group_runs(runs, ignore={"*"}, warn=pytest.fail)] == [3, 3]
    name_runs = group_runs(runs[:2], by="run_name", warn=pytest.fail)  # no run_name: the directory name
    assert [s.label for s in name_runs] == [r.name for r in runs[:2]]


def test_find_run_dirs(runs_root: Path, tmp_path: Path):
    assert len(find_run_dirs(runs_root)) == 6
    one = runs_root / "sudoku-ppo_clip-s0"
    (one / "checkpoints" / "it5").mkdir(parents=True)
    (one / "checkpoints" / "it5" / "metrics.jsonl").write_text("")  # inside a run: not a run
    assert find_run_dirs(one) == [one]
    assert find_run_dirs(one / "metrics.jsonl") == [one]
    assert len(find_run_dirs(runs_root)) == 6
    assert find_run_dirs(tmp_path / "nope") == []


def test_resolve_panels_names_keys_suffixes_and_missing():
    avail = ["rollout/reward_mean", "eval/reward_mean", "train/grad_norm", "train/kept_frac"]
    warnings: list[str] = []
    panels = resolve_panels(["reward", "grad_norm", "reward_mean", "train/kept_frac", "entropy", "nope"],
                            avail, warn=warnings.append)
    assert [(p.name, p.key, p.dashed) for p in panels] == [
        ("reward", "rollout/reward_mean", "eval/reward_mean"),
        ("train_grad_norm", "train/grad_norm", None),
        ("rollout_reward_mean", "rollout/reward_mean", "eval/reward_mean"),
        ("train_kept_frac", "train/kept_frac", None),
    ]
    assert len(warnings) == 2 and "'entropy'" in warnings[0] and "'nope'" in warnings[1]


# ---- the command --------------------------------------------------------------------------------


def test_main_writes_overview_and_one_png_per_metric(runs_root: Path, tmp_path: Path, capsys):
    out = tmp_path / "plots"
    assert main([str(runs_root), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    names = ["reward", "kept_frac", "mismatch", "prob_diff", "entropy", "overview"]
    for name in names:
        assert_png(out / f"{name}.png")
        assert f"wrote {out / name}.png" in captured.out
    assert_png(out / "overview.png", min_bytes=60_000)
    assert "killed" in captured.err  # the truncated line of the seed-2 runs


def test_mismatch_and_drift_are_separate_panels():
    """The mismatch panel draws the engine's mismatch (train/mismatch_mean, before the update moves
    pi); prob_diff (mismatch + the policy's drift over the update) is titled as such."""
    from oat_dppo.plot import DEFAULT_PANELS, NAMED_PANELS

    assert NAMED_PANELS["mismatch"].key == "train/mismatch_mean"
    assert "mismatch" in NAMED_PANELS["mismatch"].title.lower()
    assert NAMED_PANELS["prob_diff"].key == "train/prob_diff_mean"
    assert "drift" in NAMED_PANELS["prob_diff"].title and "mismatch)" not in NAMED_PANELS["prob_diff"].title
    assert DEFAULT_PANELS.index("mismatch") < DEFAULT_PANELS.index("prob_diff")


def test_default_panels_skip_quietly_what_older_runs_did_not_log(runs_root: Path, tmp_path: Path, capsys):
    old = tmp_path / "old"
    old.mkdir()
    src = runs_root / "sudoku-dppo_binary_tv-s0"
    (old / "config.json").write_text((src / "config.json").read_text())
    lines = [json.loads(x) for x in (src / "metrics.jsonl").read_text().splitlines() if x.strip().endswith("}")]
    (old / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "train/mismatch_mean"})
                                               + "\n" for r in lines))
    assert main([str(old), "--out", str(tmp_path / "p")]) == 0
    assert "mismatch" not in capsys.readouterr().err
    assert not (tmp_path / "p" / "mismatch.png").exists() and (tmp_path / "p" / "prob_diff.png").exists()


def test_main_flags_metrics_wall_time_minmax_smooth_and_missing_metric(runs_root: Path, tmp_path: Path, capsys):
    out = tmp_path / "custom"
    rc = main([str(runs_root / "sudoku-dppo_binary_tv-s0"), str(runs_root / "sudoku-ppo_clip-s0"),
               "--out", str(out), "--metrics", "success,train/grad_norm,not/a_metric", "--x", "wall_time",
               "--band", "minmax", "--smooth", "3", "--group-by", "run_name"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "'not/a_metric'" in err and "skipped" in err
    assert sorted(p.name for p in out.iterdir()) == ["overview.png", "success.png", "train_grad_norm.png"]
    for p in out.iterdir():
        assert_png(p)


def test_identical_curves_are_drawn_dotted_and_named_in_the_panel(tmp_path: Path):
    """Trust regions that never mask give the same runs: the later curve must not just hide the first."""
    from matplotlib.figure import Figure

    from oat_dppo.plot.figures import draw_panel
    from oat_dppo.plot.panels import panel_for_key

    def run(tr: str, seed: int, rows_of: str) -> object:
        cfg = {"trust_region": tr, "seed": seed}
        return load_run(write_run(tmp_path / f"{tr}-{seed}", cfg, fake_rows(rows_of, seed)))

    series = [Series(tr, [run(tr, s, rows_of) for s in (0, 1)]) for tr, rows_of in
              [("ppo_clip", "ppo_clip"), ("dppo_binary_tv", "ppo_clip"), ("dppo_binary_kl", "ppo_clip"),
               ("pg_is", "dppo_binary_tv")]]
    ax = Figure().subplots()
    drawn, _ = draw_panel(ax, panel_for_key("rollout/reward_mean"), series, ["C0", "C1", "C2", "C3"],
                          "iteration", "std", 1, 1.0)
    assert drawn == [0, 1, 2, 3]
    curves = [line for line in ax.get_lines() if line.get_marker() in (None, "None")]  # not the eval lines
    assert [line.get_linestyle() for line in curves] == ["-", "--", "--", "-"]  # the twins: dashes
    assert len(ax.get_lines()) == 8  # each series also has its dashed eval line
    notes = [t.get_text() for t in ax.texts]
    assert notes == ["identical curves: ppo_clip = dppo_binary_tv = dppo_binary_kl"]
    ax = Figure().subplots()  # no twins: no note, all solid
    draw_panel(ax, panel_for_key("rollout/reward_mean"), [series[0], series[3]], ["C0", "C1"], "iteration", "std", 1, 1.0)
    assert not ax.texts and {line.get_linestyle() for line in ax.get_lines()} == {"-", "--"}


def test_main_single_run_writes_into_the_run_dir(runs_root: Path, capsys):
    one = runs_root / "sudoku-ppo_clip-s1"
    assert main([str(one), "--metrics", "reward"]) == 0
    assert_png(one / "reward.png")
    assert_png(one / "overview.png")


def test_main_empty_metrics(tmp_path: Path, runs_root: Path, capsys):
    empty = write_run(tmp_path / "fresh", {"trust_region": "pg_is", "seed": 0}, [])
    assert main([str(empty), "--out", str(tmp_path / "o")]) == 2
    assert "empty" in capsys.readouterr().err
    # next to runs with data: skipped with a warning
    assert main([str(empty), str(runs_root / "sudoku-ppo_clip-s0"), "--out", str(tmp_path / "o"),
                 "--metrics", "entropy"]) == 0
    assert "empty" in capsys.readouterr().err and (tmp_path / "o" / "entropy.png").is_file()


def test_main_no_requested_metric_anywhere_is_exit_2(runs_root: Path, tmp_path: Path, capsys):
    assert main([str(runs_root), "--metrics", "foo,bar", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "none of --metrics" in err and "rollout/reward_mean" in err
    assert not (tmp_path / "o").exists()


def test_main_bad_path_among_good_ones_lists_both(runs_root: Path, tmp_path: Path, capsys):
    (tmp_path / "emptydir").mkdir()
    rc = main([str(runs_root), str(tmp_path / "emptydir"), str(tmp_path / "missing")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "emptydir: has no metrics.jsonl" in err and "missing: does not exist" in err
    assert f"{runs_root}: 6 run directories" in err


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oat_dppo.plot", *args], capture_output=True, text=True,
                          cwd=ROOT, env=child_env(), timeout=60)


def test_cli_nonexistent_path_exit_2():
    p = run_cli("/nonexistent")
    assert p.returncode == 2, p
    assert "error: not a run directory" in p.stderr and "/nonexistent: does not exist" in p.stderr
    assert p.stdout == ""


def test_cli_help_and_import_is_light():
    p = run_cli("--help")
    assert p.returncode == 0
    for flag in ("--out", "--x", "--metrics", "--group-by", "--band", "--smooth", "--ignore-keys", "--title"):
        assert flag in p.stdout
    code = "import sys, oat_dppo.plot; print('torch' in sys.modules, 'matplotlib' in sys.modules)"
    q = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env=child_env())
    assert q.stdout.split() == ["False", "False"], q


def test_success_panel_draws_the_feedback_blind_bound_where_runs_recorded_it(tmp_path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from oat_dppo.plot.figures import draw_panel
    from oat_dppo.plot.panels import NAMED_PANELS

    rows = [{"iteration": i, "rollout/success_rate": 0.1 * i} for i in range(5)]
    with_bound = load_run(write_run(tmp_path / "a", {"trust_region": "ipo", "_feedback_blind_success": 0.4}, rows))
    without = load_run(write_run(tmp_path / "b", {"trust_region": "ipo"}, rows))
    for runs, expected in (([with_bound], [0.4]), ([without], [])):
        fig, ax = plt.subplots()
        draw_panel(ax, NAMED_PANELS["success"], [Series("ipo", runs)], ["C0"], "iteration", "std", 1, 1.0)
        flat = [line.get_ydata()[0] for line in ax.lines if len(set(line.get_ydata())) == 1 and line.get_linestyle() == ":"]
        assert flat == expected
        plt.close(fig)


def test_labels_drop_the_run_name_fields_every_curve_shares():
    """A study's run names share model, env and seed fields; the legend keeps what tells them apart."""
    from oat_dppo.plot.data import _without_shared_fields

    names = ["smollm2__game_X__dppo_binary_tv__lr-1e-4__s0", "smollm2__game_X__trm__lr-1e-4__s0",
             "smollm2__game_X__dppo_binary_tv__group-4__s0"]
    labels = [s.label for s in _without_shared_fields([Series(n, []) for n in names])]
    assert labels == ["dppo_binary_tv__lr-1e-4", "trm__lr-1e-4", "dppo_binary_tv__group-4"]
    assert [s.label for s in _without_shared_fields([Series("a__b", [])])] == ["a__b"]  # one curve: as is
    same_but_last = [Series("x__y__1", []), Series("x__y__2", [])]
    assert [s.label for s in _without_shared_fields(same_but_last)] == ["1", "2"]
