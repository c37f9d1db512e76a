"""`DPPOLearner`: Oat's `PPOLearner` whose learning step is the shared trust-region learner loop.

Around the step everything stays Oat's: DeepSpeed engine and optimizer, weight sync to vLLM, LoRA,
checkpoints, wandb, the learn() round. The buffer holds whole episodes (`data.py`), traded between ranks
before a round so that their tokens are even. A learning step takes the whole buffer: its turns packed
(`data.to_token_batch`); pi_old recomputed only where the strategy anchors on it or `--mu-source recompute`
(DPPO skips the forward: the paper's ~25% saving); then the shared `plan_update` / `run_update` in Oat's
order (`np.random.permutation`), as many micro-batches on every rank, DeepSpeed stepping where
`_DeepSpeedHooks` says. `ppo_clip` with `anchor="recompute"`, `--mu-source recompute` and Oat's aggregation
reproduces `PPOLearner.learning_step`, with and without `--tis-c` (tests/test_oat_backend_learner.py).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch
from oat.algorithms.ppo import PPOLearner
from oat.model import LLM

from oat_dppo.agent import EVAL_KEYS, combine_eval
from oat_dppo.agent.reply_effect import ModelMovePolicy, scored
from oat_dppo import patches
from oat_dppo.backends.oat import supervise
from oat_dppo.backends.oat.args import aggregation_of, resolve_on_node, to_train_config
from oat_dppo.backends.oat.data import EpisodeTurns, episode_tokens, to_token_batch, turns_of
from oat_dppo.components import build_trust_region
from oat_dppo.engine.base import pad_token_id
from oat_dppo.learner import (chunks, needs_pi_old, plan_update, recompute_old_logp, row_sort_keys, run_update,
                              sequence_layout, use_mu_source)
from oat_dppo.learner.balance import exchange_by_tokens
from oat_dppo.learner.batch import row_of
from oat_dppo.models import freeze_all_but_top_layers
from oat_dppo.config import to_dict
from oat_dppo.provenance import provenance
from oat_dppo.rundir import RunDir, append_jsonl
from oat_dppo.envs.splits import split_seeds
from oat_dppo.trust_region import requirements

patches.apply()  # in the learner's node process: Oat's CUDA-only lines on a machine without CUDA (no-op with CUDA)

#: The `sync/...` metrics `--check-sync` adds to every learning round's log row.
SYNC_KEYS = ("sync/logp_max_abs_diff_before", "sync/logp_max_abs_diff_after", "sync/actor_weights_changed",
             "sync/probe_tokens")


def hf_policy(model):
    """The transformers model under Oat's wrappers (`oat.model.LLM.model` -> DeepSpeed engine `.module`; a
    PeftModel with LoRA, which forwards `get_decoder` and `get_output_embeddings`), whose decoder and LM head
    the shared log-prob code calls directly."""
    m = model.model if isinstance(model, LLM) else model
    inner = getattr(m, "module", None)  # deepspeed.DeepSpeedEngine
    return inner if isinstance(inner, torch.nn.Module) else m


class _SlotDataset(torch.utils.data.Dataset):
    """n placeholder prompts, (formatted, raw, reference) as Oat's PromptDataset's, that only pace Oat's
    loop (a batch of slots per actor step): episodes start from environment seeds."""

    def __init__(self, n: int):
        self.n = int(n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return "", f"slot {i}", ""


class _DeepSpeedHooks:
    """`UpdateHooks` over Oat's strategy. DeepSpeed divides each backward by its accumulation steps (undone:
    the loss is normalized over the optimizer step already) and must see `step()` after every micro-batch;
    the boundary is set by hand, since a step's micro-batch count is the plan's, not the config's."""

    def __init__(self, learner: "DPPOLearner"):
        self.learner = learner
        self.engine = learner.model.model if isinstance(learner.model, LLM) else learner.model
        self.acc_steps = learner.strategy.grad_acc_step
        self.world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        self.micro_batches = 0  # of the current optimizer step
        self.pending = 0  # micro-batches of the current optimizer step seen so far

    def begin_step(self, micro_batches: int) -> None:
        self.micro_batches, self.pending = micro_batches, 0

    def backward(self, loss: torch.Tensor) -> None:
        lr = self.learner
        self.pending += 1
        last = self.pending == self.micro_batches
        self.engine.set_gradient_accumulation_boundary(last)  # before backward: ZeRO reduces there
        lr.strategy.backward(loss * self.acc_steps, lr.model, lr.optimizer)
        if not last:  # inside the step: DeepSpeed only counts the micro-batch
            lr.strategy.optimizer_step(lr.optimizer, lr.model, lr.scheduler)

    def step(self) -> float:
        lr = self.learner
        if self.pending != self.micro_batches:
            raise RuntimeError(f"an optimizer step of {self.pending} micro-batches, planned {self.micro_batches}")
        norm = float(lr.strategy.get_gradient_norm(lr.model))
        lr.strategy.optimizer_step(lr.optimizer, lr.model, lr.scheduler)
        self.engine.set_gradient_accumulation_boundary(None)  # DeepSpeed's own counting again
        return norm

    def agree_max(self, counts: list[int]) -> list[int]:
        return [int(c) for c in _over_ranks(counts, torch.int64, torch.distributed.ReduceOp.MAX)]

    def normalizers(self, tokens: float, sequences: float) -> tuple[float, float]:
        """DeepSpeed averages the learners' gradients: normalize by the mean count over learner ranks
        (the counts of a step differ between ranks: each holds other responses)."""
        summed = _over_ranks([tokens, sequences], torch.float64, torch.distributed.ReduceOp.SUM)
        return summed[0] / self.world, summed[1] / self.world


