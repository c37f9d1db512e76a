"""How strongly each `--advantage` mode credits reading the hints on GuessTheNumber: the signal a rollout batch
gives the policy gradient, before any model is involved.

    python -m benchmarks credit_signal [--reads 0.5,0.7,0.9] [--batches 200]

A scripted policy plays real GEM episodes (`make_env`, the run's env and seeds): each turn it reads the hints
with probability q (a random guess inside the interval they leave, `agent.demonstrations.random_reader`) and
otherwise guesses blind in the whole range. That one decision stands for what RL must teach; its score function
is d log pi(a) / d logit(read) = 1[read] - q, so a batch's policy gradient along it is

    g = (1 / turns) sum_turns A_t (1[read_t] - q)        (the token mean of the loss; one move a turn)

and the batch pushes reading up when g > 0. Beside it, what the same batch does to the first guess (made before any
hint, uniform over the range under this policy, so no first guess is better than another in expectation):
g_k = (1 / turns) sum_{first turns} A_t (1[guess = k] - 1 / range) for each number k, and its root mean square
over k, the push toward numbers that happened to win in this batch (the group's hidden numbers): noise the next
batches must undo. Per mode (`agent.advantages.assign_advantages`, with and without
`--episode-balance`) over `batches` batches of `episodes` episodes in groups of `group_size` (one hidden number a
group), the table gives the mean of g, its standard deviation across batches and their ratio (signal to noise
per batch: the batches needed before the summed steps point the right way at 2 sigma are (2 / ratio)^2). The
control the measure must fail: hints that say nothing (`--control`: a reader's interval is drawn at random, so
reading does not help) gives a mean near 0 in every mode.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass

import numpy as np

from oat_dppo.agent.advantages import ADVANTAGE_MODES, assign_advantages
from oat_dppo.agent.demonstrations import guess_interval, guess_range
from oat_dppo.agent.types import Episode, Turn
from oat_dppo.cli import opt, parse
from oat_dppo.envs.registry import make_env


@dataclass
class Config:
    """Options of `python -m benchmarks credit_signal`."""

    env: str = opt("game:GuessTheNumber-v0-easy", "a GuessTheNumber env id")
    reads: str = opt("0.5,0.7,0.9", "comma-separated probabilities q that a turn reads the hints")
    batches: int = opt(200, "rollout batches per (q, mode)")
    episodes: int = opt(32, "episodes per batch")
    group_size: int = opt(8, "episodes per hidden number (a GRPO group)")
    gamma: float = opt(0.9, "discount over turns (the games' preset)")
    control: bool = opt(False, "readers draw their interval at random: hints that say nothing (the control)")
    seed: int = opt(0, "seed of the policy and of the batches' start seeds")


def play_batch(cfg: Config, q: float, rng: random.Random, base_seed: int) -> list[Episode]:
    """`cfg.episodes` episodes of the mixed policy, a group of `group_size` per start seed; a turn's response_ids
    carry 1 where it read the hints and 0 where it guessed blind."""
    episodes = []
    for i in range(cfg.episodes):
        seed = base_seed + i // cfg.group_size
        env = make_env(cfg.env, seed=seed, partial_credit=False)
        obs, _ = env.reset(seed=seed)
        ep = Episode(env_index=i, seed=seed)
        done = False
        while not done:
            read = rng.random() < q
            low, high = guess_range(obs)
            if read and not cfg.control:
                low, high = guess_interval(obs)
            elif read:  # the control: an interval of the same kind, unrelated to the hints
                a, b = sorted(rng.sample(range(low, high + 1), 2))
                low, high = a, b
            guess = rng.randint(low, high)
            nxt, reward, terminated, truncated, _ = env.step(f"\\boxed{{{guess}}}")
            done = terminated or truncated
            # the prompt as ids: the state the policy is shown (gigpo's step groups key on it); no model reads them
            ep.turns.append(Turn(prompt_ids=list(obs.encode()), response_ids=[int(read)], behavior_logprobs=np.zeros(1, np.float32),
                                 reward=float(reward), done=done, truncated=truncated, well_formed=True,
                                 finish_reason="stop", observation=obs, response_text=str(guess)))
            obs = nxt
        episodes.append(ep)
    return episodes


def gradient(episodes: list[Episode], q: float) -> float:
    """g = mean over turns of A_t (1[read_t] - q)."""
    terms = [t.advantage * (t.response_ids[0] - q) for e in episodes for t in e.turns]
    return float(np.mean(terms))


def first_guess_push(episodes: list[Episode], span: range) -> float:
    """Root mean square over k of g_k = (1 / turns) sum_{first turns} A_t (1[guess = k] - 1 / len(span))."""
    turns = sum(len(e.turns) for e in episodes)
    push = np.zeros(len(span))
    for e in episodes:
        t = e.turns[0]
        push += t.advantage * ((np.array(span) == int(t.response_text)) - 1 / len(span))
    return float(np.sqrt(np.mean((push / turns) ** 2)))


def measure(cfg: Config) -> list[dict]:
    rows = []
    for q in [float(x) for x in cfg.reads.split(",")]:
        rng = random.Random(cfg.seed)
        grads: dict[tuple[str, bool], list[float]] = {(m, b): [] for m in ADVANTAGE_MODES for b in (False, True)}
        pushes: dict[tuple[str, bool], list[float]] = {key: [] for key in grads}
        low, high = guess_range(make_env(cfg.env, seed=0).reset(seed=0)[0])
        success = []
        for k in range(cfg.batches):
            episodes = play_batch(cfg, q, rng, base_seed=cfg.seed * 1_000_003 + k * cfg.episodes)
            success.append(np.mean([e.episode_return >= 1 for e in episodes]))
            for mode, balance in grads:
                assign_advantages(episodes, mode, gamma=cfg.gamma, episode_balance=balance)
                grads[mode, balance].append(gradient(episodes, q))
                pushes[mode, balance].append(first_guess_push(episodes, range(low, high + 1)))
            print(f"  q={q}: batch {k + 1}/{cfg.batches}", file=sys.stderr, end="\r", flush=True)
        print(file=sys.stderr)
        for (mode, balance), g in grads.items():
            g = np.asarray(g)
            rows.append({"q": q, "success": float(np.mean(success)), "mode": mode, "balance": balance,
                         "mean": float(g.mean()), "std": float(g.std(ddof=1)),
                         # a mode that gives no advantage at all (a group of 1) has no signal, not a NaN
                         "snr": float(g.mean() / g.std(ddof=1)) if g.std(ddof=1) > 0 else 0.0,
                         "first_push": float(np.mean(pushes[mode, balance]))})
    return rows


def main(argv: list[str]) -> int:
    cfg = parse(Config, argv, prog="python -m benchmarks credit_signal", description=__doc__)
    rows = measure(cfg)
    print(f"{cfg.env}, {cfg.batches} batches of {cfg.episodes} episodes in groups of {cfg.group_size}, gamma "
          f"{cfg.gamma}{', CONTROL: hints say nothing' if cfg.control else ''}\n")
    print("| q (reads) | success | mode | episode balance | mean g | std g | signal/noise per batch | batches for 2 sigma "
          "| first-guess push (RMS over numbers) | its ratio to mean g |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        need = (2 / r["snr"]) ** 2 if r["snr"] > 0 else float("inf")
        print(f"| {r['q']:.1f} | {r['success']:.2f} | {r['mode']} | {'yes' if r['balance'] else 'no'} | "
              f"{r['mean']:+.4f} | {r['std']:.4f} | {r['snr']:+.2f} | {need:.0f} | {r['first_push']:.4f} | "
              + (f"{r['first_push'] / abs(r['mean']):.2f} |" if r["mean"] else "n/a |"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
