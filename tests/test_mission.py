"""The mission table's study end to end with a tiny model (oat_dppo.study.mission), the evaluation CLI
(oat_dppo.evaluate) and the table's intervals (oat_dppo.study.mission_table)."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import re
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.child import child_env

from oat_dppo.main import main
from oat_dppo.study.mission import ARMS, COLUMNS, MissionError, Runner, load, same_recorded_mean, table_row
from oat_dppo.study.mission_table import (MARK_BEGIN, MARK_END, comparisons, difference, learned, replace_block,
                                         separated, summarize)

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model", "tiny-qwen3", "--engine", "hf", "--threads", "1", "--no-progress", "--log", "none"]
GTN = ["--env", "game:GuessTheNumber-v0-easy", "--response-prefix", "\\boxed{", "--max-new-tokens", "4"]


def evaluate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oat_dppo.evaluate", *args], capture_output=True, text=True,
                          cwd=REPO, env=child_env(), timeout=300)


def test_a_run_ends_with_one_test_evaluation_that_evaluate_repeats(tmp_path):
    run_dir = tmp_path / "run"
    assert main([*TINY, *GTN, "--run-dir", str(run_dir), "--iterations", "1", "--episodes-per-iteration", "4",
                 "--eval-every", "1", "--eval-episodes", "4", "--test-episodes", "6"]) == 0
    (row,) = [json.loads(line) for line in (run_dir / "evaluations.jsonl").read_text().splitlines()]
    assert (row["split"], row["iteration"], row["policy"], row["episodes"]) == ("test", 0, "last", 6)
    # the validation evaluations stay in metrics.jsonl as eval/*; the test one is not there
    assert not any(k.startswith("test/") for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                   for k in json.loads(line))
    proc = evaluate(str(run_dir), "--split", "test", "--episodes", "6")
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = json.loads((run_dir / "evaluations.jsonl").read_text().splitlines()[-1])
    # the same policy, test episodes and generation seed: the same episodes
    assert again["reward_mean"] == row["reward_mean"] and again["turns_mean"] == row["turns_mean"]
    assert "test: reward" in proc.stderr


def test_evaluate_refuses_what_it_cannot_do(tmp_path):
    proc = evaluate()
    assert proc.returncode == 2 and "RUN_DIR" in proc.stderr
    proc = evaluate("--policy", "demo:nope", "--out", str(tmp_path / "x"), "--", *GTN)
    assert proc.returncode == 2 and "demo:blind_sweep" in proc.stderr
    proc = evaluate("--policy", "demo:blind_sweep", "--", *GTN)
    assert proc.returncode == 2 and "--out" in proc.stderr
    proc = evaluate(str(tmp_path / "missing"))
    assert proc.returncode == 2 and "does not exist" in proc.stderr


MISSION = """
[table]
out = "{out}"
csv = "{csv}"
records = "{records}"
test_episodes = 6
jobs = 2