def _over_ranks(values: list, dtype: torch.dtype, op) -> list:
    """`values` reduced by `op` over every learner rank (the default group); one rank: as they are."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return list(values)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # NCCL reduces CUDA tensors only
    t = torch.tensor(values, dtype=dtype, device=device)  # [n]
    torch.distributed.all_reduce(t, op=op)
    return t.tolist()


def same_keys_on_every_rank(infos: dict[str, float]) -> dict[str, float]:
    """The round's metrics with the same keys, in the same order, on every learner rank. Oat all-reduces its log
    row key by key in dict order: a rank that sends another key set hangs the round, and a rank whose share trained
    no token has no token-weighted means (`MetricAccumulator` skips weight 0) and NaN advantage statistics. Every
    rank sends the union of the ranks' keys, sorted; where its own value is missing or NaN it sends the mean of the
    ranks that have one, so Oat's mean over the ranks is the mean over the ranks that measured it."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return dict(sorted(infos.items()))
    every = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(every, {k: float(v) for k, v in infos.items()})
    out = {}
    for k in sorted(set().union(*every)):
        measured = [r[k] for r in every if not math.isnan(r.get(k, math.nan))]
        mine = float(infos.get(k, math.nan))
        out[k] = mine if not math.isnan(mine) else (sum(measured) / len(measured) if measured else math.nan)
    return out


class MetricsFile:
    """In front of Oat's wandb logger (`learner._wandb`): one row per learning round in SAVE_PATH/metrics.jsonl,
    the local backend's file and names (`actor/...` as `rollout/...`), which plots and study reports read."""

    def __init__(self, path: Path, inner=None):
        self.path, self.inner = path, inner
        self.last_step = None
        # A resumed run appends: its rounds so far (the row before the first update is iteration -1).
        self.rows = sum('"iteration": -1' not in line for line in path.open()) if path.exists() else 0

    def log(self, row: dict, *args, **kwargs) -> None:
        step = row.get("misc/policy_sgd_step")
        if step != self.last_step:  # Oat logs every step; a learning round once
            self.last_step = step
            # Oat's evaluation before any update (step 0) is iteration -1, as on the local backend; round k is k - 1.
            out = {"iteration": self.rows if step else -1}
            self.rows += bool(step)
            for k, v in row.items():
                key = "rollout/" + k[len("actor/"):] if k.startswith("actor/") else k
                out[key] = float(v) if isinstance(v, (int, float, np.floating, np.integer)) else v
            append_jsonl(self.path, [out])
        if self.inner is not None:
            self.inner.log(row, *args, **kwargs)

    def finish(self) -> None:
        if self.inner is not None:
            self.inner.finish()


