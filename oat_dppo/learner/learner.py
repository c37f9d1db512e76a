"""The local learner: a rollout batch of turns -> several trust-region optimizer steps (AdamW).

Per rollout batch: `num_ppo_epochs` passes over the turns, each split into mini-batches (one
optimizer step each: the paper's several gradient steps per batch, where a trust region matters),
each mini-batch split into micro-batches (gradient accumulation). The loop itself is the one both
backends share (`learner.loop`); this class owns the torch optimizer and its hooks.
Behavior-anchored strategies use the mu recorded at rollout and never run an extra forward pass;
anchor="recompute" strategies (and `--mu-source recompute`) get one no-grad pass over the batch
before the first update (pi_old).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from oat_dppo.agent.types import Turn
from oat_dppo.learner.batch import TokenBatch, chains, collate, row_of
from oat_dppo.learner.logprobs import sequence_layout
from oat_dppo.learner.loop import (
    MuSource,
    StepPlan,
    needs_pi_old,
    plan_steps,
    plan_update,
    recompute_old_logp,
    row_sort_keys,
    run_update,
    use_mu_source,
)
from oat_dppo.learner.timing import OnTiming, timed
from oat_dppo.trust_region import requirements


@dataclass
class LearnerConfig:
    learning_rate: float = 1e-5
    num_ppo_epochs: int = 1
    mini_batch_size: int = 16  # turns (or episodes, see mini_batch_unit) per optimizer step
    mini_batch_unit: str = "turns"  # "episodes": a step takes that many whole episodes (needs episode_ids);
    # "groups": that many episodes as whole groups of group_size (needs group_ids)
    group_size: int = 1  # episodes per group (the rollout's --group-size), for mini_batch_unit "groups"
    micro_batch_size: int = 4  # turns per forward/backward (gradient accumulation)
    micro_batch_tokens: int = 0  # > 0: micro-batches by this token budget (rows x longest row) instead
    logits_chunk_tokens: int = 4096  # response tokens per checkpointed LM-head block (0: one block)
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    aggregation: str = "token_mean"
    constant_length: int | None = None  # for aggregation "seq_sum_constant_length"
    # Where mu comes from: the log-probs the engine recorded at rollout (the paper's choice), or a
    # recomputed pi_old (what on-policy PPO implementations such as stock Oat without TIS assume).
    mu_source: MuSource = "rollout"


class _TorchOptimizerHooks:
    """`UpdateHooks` with a torch optimizer: backward, then clip and step (a non-finite gradient
    would destroy the weights: that step is skipped)."""

    def __init__(self, optimizer: torch.optim.Optimizer, max_grad_norm: float):
        self.optimizer = optimizer
        self.max_norm = max_grad_norm if max_grad_norm > 0 else float("inf")
        self.params = [p for g in optimizer.param_groups for p in g["params"]]

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        if torch.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def begin_step(self, micro_batches: int) -> None:
        pass  # torch accumulates until step()

    def agree_max(self, counts: list[int]) -> list[int]:
        return counts  # one process

    def normalizers(self, tokens: float, sequences: float) -> tuple[float, float]:
        return tokens, sequences  # one process


class Learner:
    """`on_timing(name, seconds)` (optional): the wall time of each piece of every update (`learner.timing`)."""

    def __init__(self, model, trust_region, config: LearnerConfig, *, pad_id: int, device: str | torch.device = "cpu",
                 on_timing: OnTiming | None = None):
        self.model = model
        self.on_timing = on_timing
        self.trust_region = trust_region
        self.config = config
        self.pad_id = pad_id
        self.device = torch.device(device)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters")
        # The fused kernel: one pass over each tensor instead of a loop of elementwise ops (on a CPU core, SmolLM2's
        # 135 M parameters step in 0.40 s against 1.87 s; python -m benchmarks peers' learner, docs/benchmarks_peers.md).
        self.optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay,
                                           fused=self.device.type in ("cpu", "cuda"))
        self.topk = requirements(trust_region).topk
        self.trajectory_sequences = requirements(trust_region).trajectory_sequences
        self.layout = sequence_layout(model)  # the prefix layout sorts rows by their tokens (`row_sort_keys`)

    def update(self, turns: Sequence[Turn], rng: random.Random, episode_ids: Sequence[int] | None = None,
               group_ids: Sequence[int] | None = None) -> dict[str, float]:
        """Train on `turns` (advantages already assigned); returns the update's metrics. `episode_ids`
        (one per turn): the episode each turn belongs to, which a strategy whose sequence is the whole
        episode needs (`Requirements.trajectory_sequences`); without them each turn is its own. `group_ids`
        (one per turn): the group of episodes played from its start state (`mini_batch_unit` "groups")."""
        cfg = self.config
        t_start = time.perf_counter()
        prepared = self.prepare(turns, rng, episode_ids, group_ids)
        if prepared is None:
            return {"optimizer_steps": 0.0, "train_tokens": 0.0}
        batch, plan = prepared
        self.model.train()
        recompute_s = 0.0
        if needs_pi_old(self.trust_region, cfg.mu_source):
            t0 = time.perf_counter()
            lengths = batch.attention_mask.sum(-1).tolist()  # [B]
            # the order the update's micro-batches use (`row_sort_keys`)
            key = (lambda i: batch.input_ids[i, : int(lengths[i])].tolist()) if self.layout == "prefix" else lengths.__getitem__
            ordered = sorted(range(batch.num_rows), key=key)
            with timed(self.on_timing, "forward"):  # pi_old: a no-grad forward over the batch
                micro = plan_steps(len(ordered), epochs=1, step_rows=len(ordered), micro_rows=cfg.micro_batch_size,
                                   permutation=lambda n: ordered, lengths=lengths, micro_tokens=cfg.micro_batch_tokens)[0]
                batch.old_logp = recompute_old_logp(self.model, batch, micro,
                                                    device=self.device, logits_chunk_tokens=cfg.logits_chunk_tokens)
            use_mu_source(batch, cfg.mu_source)
            recompute_s = time.perf_counter() - t0
        self.optimizer.zero_grad(set_to_none=True)
        out = run_update(self.model, batch, plan, self.trust_region, _TorchOptimizerHooks(self.optimizer, cfg.max_grad_norm),
                         device=self.device, aggregation=cfg.aggregation, constant_length=cfg.constant_length,
                         logits_chunk_tokens=cfg.logits_chunk_tokens, layout=self.layout, on_timing=self.on_timing)
        self.model.eval()
        out.update(recompute_s=recompute_s, train_seconds=time.perf_counter() - t_start)
        return out

    def prepare(self, turns: Sequence[Turn], rng: random.Random, episode_ids: Sequence[int] | None = None,
                group_ids: Sequence[int] | None = None) -> tuple[TokenBatch, list[StepPlan]] | None:
        """The packed batch of `turns` and the optimizer steps (micro-batches of its rows) that `update` runs
        with this `rng`; None when no turn has a response. A benchmark reads it to run a bare loop on the
        same micro-batches."""
        cfg = self.config
        for name, ids in (("episode", episode_ids), ("group", group_ids)):
            if ids is not None and len(ids) != len(turns):
                raise ValueError(f"{len(ids)} {name} ids for {len(turns)} turns")
        kept = [i for i, t in enumerate(turns) if t.response_ids]
        turns = [turns[i] for i in kept]
        if not turns:
            return None
        lengths = [len(t.prompt_ids) + len(t.response_ids) for t in turns]
        order: list[int] = []

        def permutation(n: int) -> list[int]:  # each epoch reshuffles the previous order (seeded)
            if not order:
                order.extend(range(n))
            rng.shuffle(order)
            return list(order)

        episodes = None if episode_ids is None else [episode_ids[i] for i in kept]
        rows = None if episodes is None else chains(turns, episodes)  # an episode's chat turns: one row
        by_group = cfg.mini_batch_unit == "groups"
        plan, sequence_ids = plan_update(
            lengths, episodes, trajectory_sequences=self.trajectory_sequences, mini_batch_unit=cfg.mini_batch_unit,
            epochs=cfg.num_ppo_epochs, step_rows=cfg.mini_batch_size // cfg.group_size if by_group else cfg.mini_batch_size,
            micro_rows=cfg.micro_batch_size, permutation=permutation, chain_of=None if rows is None else row_of(rows),
            sort_keys=row_sort_keys(self.layout, turns), micro_tokens=cfg.micro_batch_tokens,
            group_ids=None if group_ids is None else [group_ids[i] for i in kept])
        with timed(self.on_timing, "collate"):
            batch = collate(turns, self.pad_id, self.topk, rows=rows)
        if sequence_ids is not None:
            batch.sequence_ids = torch.tensor(sequence_ids, dtype=torch.long)  # [B]
        return batch, plan
