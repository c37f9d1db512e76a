"""`DPPOLearner`: Oat's `PPOLearner` whose learning step is the shared trust-region step.

Everything around the step stays Oat's: the DeepSpeed engine and optimizer, gradient accumulation,
weight sync to vLLM, sleep/wake, collocation, LoRA, checkpoints, wandb, the learn() round. Per call
(one learning round, the whole buffer as one batch, as in `PPOLearner.learn`):

1. Oat's trajectory dict -> `TokenBatch` [B, T] (`data.to_token_batch`), advantages from the actor
   (the shared `assign_advantages`), or Oat's Monte-Carlo advantages for plain `TransitionData`.
2. Only when the strategy is anchored on a recomputed pi_old (`anchor="recompute"`, MiniRL) or mu
   is replaced by it (`--behavior recompute`): one no-grad forward over the batch. Behavior-anchored
   strategies (DPPO, ratio clip on pi/mu) skip it: the paper's ~25% saving.
3. `num_ppo_epochs` passes in Oat's order (`np.random.permutation`), micro-batches of
   `train_batch_size_per_device`: `trust_region_loss` (log pi at response positions only, pi on mu's
   top-K ids without a [B, T, V] tensor, the strategy, the aggregation) -> `strategy.backward` ->
   `strategy.optimizer_step` (DeepSpeed steps at accumulation boundaries).

Equivalence with stock Oat (tests/test_oat_backend_learner.py): `ppo_clip` with eps_low = eps_high =
cliprange, `anchor="recompute"`, `--behavior recompute` and Oat's aggregation reproduces
`PPOLearner.learning_step` (tis_c None; with `--tis-c` too). With the default `--behavior rollout`
the same strategy is MiniRL (paper D.1): IS weight pi/mu, clip on pi/pi_old.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from oat.algorithms.ppo import PPOLearner
from oat.model import LLM

from oat_dppo.backends.oat.args import aggregation_of, to_train_config
from oat_dppo.backends.oat.data import DPPOTransitionDataset, select_rows, to_token_batch
from oat_dppo.learner import MetricAccumulator, policy_logprobs, trust_region_loss


def hf_policy(model):
    """The Hugging Face module under Oat's wrappers: DeepSpeed engine (`.module`) -> `oat.model.LLM`
    (`.model`) -> the transformers model (a PeftModel with LoRA, which forwards `get_decoder` and
    `get_output_embeddings`). The shared log-prob code calls its decoder and LM head directly."""
    m = model
    if not isinstance(m, LLM) and hasattr(m, "module") and isinstance(m.module, torch.nn.Module):
        m = m.module  # deepspeed.DeepSpeedEngine
    if isinstance(m, LLM):
        m = m.model
    return m


class _SlotDataset(torch.utils.data.Dataset):
    """Oat's learner loop iterates a prompt dataloader; the actors ignore the prompts (episodes start
    from environment seeds), so the items are placeholders that only set the pace: one batch of
    `rollout_batch_size_per_device` slots per actor step."""

    def __init__(self, n: int):
        self.n = int(n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return "", f"slot {i}", ""  # (formatted prompt, raw prompt, reference), as Oat's PromptDataset


class DPPOLearner(PPOLearner):
    def _init(self, args, actors) -> None:
        super()._init(args, actors)  # Oat's engines, optimizer, collector, wandb; then PPOLearner's
        from oat_dppo.backends.local import build_trust_region

        self.dataset_builder = DPPOTransitionDataset
        self.trust_region = build_trust_region(to_train_config(args))
        self.topk = int(getattr(self.trust_region, "topk", 0))
        self.needs_old_logp = bool(getattr(self.trust_region, "needs_old_logp", False)) or args.behavior == "recompute"
        self.aggregation = aggregation_of(args)
        # Oat's drgrpo aggregation: masked_sum / generate_max_length.
        self.constant_length = args.generate_max_length if self.aggregation == "seq_sum_constant_length" else None
        self.forward_counts = {"recompute": 0, "train": 0}

    # -- data: placeholders that pace the actor steps ---------------------------------------------------
    def prepare_data(self, strategy, tokenizer):
        args = self.args
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

    # -- the learning step ---------------------------------------------------------------------------
    def learning_step(self, trajectory):
        args = self.args
        policy = hf_policy(self.model)
        device = next(policy.parameters()).device
        # The batch stays on the host ([B, T, K+1] top-K arrays can be large); micro-batches move.
        batch, trained_rows = to_token_batch(trajectory, self.topk)
        B = batch.input_ids.shape[0]
        if batch.advantages is None:  # plain TransitionData: Oat's group Monte-Carlo advantages
            final = torch.tensor([r[-1] for r in trajectory["rewards"]], dtype=torch.float32)
            batch.advantages = self.compute_monte_carlo_advantages(final[:, None] * args.reward_scale, None)[:, None]
        adv_stats = batch.advantages.detach().float()

        infos: dict[str, torch.Tensor] = {}
        if self.needs_old_logp:
            t0 = time.perf_counter()
            batch.old_logp = self._recompute_old_logp(policy, batch, device)
            infos["recompute_time"] = torch.tensor(time.perf_counter() - t0)
            rollout_mu = batch.behavior_logp
            if args.behavior == "recompute":  # the on-policy assumption: mu := pi_old
                batch.behavior_logp = torch.where(batch.response_mask, batch.old_logp, batch.behavior_logp)
            if args.tis_c is not None:  # Oat's TIS: weight by min(pi_old/mu, tis_c) (positive: masks keep their signs)
                tis = torch.exp(batch.old_logp - rollout_mu).clamp(max=args.tis_c)  # [B, T]
                batch.advantages = torch.where(batch.response_mask, batch.advantages * tis, torch.zeros_like(tis))
        batch.response_mask = batch.response_mask & trained_rows[:, None]  # Oat's loss_masks

        mb = args.train_batch_size_per_device
        acc_steps = self.strategy.grad_acc_step
        acc = MetricAccumulator()
        losses, grad_norms = [], []
        micro_index, window_loss = 0, 0.0
        for _ in range(args.num_ppo_epochs):
            order = torch.as_tensor(np.random.permutation(B))  # Oat's shuffle (and its RNG stream)
            micro = [order[i : i + mb] for i in range(0, B, mb)]
            for w in range(0, len(micro), acc_steps):
                window = micro[w : w + acc_steps]  # the micro-batches of one optimizer step
                rows = torch.cat(window)
                # Normalizers of the whole step, as if it were one batch (every row counts as a
                # sequence, as in Oat's per-sequence mean; loss-masked rows add no tokens).
                n_tok = max(float(batch.response_mask[rows].sum()), 1.0)
                n_seq = float(len(rows))
                for r in window:
                    mbatch = select_rows(batch, r).to(device)
                    loss, metrics = trust_region_loss(
                        policy, mbatch, self.trust_region, aggregation=self.aggregation,
                        constant_length=self.constant_length, num_tokens=n_tok, num_sequences=n_seq,
                        logits_chunk_tokens=self.args.logits_chunk_tokens,
                    )
                    self.forward_counts["train"] += 1
                    micro_index += 1
                    window_loss += float(loss.detach())
                    # DeepSpeed's backward divides by the accumulation steps; the normalizer above
                    # already covers the whole step, so undo it.
                    self.strategy.backward(loss * acc_steps, self.model, self.optimizer)
                    if micro_index % acc_steps == 0:
                        grad_norms.append(float(self.strategy.get_gradient_norm(self.model)))
                        losses.append(window_loss)
                        window_loss = 0.0
                    self.strategy.optimizer_step(self.optimizer, self.model, self.scheduler)
                    acc.add(metrics, float(mbatch.num_tokens))

        for k, v in acc.result().items():
            infos[k] = torch.tensor(float(v))
        infos["pg_loss"] = torch.tensor(float(np.mean(losses)) if losses else window_loss)
        infos["policy_grad_norm"] = torch.tensor(max(grad_norms) if grad_norms else math.nan)
        infos["adv_mean"] = adv_stats.mean()
        infos["adv_min"] = adv_stats.min()
        infos["adv_max"] = adv_stats.max()
        infos["train_tokens"] = torch.tensor(float(batch.num_tokens) * args.num_ppo_epochs)
        infos["recompute_forwards"] = torch.tensor(float(self.forward_counts["recompute"]))
        return infos

    @torch.no_grad()
    def _recompute_old_logp(self, policy, batch, device) -> torch.Tensor:
        """[B, T] log pi_old at every response position: one no-grad pass in micro-batches."""
        B = batch.input_ids.shape[0]
        old = torch.zeros_like(batch.behavior_logp)
        mb = self.args.train_batch_size_per_device
        for i in range(0, B, mb):
            rows = torch.arange(i, min(i + mb, B))
            sub = select_rows(batch, rows)
            sub.topk_ids = sub.topk_behavior_logp = sub.topk_valid = None  # not needed for pi_old
            logp = policy_logprobs(policy, sub.to(device), with_entropy=False,
                                   chunk_tokens=self.args.logits_chunk_tokens).logp  # [mb, width]
            old[rows, : logp.shape[1]] = logp.float().cpu()
            self.forward_counts["recompute"] += 1
        return old

    # -- evaluation: held-out episodes in the actors ----------------------------------------------------
    def evaluate(self, dataloader, steps):
        from oat_dppo.backends.local import eval_seeds
        from oat_dppo.backends.oat.actor import EVAL_KEYS, combine_eval

        args = self.args
        if args.eval_episodes <= 0:
            return {}
        t0 = time.time()
        self._pre_evaluate()
        result = {k: math.nan for k in EVAL_KEYS}
        if self.strategy.is_rank_0():
            seeds = eval_seeds(args.seed, args.eval_episodes)
            n = len(self.actors)
            futures = [a.futures.evaluate_episodes(seeds[i::n]) for i, a in enumerate(self.actors) if seeds[i::n]]
            result = combine_eval([f.result() for f in futures])
        torch.distributed.barrier(group=self._same_actor_group)
        torch.distributed.barrier()
        result = self.strategy.broadcast(result)
        self._post_evaluate()
        out = {f"eval/{k}": float(v) for k, v in result.items()}
        out["eval/elapse"] = time.time() - t0
        return out