[[cell]]
name = "tiny_gtn"
env = "game:GuessTheNumber-v0-easy"
model = "tiny-qwen3"
seeds = [0]
blind = "demo:blind_sweep"
demonstrator = "demo:bisect"
common = {{ response_prefix = "\\\\boxed{{", max_new_tokens = 4, engine = "hf", log = "none", env_option = ["partial_credit=false"] }}
warm_start = [{{ warm_start = "demo:bisect", warm_start_episodes = 4, warm_start_steps = 2, warm_start_batch = 4, eval_every = 1, eval_episodes = 2 }}]
rl = {{ iterations = 1, episodes_per_iteration = 4, group_size = 2, eval_every = 1, eval_episodes = 2, keep_best = true }}
"""


@pytest.mark.slow
def test_the_mission_study_fills_its_table_and_goes_on_where_it_stopped(tmp_path):
    path = tmp_path / "mission.toml"
    path.write_text(MISSION.format(out=tmp_path / "runs", csv=tmp_path / "table.csv", records=tmp_path / "records"))
    mission = load(path)
    assert Runner(mission, out=open("/dev/null", "w")).run() == 0
    with open(tmp_path / "table.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS
    assert sorted(r["arm"] for r in rows) == sorted(ARMS)
    assert {(r["split"], r["episodes"], r["seed"]) for r in rows} == {("test", "6", "0")}
    assert float(next(r["mean"] for r in rows if r["arm"] == "demonstrator")) == 1.0  # bisecting wins 1..10 in 4
    # RL and its control start from the warm start's export; the control's advantages are shuffled
    configs = {arm: json.loads((tmp_path / "records/tiny_gtn/s0" / arm / "config.json").read_text())
               for arm in ("rl", "control")}
    assert configs["rl"]["model"] == configs["control"]["model"] == str(tmp_path / "runs/tiny_gtn/s0/warm1/model")
    assert (configs["rl"]["shuffle_advantages"], configs["control"]["shuffle_advantages"]) == (False, True)
    # --keep-best: the row is the best validation policy's test evaluation
    evaluations = [json.loads(x) for x in (tmp_path / "records/tiny_gtn/s0/rl/evaluations.jsonl").read_text().splitlines()]
    assert [e["policy"] for e in evaluations] == ["last", "best"]
    # a second call has nothing left to do, and runs nothing
    again = Runner(load(path), out=open("/dev/null", "w"))
    assert again.plan() == [] and again.run() == 0
    assert len((tmp_path / "table.csv").read_text().splitlines()) == len(ARMS) + 1


def test_seeds_chooses_whose_work_is_planned_and_a_seed_no_cell_has_is_refused(tmp_path):
    path = tmp_path / "mission.toml"
    path.write_text(MISSION.replace("seeds = [0]", "seeds = [0, 1]", 1).format(
        out=tmp_path / "runs", csv=tmp_path / "table.csv", records=tmp_path / "records"))
    everything = Runner(load(path), out=open("/dev/null", "w")).plan()
    assert {w.seed for w in everything} == {0, 1}
    only_1 = Runner(load(path), out=open("/dev/null", "w"), seeds=(1,)).plan()
    assert only_1 and [w.key for w in only_1] == [w.key for w in everything if w.seed == 1]
    with pytest.raises(MissionError, match="no chosen cell has seed 2"):
        Runner(load(path), seeds=(1, 2))

def test_a_bad_mission_file_names_every_problem(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[table]\nwhat = 1\n[[cell]]\nname = "c"\nenv = "e"\nmodel = "m"\nseeds = [0]\n'
                    'blind = "bisect"\nwarm_start = [{ warm_startt = "demo:bisect" }]\nrl = { learning_rate = 1e-4 }\n')
    with pytest.raises(MissionError) as e:
        load(path)
    text = str(e.value)
    assert "'what'" in text and "demo:NAME" in text and "warm_startt" in text


def test_two_cells_of_one_env_id_need_an_env_label_to_keep_their_rows_apart(tmp_path):
    cell = ('[[cell]]\nname = "{name}"\nenv = "math:procedural"\n{label}model = "m"\nseeds = [0]\n'
            'warm_start = [{{ warm_start = "demo:equation_worked" }}]\nrl = {{ learning_rate = 1e-4 }}\n')
    path = tmp_path / "two.toml"
    path.write_text(cell.format(name="a", label="") + cell.format(name="b", label=""))
    with pytest.raises(MissionError, match="cells a and b would write the same rows"):
        load(path)
    path.write_text(cell.format(name="a", label="") + cell.format(name="b", label='env_label = "math:small"\n'))
    a, b = load(path).cells
    assert (a.env_label, b.env_label) == ("math:procedural", "math:small")
    assert table_row(b, "rl", 0, {"split": "test", "episodes": 4, "reward_mean": 0.5, "success_rate": 0.5})["env"] \
        == "math:small"



def test_a_warm_start_made_again_is_its_row_when_the_csv_would_write_the_same_mean(tmp_path):
    """The study made seed 1's lost warm start again, scored 29/256 = 0.11328125 as before, and warned that RL would
    start from another policy: it had compared the score with the CSV's 6-decimal 0.113281 to 1e-9."""
    path = tmp_path / "one.toml"
    path.write_text('[[cell]]\nname = "a"\nenv = "math:procedural"\nmodel = "m"\nseeds = [0]\n'
                    'warm_start = [{ warm_start = "demo:equation_worked" }]\nrl = { learning_rate = 1e-4 }\n')
    (cell,) = load(path).cells
    evaluation = {"split": "test", "episodes": 256, "reward_mean": 29 / 256, "success_rate": 0.0}
    row = table_row(cell, "warm_start", 1, evaluation)
    assert row["mean"] == "0.113281" and same_recorded_mean(row, evaluation)
    assert not same_recorded_mean(row, {**evaluation, "reward_mean": 30 / 256})
    assert not same_recorded_mean(row, {**evaluation, "reward_mean": 29 / 256 + 1e-6})

OAT_CELL = """
[[cell]]
name = "tiny_gtn_oat"
env = "game:GuessTheNumber-v0-easy"
model = "tiny-qwen3"
backend = "oat"
seeds = [0]
warm_from = "tiny_gtn"
common = {{ response_prefix = "\\\\boxed{{", max_new_tokens = 4, log = "none", env_option = ["partial_credit=false"] }}
rl = {{ iterations = 1, episodes_per_iteration = 8, group_size = 4, mini_batch_size = 8, eval_every = 1, eval_episodes = 2, dtype = "float32" }}
oat_args = ["--gpus", "2", "--zero-stage", "2", "--no-flash-attn", "--shm-size-mb", "200", "--check-sync", "off", "--train-batch-size-per-device", "4"]
"""


