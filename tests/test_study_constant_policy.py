"""What saying one response in every turn earns (oat_dppo.study.constant_policy), on real GEM envs:
GuessTheNumber's closed form, the format-failure reward, an env this clone cannot build, and the
report's per-run table that reads a run's final reward against it."""

from __future__ import annotations

import csv
import json
import math
import statistics

import pytest

from oat_dppo.config import TrainConfig
from oat_dppo.envs import get_preset
from oat_dppo.study import load_study
from oat_dppo.study.constant_policy import constant_response_reward
from oat_dppo.study.run_results import Group, RunResult
from oat_dppo.study.tables import settled_runs, settled_text

GTN = "game:GuessTheNumber-v0-easy"


def repeat_worth(guess: int, high: int = 10, turns: int = 4) -> float:
    """GuessTheNumber-easy (target uniform in 1..high, `turns` turns, a repeated guess neither ends the
    game nor costs anything, the last turn pays 1 - |guess - target| / (high - 1), a hit pays 1 and ends
    it): the expected episode reward of guessing `guess` every turn."""
    assert turns > 1
    miss = sum(1 - abs(guess - t) / (high - 1) for t in range(1, high + 1) if t != guess)
    return (1.0 + miss) / high


@pytest.mark.parametrize("guess", [1, 5, 8])
def test_repeating_a_guess_earns_the_closed_form(guess):
    # 1000 episodes: the estimate's standard error is ~0.008; the seeds are fixed, so is the value.
    got = constant_response_reward(TrainConfig(env=GTN), f"\\boxed{{{guess}}}")
    assert got == pytest.approx(repeat_worth(guess), abs=0.015)


def test_the_same_episodes_for_every_response():
    """Seeds 0..n-1 for every response: the middle beats the edge on the same targets, whatever n."""
    cfg = TrainConfig(env=GTN)
    for n in (20, 50):
        middle, edge = (constant_response_reward(cfg, f"\\boxed{{{g}}}", episodes=n) for g in (5, 1))
        assert middle > edge


def test_an_answer_in_no_format_earns_the_format_failure_reward():
    cfg = TrainConfig(env=GTN, format_penalty=-0.5)
    expected = get_preset(GTN).format_failure_reward - 0.5  # GEM ends the episode at the first turn
    assert constant_response_reward(cfg, "I think it is five", episodes=7) == pytest.approx(expected)


def test_an_env_this_clone_cannot_build_is_nan():
    assert math.isnan(constant_response_reward(TrainConfig(env="math", math_data="/nonexistent/problems.jsonl"),
                                               "\\boxed{1}", episodes=3))
    with pytest.raises(ValueError, match="episodes"):
        constant_response_reward(TrainConfig(env=GTN), "\\boxed{1}", episodes=0)


def test_the_report_reads_each_run_against_its_constant_answer(tmp_path):
    """runs.csv and summary.md: the reward for repeating the run's most common final response in its
    env, beside its final reward, and the success rate over the first and the final window."""
    from oat_dppo.study.cli import main

    study_file = tmp_path / "study.toml"
    study_file.write_text(f"""
[study]
out = "{tmp_path / 'out'}"
final_window = 2
[base]
model = "tiny-qwen3"
env = "{GTN}"
iterations = 4
""")
    (run,) = load_study(study_file).runs
    run.run_dir.mkdir(parents=True)
    rows = [{"iteration": i, "rollout/reward_mean": r, "rollout/success_rate": s, "wall_time": float(i)}
            for i, (r, s) in enumerate([(0.2, 0.25), (0.5, 0.15), (0.7, 0.1), (0.72, 0.05)])]
    (run.run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    said = {"turns": [{"prompt": "p", "response": "\\boxed{5}!"}] * 4}
    (run.run_dir / "episodes.jsonl").write_text("".join(json.dumps({"iteration": i, **said}) + "\n" for i in range(4)))
    assert main([str(study_file), "--report"]) == 0
    (row,) = csv.DictReader(open(tmp_path / "out" / "runs.csv"))
    assert row["final_response"] == "\\boxed{5}!"
    assert float(row["final_response_reward"]) == pytest.approx(repeat_worth(5), abs=0.015)
    assert float(row["success_first"]) == pytest.approx(0.2) and float(row["success_final"]) == pytest.approx(0.075)
    worth = f"{float(row['final_response_reward']):.3f}"
    md = (tmp_path / "out" / "summary.md").read_text()
    assert f"| `\\boxed{{5}}!` | 1.00 | 1.000 | {worth} | 0.710 | 0.200 → 0.075 |" in md
    gap = 0.71 - float(row["final_response_reward"])
    # one settled run: its gap, no spread, no correlation
    assert f"final turns): 1 run. Final reward minus what saying that response every turn earns: {gap:+.3f} ± 0.000" in md
    assert "Pearson" not in md


def _result(final: float, share: float, worth: float) -> RunResult:
    return RunResult(run=None, iterations=30, final=final, best=final, reach=math.nan, auc=final, kept=1.0,
                     mismatch=math.nan, eval=math.nan, lowest=0.1, collapsed=0, entropy_min=0.0,
                     engine_mismatch=math.nan, final_response="\\boxed{5}", final_response_share=share,
                     final_response_reward=worth)


def test_settled_runs_compare_final_reward_with_what_their_answer_earns():
    """Only runs whose most common response holds >= 95% of the final turns count; gap = final - worth;
    r: Pearson's over those runs."""
    a = Group("chatml", "m", GTN, "pg_is", {}, results=[_result(0.60, 1.0, 0.65), _result(0.73, 0.95, 0.72)])
    b = Group("chatml", "m", GTN, "ppo_clip", {}, results=[_result(0.66, 1.0, 0.70), _result(0.9, 0.3, 0.70),
                                                          _result(0.5, 1.0, math.nan)])
    settled = settled_runs([a, b])
    gaps = [0.60 - 0.65, 0.73 - 0.72, 0.66 - 0.70]  # the 0.3-share run and the one with no worth are left out
    assert settled.runs == 3
    assert settled.gap.mean == pytest.approx(sum(gaps) / 3) and settled.gap.std == pytest.approx(statistics.pstdev(gaps))
    assert (settled.gap_min, settled.gap_max) == (pytest.approx(-0.05), pytest.approx(0.01))
    assert settled.r == pytest.approx(statistics.correlation([0.60, 0.73, 0.66], [0.65, 0.72, 0.70]))
    assert "Pearson r of the two over the runs: 0.9" in settled_text(settled)
    assert settled_runs([b], share=1.01) is None and settled_text(None) == ""
    # two runs: no correlation to speak of
    assert math.isnan(settled_runs([a]).r)
