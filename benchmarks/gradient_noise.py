"""How many turns an optimizer step needs before its gradient points where the expected gradient does: the
gradient noise scale of a run's own loss on its own rollouts, and the control without credit beside it.

    python -m benchmarks gradient-noise [--batches 2] -- <the run's options: --model, --env, --advantage, ...>

A step of b turns (`--mini-batch-size`) gives the gradient g_i of the run's loss (its trust region, its aggregation,
the learner's packing: `Learner.prepare` and `learner.loop.run_update`, with hooks that record each step's gradient
over the trainable parameters and apply none, so every step is taken at the same weights). With G the expected
gradient and Sigma the covariance of one turn's (McCandlish et al. 2018, "An Empirical Model of Large-Batch
Training", eq. 2.6-2.8, their B_simple):

    E |g_b|^2 = |G|^2 + tr(Sigma) / b                        B_noise = tr(Sigma) / |G|^2

the step size in turns at which signal and noise weigh the same: a step of b << B_noise turns moves mostly along
noise. From the M steps of every batch (B = M b turns in all; S = mean_i |g_i|^2, G_B = mean_i g_i), both terms
unbiased:

    |G|^2 ~ (B |G_B|^2 - b S) / (B - b)        tr(Sigma) ~ (S - |G_B|^2) / (1 / b - 1 / B)

and, with fewer assumptions, the cosine between the mean gradients of the two halves of the batches (independent
rollouts): near 1 where the signal dominates a half, near 0 where noise does, but only over many batches when the
noise lives in few directions (on GuessTheNumber it swung from -0.35 to +0.53 on the control; docs/warm_start.md).
Gradients are taken before the learner's clipping. The control the measure must fail:
the same rollouts with their advantages shuffled over the batch's turns (`--shuffle-advantages`): no expected
gradient, so |G|^2 ~ 0 (B_noise unbounded) and the halves' cosine ~ 0. The rollouts are played by the run's engine
from its model at `--seed`'s training seeds (iterations 0, 1, ...), nothing is trained. A step whose size is not b
(the last of a batch) is left out.
"""

from __future__ import annotations

import math
import random
import sys
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

from oat_dppo.agent import assign_advantages, play_episodes
from oat_dppo.cli import fail, opt, parse
from oat_dppo.config import TrainConfig
from oat_dppo.learner.loop import needs_pi_old, recompute_old_logp, run_update, use_mu_source
from oat_dppo.rundir import RunDir
from oat_dppo.seeds import derive_seed, episode_seeds


@dataclass
class Config:
    batches: int = opt(2, "rollout batches of --episodes-per-iteration episodes each (independent seeds; the "
                          "first half against the second for the cosine)")


class GradientRecorder:
    """`UpdateHooks` that keep the last optimizer step's gradient (flattened over `params`, float64) and apply
    none: the weights never move."""

    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = params
        self.pending: torch.Tensor | None = None  # the last step's gradient [P]

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def begin_step(self, micro_batches: int) -> None:
        pass

    def agree_max(self, counts: list[int]) -> list[int]:
        return counts

    def normalizers(self, tokens: float, sequences: float) -> tuple[float, float]:
        return tokens, sequences

    def step(self) -> float:
        """Keep the accumulated gradient, flattened [P], and clear the parameters' gradients."""
        self.pending = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double()
                                  for p in self.params])  # [P]
        for p in self.params:
            p.grad = None
        return float(self.pending.norm())


class StepStats:
    """Running sums over step gradients of b turns, in two halves (independent rollouts): what `noise_scale`
    needs, in memory of two gradients whatever the number of steps."""

    def __init__(self):
        self.b = 0
        self.count = [0, 0]
        self.sq_norm_sum = 0.0
        self.sums: list[torch.Tensor | None] = [None, None]

    def add(self, grad: torch.Tensor, b: int, half: int) -> None:
        if self.b and b != self.b:
            raise ValueError(f"steps of {b} turns beside steps of {self.b}")
        self.b = b
        self.count[half] += 1
        self.sq_norm_sum += float(grad.dot(grad))
        self.sums[half] = grad.clone() if self.sums[half] is None else self.sums[half].add_(grad)

    @property
    def steps(self) -> int:
        return sum(self.count)


def record_steps(trainer, turns, episode_ids, rng: random.Random, stats: StepStats, half: int) -> None:
    """Add each full-size step's gradient [P] of the learner's plan over `turns` to `stats`."""
    learner = trainer.learner
    prepared = learner.prepare(turns, rng, episode_ids)
    if prepared is None:
        return
    batch, plan = prepared
    cfg = learner.config
    if needs_pi_old(learner.trust_region, cfg.mu_source):  # the weights never move: pi_old is the policy now
        batch.old_logp = recompute_old_logp(learner.model, batch, [micro for step in plan for micro in step],
                                            device=learner.device, logits_chunk_tokens=cfg.logits_chunk_tokens)
        use_mu_source(batch, cfg.mu_source)
    sizes = [batch.num_turns([r for micro in step for r in micro]) for step in plan]
    b = stats.b or max(sizes)
    recorder = GradientRecorder([p for p in learner.model.parameters() if p.requires_grad])
    learner.model.train()
    for step, size in zip(plan, sizes):
        if size != b:
            continue
        run_update(learner.model, batch, [step], learner.trust_region, recorder, device=learner.device,
                   aggregation=cfg.aggregation, constant_length=cfg.constant_length,
                   logits_chunk_tokens=cfg.logits_chunk_tokens)
        stats.add(recorder.pending, b, half)
        recorder.pending = None
    learner.model.eval()