def run_config(args) -> dict:
    """config.json, as a local run writes it (resolved on this node), with every Oat argument under `_oat`."""
    oat = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    oat = {k: v if isinstance(v, (int, float, str, bool, type(None), list, dict)) else repr(v) for k, v in oat.items()}
    return {**to_dict(to_train_config(args)), "backend": "oat", "_oat": oat, **provenance()}


class DPPOLearner(PPOLearner):
    def _init(self, args, actors) -> None:
        for note in resolve_on_node(args, cuda=patches.cuda_present()):  # this node's machine, not the launcher's
            print(f"note: {note}", file=sys.stderr)
        super()._init(args, actors)  # Oat's engines, optimizer, collector, wandb; then PPOLearner's
        if self.strategy.is_rank_0():
            self._wandb = MetricsFile(Path(self.save_path) / "metrics.jsonl", self._wandb)
            RunDir(self.save_path, create=False).write_config(run_config(args))
        self.dataset_builder = EpisodeTurns
        self.trust_region = build_trust_region(to_train_config(args))
        self.topk = requirements(self.trust_region).topk
        self.trajectory_sequences = requirements(self.trust_region).trajectory_sequences
        self._optimizer_steps = 0
        self.aggregation = aggregation_of(args)
        # Oat's drgrpo aggregation: masked_sum / generate_max_length.
        self.constant_length = args.generate_max_length if self.aggregation == "seq_sum_constant_length" else None

    # -- the node's life -------------------------------------------------------------------------------
    def run(self):
        """Oat's `LearnerBase.run` (set-up, every round, final eval, wandb's finish), ending by telling the
        launcher that this learner finished instead of Oat's `lp.stop()` (see `supervise`)."""
        supervise.run_then_report(self, super().run)

    # -- data: placeholders that pace the actor steps ---------------------------------------------------
    def prepare_data(self, strategy, tokenizer):
        args = self.args
        # Oat's `_init` calls this after building the policy and before its optimizer, which takes only the
        # parameters that require grad (`get_optimizer_grouped_parameters`): where --trainable-layers freezes.
        if args.trainable_layers:
            policy = hf_policy(self.model)
            freeze_all_but_top_layers(policy, args.trainable_layers)
            sizes = [(getattr(p, "ds_numel", p.numel()), p.requires_grad) for p in policy.parameters()]  # ZeRO-3: ds_numel
            strategy.print(f"note: --trainable-layers {args.trainable_layers}: {sum(n for n, g in sizes if g)} of "
                           f"{sum(n for n, _ in sizes)} parameters train")
        if args.iterations:
            n = args.iterations * args.rollout_batch_size
        else:  # until Oat's max_train queries (turns); capped: the sampler materializes its indices
            n = min(math.ceil(args.max_train / max(args.num_samples, 1)) + args.rollout_batch_size, 10**7)
        self.prompts_dataset = _SlotDataset(n)
        self.eval_prompts_dataset = _SlotDataset(0)
        self.prompts_dataloader = strategy.setup_dataloader(
            self.prompts_dataset, args.rollout_batch_size_per_device, pin_memory=False, shuffle=False
        )
        self.eval_prompts_dataloader = torch.utils.data.DataLoader(self.eval_prompts_dataset, batch_size=1)

    # -- a learning round: the episodes balanced over the ranks, then the step --------------------------
    def learn(self, learning_round: int):
        """Oat's round, after the ranks trade episodes to even their tokens (`exchange_by_tokens`);
        `policy_sgd_step` advances by the optimizer steps taken (Oat counts it from rows)."""
        self.pi_buffer = deque(exchange_by_tokens(list(self.pi_buffer), episode_tokens), maxlen=self.pi_buffer.maxlen)
        before, self._optimizer_steps = self.policy_sgd_step, 0
        info = super().learn(learning_round)
        self.policy_sgd_step = before + self._optimizer_steps
        return info

    # -- the learning step ---------------------------------------------------------------------------
    def learning_step(self, turns):
        """One round's update over `turns`, the buffer's (episode, transition) pairs (`EpisodeTurns`)."""
        args = self.args
        policy = hf_policy(self.model)
        device = next(policy.parameters()).device
        # The batch stays on the host ([B, T, K+1] top-K arrays can be large); micro-batches move.
        batch, trained, rows = to_token_batch(turns, self.topk, pad_token_id(self.tokenizer))
        B, mb = batch.num_rows, args.train_batch_size_per_device
        if batch.advantages is None:  # plain TransitionData: Oat's group Monte-Carlo advantages
            final = torch.tensor([t.rewards[-1] for _, t in turns], dtype=torch.float32)
            batch.advantages = self.compute_monte_carlo_advantages(final[:, None] * args.reward_scale, None)[:, None]

        recompute_s = 0.0
        if needs_pi_old(self.trust_region, args.mu_source):
            t0 = time.perf_counter()
            batch.old_logp = recompute_old_logp(policy, batch, chunks(range(B), mb), device=device,
                                                logits_chunk_tokens=args.logits_chunk_tokens)
            rollout_mu = batch.behavior_logp
            use_mu_source(batch, args.mu_source)
            if args.tis_c is not None:  # Oat's TIS: weight by min(pi_old/mu, tis_c) (positive: masks keep their signs)
                tis = torch.exp(batch.old_logp - rollout_mu).clamp(max=args.tis_c)  # [B, T]
                batch.advantages = torch.where(batch.response_mask, batch.advantages * tis, torch.zeros_like(tis))
            recompute_s = time.perf_counter() - t0
        batch.response_mask = batch.response_mask & trained  # Oat's loss_masks

        hooks = _DeepSpeedHooks(self)
        layout = sequence_layout(policy, reduced_during_backward=args.zero_stage == 2 and hooks.world > 1)
        plan, sequence_ids = plan_update(  # Oat's shuffle (and its RNG stream); a step's rows sorted as the local's
            [len(t.prompt_ids) + len(t.response_ids) for _, t in turns], [e for e, _ in turns],
            trajectory_sequences=self.trajectory_sequences, chain_of=row_of(rows), micro_tokens=args.micro_batch_tokens,
            mini_batch_unit=args.mini_batch_unit, epochs=args.num_ppo_epochs, step_rows=mb * hooks.acc_steps,
            micro_rows=mb, permutation=np.random.permutation, sort_keys=row_sort_keys(layout, [t for _, t in turns]))
        if sequence_ids is not None:
            batch.sequence_ids = torch.tensor(sequence_ids, dtype=torch.long)  # [B]
        metrics = run_update(policy, batch, plan, self.trust_region, hooks, device=device,
                             aggregation=self.aggregation, constant_length=self.constant_length,
                             logits_chunk_tokens=args.logits_chunk_tokens, layout=layout)
        self._optimizer_steps += int(metrics["optimizer_steps"])
        infos = {**metrics, "recompute_s": recompute_s, "turns_received": float(len(turns)), **batch.advantage_stats()}
        return {k: torch.tensor(float(v)) for k, v in same_keys_on_every_rank(infos).items()}

    # -- weight sync, checked (--check-sync) -----------------------------------------------------------
    def sync_params_to_actors(self):
        """Oat's broadcast into the actors' vLLM; with --check-sync rank 0 compares the first actor's log-probs
        of one response of the round (and a digest of its weights) before and after with the learner's: a
        stale actor differs before, a synced one should not after. Every rank logs rank 0's numbers."""
        if self.args.check_sync != "on":
            return super().sync_params_to_actors()
        probe = self._sync_probe_tokens() if self.strategy.is_rank_0() else None
        before = self.actors[0].sync_probe(*probe) if probe else None
        super().sync_params_to_actors()
        info = {}  # no probe (no response this round): no sync/... keys, rather than a perfect-looking 0.0
        if probe:
            after = self.actors[0].sync_probe(*probe)
            learner = self._learner_logprobs(*probe)  # [R]
            info["sync/logp_max_abs_diff_before"] = float((torch.tensor(before[0]) - learner).abs().max())
            info["sync/logp_max_abs_diff_after"] = float((torch.tensor(after[0]) - learner).abs().max())
            info["sync/actor_weights_changed"] = float(before[1] != after[1])
            info["sync/probe_tokens"] = float(len(probe[1]))
        shared = [info]  # rank 0's keys and values on every rank (Oat all-reduces the log row key by key)
        torch.distributed.broadcast_object_list(shared, src=0)
        self._sync_info = shared[0]

    def _sync_probe_tokens(self) -> tuple[list[int], list[int]] | None:
        """(prompt ids, response ids) of the first turn with a response in this round's buffer."""
        for t in (t for item in self.pi_buffer for t in turns_of(item)):
            if len(t.response_ids):
                return [int(i) for i in t.prompt_ids], [int(i) for i in t.response_ids]
        return None

    @torch.no_grad()
    def _learner_logprobs(self, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
        """log pi of each response token given the prompt and the tokens before it: [R] float32."""
        policy = hf_policy(self.model)
        device = next(policy.parameters()).device
        ids = torch.tensor([prompt_ids + response_ids], device=device)  # [1, P + R]
        logits = policy(input_ids=ids).logits[0, len(prompt_ids) - 1: -1].float()  # [R, V]
        target = torch.tensor(response_ids, device=device)[:, None]  # [R, 1]
        return logits.log_softmax(-1).gather(-1, target)[:, 0].cpu()

    # -- evaluation: held-out episodes in the actors ----------------------------------------------------
    def evaluate(self, dataloader, steps):
        """Oat's periodic evaluation: the validation split's episodes (`eval/*`)."""
        if self.args.eval_episodes <= 0:
            return {}
        t0 = time.time()
        out = {f"eval/{k}": float(v) for k, v in self.held_out("validation", self.args.eval_episodes).items()}
        out["eval/elapse"] = time.time() - t0
        return out

    def eval_and_log(self, train_info, eval=False, save=False):
        sync_info = getattr(self, "_sync_info", None)
        if sync_info:  # Oat all-reduces the row key by key: every rank adds the same keys (see above)
            train_info = {**train_info, **sync_info}
            self._sync_info = None
        out = super().eval_and_log(train_info, eval=eval, save=save)
        if eval and save:  # Oat's last call, at the run's end (`LearnerBase.run`)
            self.test_at_end()
        return out

    def test_at_end(self) -> None:
        """The run's one test evaluation of its final policy (`--test-episodes`), into evaluations.jsonl, as a local
        run ends (`LocalTrainer._test_at_end`). Iteration: the last learning round's (round k is iteration k - 1)."""
        if not (self.args.test_episodes and self.args.eval_every):  # as locally: --eval-every 0 evaluates nothing
            return
        t0 = time.time()
        metrics = self.held_out("test", self.args.test_episodes)
        if self.strategy.is_rank_0():
            metrics["seconds"] = time.time() - t0
            iteration = self._wandb.rows - 1  # the rounds logged (a resumed run's included), round k iteration k - 1
            RunDir(self.save_path, create=False).record_evaluation(split="test", iteration=iteration, policy="last",
                                                                   metrics=metrics)
            self.strategy.print(f"test: reward {metrics['reward_mean']:.3f} over {int(metrics['episodes'])} episodes")

    def held_out(self, split: str, episodes: int) -> dict[str, float]:
        """The split's `episodes` episodes, played by the actors (rank 0 asks them, seeds from `split_seeds`) and
        scored for the reply effect on every rank; the same metrics on every rank."""
        self._pre_evaluate()
        shared = [{k: math.nan for k in EVAL_KEYS}, []]  # (metrics, reply-effect cases), rank 0's for every rank
        if self.strategy.is_rank_0():
            seeds = split_seeds(split, episodes, self.args.seed)
            n = len(self.actors)
            done = [f.result() for f in [a.futures.evaluate_episodes(seeds[i::n], split)
                                         for i, a in enumerate(self.actors) if seeds[i::n]]]
            shared = [combine_eval([m for m, _ in done]), [c for _, cases in done for c in cases]]
        torch.distributed.barrier(group=self._same_actor_group)
        torch.distributed.broadcast_object_list(shared, src=0)
        result, cases = shared
        # Every rank runs the scorer's forwards (ZeRO-3 gathers need all) with the weights the actors sample from.
        result.update(scored(cases, lambda: ModelMovePolicy(hf_policy(self.model), self.tokenizer,
                                                            self.args.response_prefix),
                             max_turns=self.args.reply_effect_turns))
        self._post_evaluate()
        return {k: float(v) for k, v in result.items()}
