"""Replay one learning round of a multi-learner Oat program on a single rank, in this process.

The program ran with `--dump-replay-every 1` (Oat pickles every learner's buffer of the round, gathered
to rank 0: `buffer_step00001.pkl`) and `--save-steps 1` (Oat saves the policy after the round:
`saved_models/step_00001`). Here one `DPPOLearner` on a one-rank gloo group (tests/oat_harness.py), built
from the same command line and the same initial weights, takes the same round on all of the ranks'
episodes at once. What the ranks' all-reduce must make equal: the gradient norm of the step and the
weights after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


@dataclass
class Replayed:
    grad_norm: float  # the single-rank step's gradient norm
    max_weight_diff: float  # max |w_single - w_program| over every parameter after the step
    weights: int  # how many weights the step updates
    weights_off: int  # of them, how many end more than lr / 20 apart from the program's
    episodes: int
    turns: int


def _oats_optimizer(model, args):
    """What Oat's `DeepspeedStrategy.create_optimizer` builds without --adam-offload: DeepSpeed's FusedAdam
    (its CPU build here) over Oat's parameter groups."""
    from deepspeed.ops.adam import FusedAdam
    from oat.utils.deepspeed import get_optimizer_grouped_parameters

    return FusedAdam(get_optimizer_grouped_parameters(model, args.l2), lr=args.learning_rate,
                     betas=(args.adam_beta_1, args.adam_beta_2), weight_decay=args.l2)


def replay_round(run_dir: Path, argv: list[str], ranks: list[int] | None = None) -> Replayed:
    """The round on one rank: every rank's episodes (default), or only those of `ranks` (a step that missed the
    all-reduce sees its own rank's alone)."""
    import oat_harness as H

    from oat_dppo.backends.oat import args as A
    from oat_dppo.backends.oat.learner import DPPOLearner

    [save_path] = [p for p in run_dir.iterdir() if (p / "buffer_step00001.pkl").exists()]
    _, _, per_rank = pd.read_pickle(save_path / "buffer_step00001.pkl")
    episodes = [e for i, rank in enumerate(per_rank) if ranks is None or i in ranks for e in rank]
    initial = run_dir / "initial_model" / "tiny-qwen3"
    model = AutoModelForCausalLM.from_pretrained(initial, torch_dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(initial)

    args = A.parse(argv)
    A.finalize(args, world_size=1)
    learner = H.make_stock_learner(args=args, learner_cls=DPPOLearner, model=model, tokenizer=tok,
                                   optimizer=lambda m: _oats_optimizer(m, args))
    batch = H.collate(learner, episodes)
    infos, _ = H.run_learning_step(learner, batch)

    after = AutoModelForCausalLM.from_pretrained(save_path / "saved_models" / "step_00001", torch_dtype=torch.float32)
    saved = dict(after.named_parameters())
    diffs = [(p.detach() - saved[n].detach()).abs().flatten() for n, p in H.policy_of(learner).named_parameters()]
    diff = torch.cat(diffs)  # [number of weights]
    return Replayed(grad_norm=float(infos["grad_norm"]), max_weight_diff=float(diff.max()), weights=diff.numel(),
                    weights_off=int((diff > args.learning_rate / 20).sum()), episodes=len(episodes),
                    turns=len(batch))  # (episode, turn) pairs