def oat_mission(tmp_path, extra: str = "") -> Path:
    path = tmp_path / "mission.toml"
    text = MISSION.replace("jobs = 2", "jobs = 1") + OAT_CELL + extra
    path.write_text(text.format(out=tmp_path / "runs", csv=tmp_path / "table.csv", records=tmp_path / "records"))
    return path


def test_an_oat_cell_starts_from_its_local_cells_warm_start_and_says_what_it_cannot_do(tmp_path):
    runner = Runner(load(oat_mission(tmp_path)), out=open("/dev/null", "w"), cells=("tiny_gtn_oat",))
    # chosen alone, it brings the local cell's warm start along (its export is missing), and nothing else of it
    assert [(w.key, w.after) for w in runner.plan()] == [
        ("tiny_gtn/warm_start/s0", ()), ("tiny_gtn_oat/rl/s0", ("tiny_gtn/warm_start/s0",)),
        ("tiny_gtn_oat/control/s0", ("tiny_gtn/warm_start/s0",))]
    export = tmp_path / "runs/tiny_gtn/s0/warm1/model"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    assert [w.key for w in Runner(load(oat_mission(tmp_path)), cells=("tiny_gtn_oat",)).plan()] == [
        "tiny_gtn_oat/rl/s0", "tiny_gtn_oat/control/s0"]  # an export made: RL alone
    bad = oat_mission(tmp_path, OAT_CELL.replace("tiny_gtn_oat", "bad").replace('"tiny_gtn"', '"nope"')
                      .replace("iterations = 1", "keep_best = true, iterations = 1")
                      .replace("seeds = [0]", 'seeds = [0]\nblind = "demo:blind_sweep"'))
    with pytest.raises(MissionError) as e:
        load(bad)
    text = str(e.value)
    assert "warm_from 'nope' names no local cell" in text and "keep_best is local-backend only" in text
    assert "no blind of its own" in text


@pytest.mark.slow
def test_an_oat_cell_runs_oats_program_and_reports_beside_the_local_warm_start(tmp_path):
    pytest.importorskip("launchpad", reason="Oat's stack is .venv-oat (`make setup-oat`)")
    path = oat_mission(tmp_path)
    path.write_text(path.read_text().replace("[table]", f'[table]\noat_python = "{sys.executable}"'))
    # the Oat cell's RL alone (one Oat program; its control is the same command with --shuffle-advantages): the
    # local cell's warm start comes along (its row too), nothing else of it
    runner = lambda: Runner(load(path), out=open("/dev/null", "w"), cells=("tiny_gtn_oat",), arms=("rl",))  # noqa: E731
    assert runner().run() == 0
    rows = list(csv.DictReader(open(tmp_path / "table.csv", newline="")))
    assert sorted((r["backend"], r["arm"]) for r in rows) == [("local", "warm_start"), ("oat", "rl")]
    (oat,) = [r for r in rows if r["backend"] == "oat"]
    assert oat["episodes"] == "6"
    config = json.loads((tmp_path / "records/tiny_gtn_oat/s0/rl/config.json").read_text())
    # Oat's run, recorded as a local one is: what ran, from which export
    assert config["backend"] == "oat" and config["model"] == str(tmp_path / "runs/tiny_gtn/s0/warm1/model")
    assert config["shuffle_advantages"] is False
    (said,) = [line for line in comparisons(summarize(rows)) if "(oat)" in line]
    assert "its warm start (local)" in said and "no row yet for its shuffled-advantage control" in said
    assert runner().plan() == []


def row(arm, seed, mean, std, episodes=100, solved=""):
    return {"env": "e", "model": "m", "backend": "local", "arm": arm, "seed": str(seed), "split": "test",
            "episodes": str(episodes), "mean": str(mean), "solved": solved, "std": str(std)}


def test_intervals_by_hand():
    (one,) = summarize([row("rl", 0, 0.5, 0.5)])
    assert one.mean == 0.5 and math.isclose(one.half_width, 1.96 * 0.05)  # one seed: the tasks' error alone
    (two,) = summarize([row("rl", 0, 0.5, 0.5), row("rl", 1, 0.7, 0.5)])
    # seeds: sd 0.1414 / sqrt 2 = 0.1, t(1) = 12.706; tasks: sqrt(0.25 / 100) = 0.05
    assert math.isclose(two.mean, 0.6) and math.isclose(two.half_width, math.hypot(12.706 * 0.1, 1.96 * 0.05))
    assert two.solved is None
    rl, control = summarize([row("rl", s, 0.9, 0.3, 256) for s in range(3)]
                            + [row("control", s, m, 0.45, 256) for s, m in enumerate((0.6, 0.65, 0.62))])
    assert [rl.arm, control.arm] == ["rl", "control"] and separated(rl, control) and not separated(control, rl)


