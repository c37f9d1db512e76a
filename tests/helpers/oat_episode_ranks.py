"""One learner rank of a data-parallel `DPPOLearner` round over whole episodes, in its own process
(tests/test_oat_aggregation.py).

    python tests/helpers/oat_episode_ranks.py RANK WORLD PORT OUT_DIR

WORLD gloo processes, each a real `DPPOLearner` in a DeepSpeed engine (tests/oat_harness.py), as
oat_ranks.py. The round is 8 episodes: 4 of one turn, then 4 of four turns. With WORLD 2, rank 0 holds the
short episodes and rank 1 the long ones (4x the turns); with WORLD 1 the one rank holds all 8. For each ZeRO
stage (0, 2, 3), from the same initial weights (SGD, `oat_ranks.sgd_learner`):

* "balanced": Oat's `learn()` round: the ranks first trade episodes by tokens (`learner.balance.exchange_by_tokens`), then
  take one optimizer step of all 8 episodes (`--mini-batch-unit episodes`);
* "unbalanced": `learning_step` on the rank's own episodes (no trade): 4 against 16 turns, so the short rank
  pads its step with empty micro-batches (`equalize_plan`);
* "steps": the learn() round with a step of 2 episodes, so several optimizer steps whose micro-batch counts
  differ between the ranks (nothing to compare with one rank: it must end, with the same step count on both).

Rank 0 saves per (stage, variant) the gradient norm, the weights after the round (gathered under ZeRO-3) and
the optimizer steps to OUT_DIR/world{WORLD}.pt; every rank saves the turns it trained to
OUT_DIR/turns{WORLD}_{RANK}.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

STAGES = (0, 2, 3)
VARIANTS = ("balanced", "unbalanced", "steps")
EPISODES, MICRO = 8, 2  # SGD at oat_ranks.LR


def episodes(tok, policy) -> list:
    """4 one-turn episodes, then 4 four-turn episodes, on-policy mu, fixed advantages."""
    import oat_harness as H

    from oat_dppo.backends.oat.data import DPPOEpisodeData, DPPOTransitionData

    turns_of = [1] * (EPISODES // 2) + [4] * (EPISODES // 2)
    advantages = np.random.default_rng(7).normal(size=sum(turns_of)).round(3)
    turns = H.make_transitions(tok, sum(turns_of), num_samples=1, response_words=(2, 6), seed=3, behavior=policy,
                               transition_cls=DPPOTransitionData,
                               extra=lambda i, p, r: {"advantage": float(advantages[i])})
    out, start = [], 0
    for n in turns_of:
        out.append(DPPOEpisodeData(prompt="", prompt_ids=[], response="", response_ids=[], response_logprobs=[],
                                   rewards=[0.0], turns=turns[start:start + n]))
        start += n
    return out


def main(rank: int, world: int, port: int, out: Path) -> None:
    from oat_ranks import join, sgd_learner

    join(rank, world, port)
    import torch.distributed as dist

    import oat_harness as H

    from oat_dppo.backends.oat.learner import hf_policy

    tok = H.byte_tokenizer()
    initial = H.tiny_policy(tok, seed=0)
    data = episodes(tok, initial)
    mine = data if world == 1 else data[rank * EPISODES // world:(rank + 1) * EPISODES // world]
    saved, trained = {}, {}
    for stage in STAGES:
        for variant in VARIANTS:
            step_episodes = 2 if variant == "steps" else EPISODES
            learner = sgd_learner(tok, initial, world, env="smoke:digits", trust_region="pg_is",
                                  aggregation="token_mean", mini_batch_unit="episodes", zero_stage=stage,
                                  episodes_per_iteration=EPISODES, num_samples=1, train_batch_size=step_episodes,
                                  train_batch_size_per_device=1 if variant == "steps" else MICRO,
                                  generate_max_length=32)
            np.random.seed(0)
            if variant == "unbalanced":
                infos, _ = H.run_learning_step(learner, H.collate(learner, mine))
                infos = {k: float(v) for k, v in infos.items()}
            else:
                row = H.run_learn_round(learner, mine)
                infos = {k[len("train/"):]: v for k, v in row.items() if k.startswith("train/")}
            params = H.gathered_params(hf_policy(learner.model))  # every rank takes part under ZeRO-3
            saved[(stage, variant)] = {"grad_norm": float(infos["grad_norm"]), "steps": float(infos["optimizer_steps"]),
                                       "params": {k: v.clone() for k, v in params.items()}}
            trained[(stage, variant)] = float(infos["train_tokens"])
    out.mkdir(parents=True, exist_ok=True)
    torch.save(trained, out / f"turns{world}_{rank}.pt")
    steps = [None] * world
    dist.all_gather_object(steps, {k: v["steps"] for k, v in saved.items()})
    if rank == 0:
        torch.save({"saved": saved, "steps_per_rank": steps}, out / f"world{world}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
