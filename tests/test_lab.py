"""The trust-region lab (benchmarks.lab): the simulator runs with every strategy, really injects the
training-inference mismatch, learns, and its CLI writes plots. Seconds, CPU."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from benchmarks.lab.__main__ import main
from benchmarks.lab.config import SimConfig
from benchmarks.lab.experiments import EXPERIMENTS
from benchmarks.lab.mismatch import InferenceEngine, round_mantissa
from benchmarks.lab.policy import TinyLM
from benchmarks.lab.task import HiddenAnswerTask
from benchmarks.lab.trainer import run_simulation

TINY = SimConfig(vocab=256, seq_len=4, n_problems=4, prompts_per_batch=2, group_size=4, iterations=3, minibatch=False)

ALL_SPECS = {(s.name, tuple(sorted(s.params.items()))): s for e in EXPERIMENTS.values() for s in e.strategies}


@pytest.mark.parametrize("spec", list(ALL_SPECS.values()), ids=lambda s: s.label)
def test_every_strategy_runs_a_few_iterations(spec):
    rows = run_simulation(TINY, spec.name, spec.params, seed=0)
    assert len(rows) == TINY.iterations
    for r in rows:
        assert 0.0 <= r["reward"] <= 1.0
        assert math.isfinite(r["mismatch"]) and math.isfinite(r["prob_diff_mean"]) and math.isfinite(r["entropy"])
        assert 0.0 <= r["kept_frac"] <= 1.0
        assert r["diverged"] == 0.0
    # pg_is never masks; every other strategy's mask is at least defined
    if spec.name == "pg_is":
        assert all(r["kept_frac"] == 1.0 for r in rows)


def _pi_and_mu(cfg: SimConfig, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    policy = TinyLM(cfg, g)
    engine = InferenceEngine(cfg, g)
    engine.sync(policy)
    prompts = torch.arange(cfg.n_problems).repeat_interleave(cfg.group_size)
    tokens, mu_logp = engine.rollout(prompts, policy.bos)
    with torch.no_grad():
        pi_logp, _ = policy.logprobs(prompts, tokens)
    return pi_logp, mu_logp


def test_mismatch_is_injected_when_on_and_absent_when_off():
    pi, mu = _pi_and_mu(TINY.replace(mismatch="round", mantissa_bits=8))
    diff = (pi.exp() - mu.exp()).abs()
    assert diff.mean() > 1e-5  # bf16-like rounding really changes mu
    assert diff.mean() < 5e-2  # ... by a mismatch-sized amount, not a different policy
    pi, mu = _pi_and_mu(TINY.replace(mismatch="noise", noise_std=0.05))
    assert (pi.exp() - mu.exp()).abs().mean() > 1e-5
    pi, mu = _pi_and_mu(TINY.replace(mismatch="none"))
    torch.testing.assert_close(mu, pi, atol=2e-5, rtol=0)


def test_mismatch_grows_with_fewer_mantissa_bits():
    d8 = [(lambda p, m: (p.exp() - m.exp()).abs().mean().item())(*_pi_and_mu(TINY.replace(mantissa_bits=8), s)) for s in range(3)]
    d4 = [(lambda p, m: (p.exp() - m.exp()).abs().mean().item())(*_pi_and_mu(TINY.replace(mantissa_bits=4), s)) for s in range(3)]
    assert sum(d4) > 4 * sum(d8)


def test_trainer_reports_the_pre_update_mismatch():
    on = run_simulation(TINY.replace(iterations=1), "pg_is", seed=1)[0]
    off = run_simulation(TINY.replace(iterations=1, mismatch="none"), "pg_is", seed=1)[0]
    assert on["mismatch"] > 1e-5
    assert off["mismatch"] < 1e-5


def test_round_mantissa_matches_bfloat16_precision():
    x = torch.randn(10_000) * 10
    r = round_mantissa(x, 8)
    rel = ((r - x) / x).abs()
    assert rel.max() <= 2.0**-8 + 1e-7
    assert (r != x).float().mean() > 0.9
    assert ((r - x.to(torch.bfloat16).float()).abs() > 0).float().mean() < 0.01  # ties aside, it is bf16 rounding


def test_group_advantages_are_centered_per_group_without_std_scaling():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5])
    a = HiddenAnswerTask.group_advantages(r, 4)
    torch.testing.assert_close(a, torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.0, 0.0]))


def test_answers_start_in_the_initial_policys_distribution_with_low_probability_tokens():
    cfg = SimConfig(vocab=1024, n_problems=8, seq_len=8)
    g = torch.Generator().manual_seed(0)
    task = HiddenAnswerTask(cfg, TinyLM(cfg, g), g)
    p = task.init_answer_prob
    assert (p > 0.05).any() and (p < 0.01).any()  # head and tail tokens both among the answers


def test_dppo_learns_without_mismatch():
    cfg = SimConfig(vocab=256, seq_len=4, n_problems=4, prompts_per_batch=4, group_size=8, iterations=40,
                    minibatch=False, lr=3e-3, mismatch="none", max_target_rank=8)
    rows = run_simulation(cfg, "dppo_binary_tv", {"delta": 0.15}, seed=0)
    first = sum(r["reward"] for r in rows[:8]) / 8
    last = sum(r["reward"] for r in rows[-8:]) / 8
    assert last > first + 0.1, (first, last)  # measured: 0.37 -> 0.56 (a sign error drives it down)


def test_quick_cli_writes_plots_csv_and_summary(tmp_path, capsys):
    assert main(["fig5", "--quick", "--out", str(tmp_path / "out"), "--plot-dir", str(tmp_path / "img")]) == 0
    png = tmp_path / "img" / "fig5.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    with open(tmp_path / "out" / "fig5.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(EXPERIMENTS["fig5"].strategies) * 4  # 1 seed x 4 quick iterations
    assert {r["strategy"] for r in rows} == {s.label for s in EXPERIMENTS["fig5"].strategies}
    assert (tmp_path / "out" / "summary.json").exists()
    assert "fig5" in capsys.readouterr().out
    # second call is served from the cache: same CSV, no new runs
    n_runs = len(list((tmp_path / "out" / "runs").iterdir()))
    assert main(["fig5", "--quick", "--out", str(tmp_path / "out")]) == 0
    assert len(list((tmp_path / "out" / "runs").iterdir())) == n_runs


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for flag in ("--seeds", "--iterations", "--out", "--quick", "--workers", "--plot-dir", "--set"):
        assert flag in text
