"""One learner rank of a data-parallel `DPPOLearner` step, in its own process (tests/test_oat_aggregation.py).

    python tests/helpers/oat_ranks.py RANK WORLD PORT OUT_DIR

WORLD processes join one gloo group over loopback (as Oat's learners do, without vLLM or launchpad) and
each builds a real `DPPOLearner` in a DeepSpeed engine (tests/oat_harness.py). The data is 16 turns in
two halves of very different response lengths: with WORLD 2, rank r trains on half r; with WORLD 1 the
one rank trains on both. For every aggregation mode each rank takes one optimizer step (SGD) from the
same initial weights, twice: with the learner as it is ("fixed") and with its count reduction undone, every
rank normalizing by its own counts ("per_rank", what the learner did before). Rank 0 saves, per mode and
variant, the gradient norm and the weights after the step to OUT_DIR/world{WORLD}.pt; every rank saves
the response tokens it trained (OUT_DIR/tokens{WORLD}_{RANK}.pt).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch

MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_sum_constant_length")
VARIANTS = ("fixed", "per_rank")
TURNS, GROUP, MICRO, LR = 16, 2, 4, 0.5


def turns(tok, policy):
    """16 DPPO turns with on-policy mu: 8 with 1-2 word responses, then 8 with 8-12 word ones."""
    import oat_harness as H

    from oat_dppo.backends.oat.data import DPPOTransitionData

    rng = np.random.default_rng(7)
    advantages = rng.normal(size=TURNS).round(3)

    def half(seed, words, offset):
        return H.make_transitions(tok, TURNS // 2, num_samples=GROUP, response_words=words, seed=seed, behavior=policy,
                                  transition_cls=DPPOTransitionData,
                                  extra=lambda i, p, r: {"advantage": float(advantages[offset + i])})

    return half(1, (1, 2), 0) + half(2, (8, 12), TURNS // 2)


def join(rank: int, world: int, port: int) -> None:
    """This process as learner rank `rank` of `world`: one torch thread, a gloo group over loopback."""
    import torch.distributed

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def sgd_learner(tok, initial, world: int, **options):
    """A real `DPPOLearner` in a DeepSpeed engine (SGD at LR) from `initial`'s weights, its arguments the
    harness's CPU and small settings with `options` over them, finalized for `world` learner ranks."""
    import oat_harness as H
    from oat.args import default_args_validation

    from oat_dppo.backends.oat.args import DPPOArgs, finalize
    from oat_dppo.backends.oat.learner import DPPOLearner

    args = DPPOArgs(**{**H.CPU_ARGS, **H.SMALL_ARGS, **options})
    finalize(args, world_size=world)
    default_args_validation(args)
    model = H.tiny_policy(tok, seed=0)
    model.load_state_dict(initial.state_dict())
    return H.make_stock_learner(args=args, learner_cls=DPPOLearner, model=model, tokenizer=tok,
                                optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=LR))


def main(rank: int, world: int, port: int, out: Path) -> None:
    join(rank, world, port)
    import torch.distributed as dist

    import oat_harness as H

    from oat_dppo.backends.oat.learner import _DeepSpeedHooks, hf_policy

    tok = H.byte_tokenizer()
    initial = H.tiny_policy(tok, seed=0)
    data = turns(tok, initial)
    mine = data if world == 1 else data[rank * TURNS // world:(rank + 1) * TURNS // world]
    saved, tokens = {}, {}
    for mode in MODES:
        for variant in VARIANTS:
            learner = sgd_learner(tok, initial, world, env="rg:arc_1d", trust_region="pg_is", aggregation=mode,
                                  episodes_per_iteration=TURNS, num_samples=GROUP, train_batch_size=TURNS,
                                  train_batch_size_per_device=MICRO, generate_max_length=32)
            original = _DeepSpeedHooks.normalizers
            if variant == "per_rank":
                _DeepSpeedHooks.normalizers = lambda self, t, s: (t, s)
            try:
                np.random.seed(0)
                infos, _ = H.run_learning_step(learner, H.collate(learner, mine))
            finally:
                _DeepSpeedHooks.normalizers = original
            params = H.gathered_params(hf_policy(learner.model))
            saved[(mode, variant)] = {"grad_norm": float(infos["grad_norm"]),
                                      "params": {k: v.clone() for k, v in params.items()}}
            tokens[(mode, variant)] = float(infos["train_tokens"])
    out.mkdir(parents=True, exist_ok=True)
    torch.save(tokens, out / f"tokens{world}_{rank}.pt")
    if rank == 0:
        torch.save(saved, out / f"world{world}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
