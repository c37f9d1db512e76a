"""`python -m benchmarks gradient-noise`: the noise-scale estimator against gradients of known signal and noise,
and the recorder on a real learner: it applies no step, so the same turns give the same gradients twice."""

from __future__ import annotations

import random

import torch

from benchmarks.gradient_noise import StepStats, main, noise_scale, record_steps
from oat_dppo.agent import assign_advantages, play_episodes
from oat_dppo.backends.local import LocalTrainer
from oat_dppo.config import TrainConfig
from oat_dppo.rundir import RunDir
from oat_dppo.seeds import episode_seeds

TINY = dict(env="smoke:ask_first", model="tiny-qwen3", engine="hf", threads=1, template="none", max_new_tokens=1,
            max_turns=2, episodes_per_iteration=16, mini_batch_size=4, micro_batch_size=4, advantage="group",
            group_size=4, env_option=["history=last", "keys=4", "ask_one_in=2"], log="none", progress=False,
            eval_every=0, log_episodes=0)


def stats_of(grads: list[torch.Tensor], b: int) -> StepStats:
    stats = StepStats()
    for i, g in enumerate(grads):
        stats.add(g, b, half=int(i >= len(grads) // 2))
    return stats


def test_the_estimator_recovers_known_signal_and_noise():
    """g_i = G + e_i / sqrt(b), e_i ~ N(0, sigma^2 I_P): |G|^2 and tr(Sigma) = P sigma^2 come back, and B_noise is
    their ratio; with G = 0 the signal estimate is ~0 and the halves' cosine ~0."""
    gen = torch.Generator().manual_seed(0)
    P, b, m, sigma = 2000, 16, 400, 0.5
    G = torch.randn(P, generator=gen, dtype=torch.float64) * 0.05  # |G|^2 ~ 5
    grads = [G + torch.randn(P, generator=gen, dtype=torch.float64) * sigma / b ** 0.5 for _ in range(m)]
    r = noise_scale(stats_of(grads, b))
    assert abs(r["signal"] / float(G.dot(G)) - 1) < 0.1
    assert abs(r["trace"] / (P * sigma ** 2) - 1) < 0.05
    assert abs(r["B_noise"] / (P * sigma ** 2 / float(G.dot(G))) - 1) < 0.15
    assert r["halves_cos"] > 0.9
    pure = noise_scale(stats_of([torch.randn(P, generator=gen, dtype=torch.float64) for _ in range(m)], b))
    assert abs(pure["signal"]) < 0.05 * pure["trace"] / b and abs(pure["halves_cos"]) < 0.2


def test_recorded_steps_leave_the_weights_where_they_were(tmp_path):
    trainer = LocalTrainer(TrainConfig(**TINY), RunDir(tmp_path / "run"))
    try:
        before = [p.detach().clone() for p in trainer.model.parameters()]
        seeds = episode_seeds(0, 0, 16, 4)
        episodes, _ = play_episodes(trainer.engine, trainer.envs, seeds, trainer.prompt, max_new_tokens=1,
                                    topk=0, generation_seed=1)
        assign_advantages(episodes, "batch_norm", gamma=1.0)
        turns = [t for e in episodes for t in e.turns]
        ids = [i for i, e in enumerate(episodes) for _ in e.turns]
        first, again = StepStats(), StepStats()
        record_steps(trainer, turns, ids, random.Random(0), first, half=0)
        record_steps(trainer, turns, ids, random.Random(0), again, half=0)
        assert first.b == 4 and first.steps >= 2 and first.sq_norm_sum > 0
        assert again.steps == first.steps and abs(again.sq_norm_sum / first.sq_norm_sum - 1) < 1e-9
        torch.testing.assert_close(first.sums[0], again.sums[0])
        for p, q in zip(before, trainer.model.parameters()):
            assert torch.equal(p, q.detach())
    finally:
        trainer.close()


def test_the_command_prints_the_run_and_its_control(capsys):
    args = ["--batches", "2", "--"]
    for k, v in TINY.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            args.append(flag if v else "--no-" + flag[2:])
        elif isinstance(v, list):
            for item in v:
                args += [flag, item]
        else:
            args += [flag, str(v)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| advantages |" in out and "| shuffled (control) |" in out
    assert main(["--batches", "1", "--", "--model", "tiny-qwen3"]) != 0