def noise_scale(stats: StepStats) -> dict[str, float]:
    """B_noise and its parts from the M step gradients of b turns each in `stats` (the module's docstring)."""
    m, b = stats.steps, stats.b
    B = m * b
    a, c = stats.sums
    mean = (a + c) / m  # [P]
    S = stats.sq_norm_sum / m
    GB = float(mean.dot(mean))
    signal = (B * GB - b * S) / (B - b)
    trace = (S - GB) / (1 / b - 1 / B)
    a, c = a / stats.count[0], c / stats.count[1]
    cos = float(a.dot(c) / (a.norm() * c.norm()).clamp_min(1e-30))
    return {"steps": m, "b": b, "S": S, "signal": signal, "trace": trace,
            "B_noise": trace / signal if signal > 0 else math.inf, "halves_cos": cos}


def measure(cfg: Config, tc: TrainConfig) -> dict[str, dict[str, float]]:
    from oat_dppo.backends.local import LocalTrainer  # noqa: PLC0415 (loads torch models: after the options)

    tc.log, tc.progress, tc.eval_every, tc.log_episodes = "none", False, 0, 0
    with tempfile.TemporaryDirectory(prefix="oat_dppo-gradient-noise-") as tmp:
        trainer = LocalTrainer(tc, RunDir(tmp))
        try:
            stats = {"advantages": StepStats(), "shuffled (control)": StepStats()}
            for k in range(cfg.batches):
                seeds = episode_seeds(tc.seed, k, tc.episodes_per_iteration, tc.group_size)
                episodes, _ = play_episodes(trainer.engine, trainer.envs, seeds, trainer.prompt,
                                            max_new_tokens=trainer.max_new_tokens, topk=trainer.learner.topk,
                                            generation_seed=derive_seed(tc.seed, "gen", k))
                played = [e for e in episodes if e.error is None]
                turns = [t for e in played for t in e.turns]
                episode_ids = [i for i, e in enumerate(played) for _ in e.turns]
                for name, shuffle in (("advantages", None),
                                      ("shuffled (control)", derive_seed(tc.seed, "control", k))):
                    assign_advantages(episodes, tc.advantage, gamma=trainer.gamma,
                                      episode_balance=tc.episode_balance, shuffle_seed=shuffle)
                    record_steps(trainer, turns, episode_ids, random.Random(derive_seed(tc.seed, "plan", k)),
                                 stats[name], half=int(k >= cfg.batches / 2))
                mean_return = np.mean([e.episode_return for e in played]) if played else float("nan")
                print(f"batch {k + 1}/{cfg.batches}: {len(played)} episodes, {len(turns)} turns, mean return "
                      f"{mean_return:.2f}", file=sys.stderr, flush=True)
        finally:
            trainer.close()
    return {name: noise_scale(st) for name, st in stats.items() if min(st.count) >= 1}


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """The benchmark's own options, and the run's (after `--`)."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def main(argv: list[str]) -> int:
    own, run = split(argv)
    cfg = parse(Config, own, prog="python -m benchmarks gradient-noise [options] -- <run options>",
                description=__doc__)
    tc = parse(TrainConfig, run, prog="python -m benchmarks gradient-noise ... --")
    if cfg.batches < 2:
        return fail("--batches must be at least 2 (the halves' cosine compares independent rollouts)")
    if tc.num_ppo_epochs != 1:
        return fail("gradient-noise takes every step at the rollout's weights: one pass (--num-ppo-epochs 1)")
    rows = measure(cfg, tc)
    print(f"{tc.model} on {tc.env}: {cfg.batches} batches of {tc.episodes_per_iteration} episodes (groups of "
          f"{tc.group_size}), --advantage {tc.advantage}, --trust-region {tc.trust_region}, steps of "
          f"{tc.mini_batch_size} {tc.mini_batch_unit}\n")
    print("| advantages | steps | turns a step (b) | mean \\|g_b\\|^2 | \\|G\\|^2 (signal) | tr Sigma (per turn) "
          "| B_noise (turns) | signal share of a step's \\|g\\|^2 | cosine of the halves' mean gradients |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        share = r["signal"] / r["S"] if r["S"] > 0 else float("nan")
        print(f"| {name} | {r['steps']} | {r['b']} | {r['S']:.3e} | {r['signal']:.3e} | {r['trace']:.3e} | "
              f"{r['B_noise']:.0f} | {share:.3f} | {r['halves_cos']:+.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