def test_differences_are_paired_by_seed_and_learned_needs_every_margin():
    rows = ([row("blind", s, 0.1, 0.3, 256) for s in (0, 1)]
            + [row("warm_start", s, m, 0.4, 256) for s, m in ((0, 0.30), (1, 0.20))]
            + [row("control", s, m, 0.4, 256) for s, m in ((0, 0.32), (1, 0.18))]
            + [row("rl", s, m, 0.45, 256) for s, m in ((0, 0.50), (1, 0.40))])
    arms = {a.arm: a for a in summarize(rows)}
    gap, se = difference(arms["rl"], arms["warm_start"])
    # the seeds' pairs differ by 0.20 both: no seed spread; the tasks' errors 0.45/16 and 0.4/16 in quadrature
    assert math.isclose(gap, 0.2) and math.isclose(se, math.hypot(0.45, 0.4) / 16)
    gap, se = difference(arms["rl"], arms["control"])  # pairs 0.18 and 0.22: sd 0.0283 / sqrt 2 = 0.02
    assert math.isclose(gap, 0.2) and math.isclose(se, math.sqrt(0.02 ** 2 + (0.45 ** 2 + 0.4 ** 2) / 256))
    assert learned(arms) is True
    (line,) = comparisons(summarize(rows))  # two seeds: the per-arm intervals (t with 1 df) overlap, and it says so
    assert "control 0.250: RL +0.200, +" in line and "learned: yes" in line and "stricter test, overlap" in line
    assert learned({k: v for k, v in arms.items() if k != "control"}) is None
    near_blind = {**arms, "blind": summarize([row("blind", s, 0.36, 0.3, 256) for s in (0, 1)])[0]}
    assert learned(near_blind) is False  # 0.45 is not 0.15 over 0.36
    # seeds that disagree: RL over control by 0.3 on one seed and -0.1 on the other is no lift
    split = summarize([row("rl", 0, 0.6, 0.45, 256), row("rl", 1, 0.2, 0.45, 256)])[0]
    assert learned({**arms, "rl": split}) is False
    # one seed of RL: a gap of 0.2 at ~6 SE, and still not judged (no seed spread to weigh it against)
    one_seed = [r for r in rows if not (r["arm"] == "rl" and r["seed"] == "1")]
    assert learned({a.arm: a for a in summarize(one_seed)}) is None
    (line,) = comparisons(summarize(one_seed))
    assert "learned: not judged yet" in line and "learned: yes" not in line


def test_the_table_replaces_only_its_block():
    page = f"# Results\n{MARK_BEGIN}\nold\n{MARK_END}\nbelow\n"
    assert replace_block(page, "| new |\n") == f"# Results\n{MARK_BEGIN}\n| new |\n{MARK_END}\nbelow\n"
    with pytest.raises(ValueError):
        replace_block("# no block\n", "x")


def test_the_figure_wraps_its_cells_into_rows_of_four(tmp_path):
    """Eleven cells in one row were 5,000 pixels wide and unreadable: the panels wrap, four to a row."""
    from PIL import Image

    from oat_dppo.study.mission_table import FIGURE_COLUMNS, ArmSummary, figure

    arms = [ArmSummary(env=f"rg:env{c}[demo:x]", model="smollm2", backend="local", arm=arm, seeds=(0, 1),
                       seed_means=(0.4, 0.5), episodes=256, mean=0.45, half_width=0.1, solved=None)
            for c in range(FIGURE_COLUMNS + 1) for arm in ("blind", "rl")]
    with Image.open(figure(arms, tmp_path / "fig.png")) as image:
        width, height = image.size
    assert FIGURE_COLUMNS == 4 and width < 2000 and height > width / 3  # 2 rows of 4, not 1 row of 5



def test_progress_lines_from_runs_finishing_at_once_stay_whole(tmp_path):
    """Two runs finish on two threads; `print` writes a line's text and its newline apart, so without the
    runner's lock two lines could share one ("start a/rl/s0[00:45:11] start a/control/s0")."""
    path = tmp_path / "mission.toml"
    path.write_text(MISSION.format(out=tmp_path / "runs", csv=tmp_path / "table.csv", records=tmp_path / "records"))

    class Slow(io.StringIO):  # each write lets the other thread in
        def write(self, s):
            time.sleep(0.001)
            return super().write(s)

    out = Slow()
    runner = Runner(load(path), out=out)
    threads = [threading.Thread(target=lambda n=n: [runner.say(f"run {n} line {i}") for i in range(40)])
               for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = out.getvalue().splitlines()
    assert len(lines) == 80 and all(re.fullmatch(r"\[\d\d:\d\d:\d\d\] run \d line \d+", x) for x in lines)
