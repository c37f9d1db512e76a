"""The Oat backend's learner (`DPPOLearner`) run for real on CPU: Oat's own `PPOLearner` machinery
(its `_init` chain, `learn()` round and DataLoader), the shared trust-region step, and
the stock `PPOLearner.learning_step` as the reference. Only vllm and launchpad are faked (import
boundary); the policy trains in a real DeepSpeed engine set up by Oat's own DeepspeedStrategy. See
docs/dev_oat_cpu.md.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch

if importlib.util.find_spec("oat") is None:
    pytest.skip("oat-llm is not installed; `make setup-oat` (docs/dev_oat_cpu.md)", allow_module_level=True)

import oat_harness as H  # noqa: E402
from oat.algorithms.ppo import PPOLearner  # noqa: E402
from oat.args import default_args_validation  # noqa: E402

from oat_dppo.backends.oat.args import DPPOArgs, finalize  # noqa: E402
from oat_dppo.backends.oat.data import DPPOTransitionData, EpisodeTurns, to_token_batch  # noqa: E402
from oat_dppo.backends.oat.learner import DPPOLearner, hf_policy  # noqa: E402


def dppo_args(**overrides) -> DPPOArgs:
    """DPPOArgs as the CLI would resolve them, for one CPU rank."""
    kw = {**H.CPU_ARGS, **H.SMALL_ARGS, "env": "rg:arc_1d", **overrides}
    args = DPPOArgs(**kw)
    finalize(args, world_size=1)
    return default_args_validation(args)


def sgd(lr: float):
    """Plain SGD instead of the harness's AdamW: Adam's first step is ~lr * sign(g), which turns
    float-noise differences of near-zero gradients into lr-sized ones."""
    return lambda model: torch.optim.SGD(model.parameters(), lr=lr)


def params(learner) -> dict[str, torch.Tensor]:
    return H.gathered_params(hf_policy(learner.model))


def assert_same_params(a, b, atol=1e-6):
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys()
    worst = max(float((pa[k] - pb[k]).abs().max()) for k in pa)
    assert worst <= atol, worst


def moved(before, learner) -> float:
    after = params(learner)
    return max(float((after[k] - before[k]).abs().max()) for k in before)


def step(learner, transitions, seed=0):
    np.random.seed(seed)  # both learners draw Oat's minibatch permutation from numpy's global RNG
    return H.run_learning_step(learner, H.collate(learner, transitions))[0]


def count_decoder_forwards(learner) -> dict[bool, int]:
    """Decoder forward calls, by whether gradients were on."""
    calls = {True: 0, False: 0}

    def hook(*_):
        calls[torch.is_grad_enabled()] += 1

    H.policy_of(learner).get_decoder().register_forward_hook(hook)
    return calls


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one intra-op thread


@pytest.fixture(scope="module")
def tok():
    return H.byte_tokenizer()


@pytest.fixture(autouse=True)
def _torch_linear_after_zero3():
    with H.zero3_linear_undone():
        yield


# ---------------------------------------------------------------------------------------------
# Data plumbing: the buffer's turns -> TokenBatch
# ---------------------------------------------------------------------------------------------


def test_dataset_carries_advantages_and_topk_and_token_batch_aligns_them(tok):
    K = 3

    def extra(i, p, r):
        L = len(r)
        ids = np.tile(np.arange(K + 1, dtype=np.int32), (L, 1))
        ids[:, K] = -1
        lp = np.where(ids >= 0, -1.0 - np.arange(K + 1), -np.inf).astype(np.float32)
        return dict(advantage=float(i), topk_ids=ids, topk_logprobs=lp)

    tr = H.make_transitions(tok, 4, transition_cls=DPPOTransitionData, extra=extra, truncate_every=4)
    tr[3].loss_mask = False
    learner = H.make_stock_learner(args=dppo_args(trust_region="dppo_topk_kl", topk=K), learner_cls=DPPOLearner)
    assert learner.dataset_builder is EpisodeTurns
    turns = H.collate(learner, tr)  # Oat's learn(): the dataset through a DataLoader
    assert turns == list(enumerate(tr))  # plain turns: an episode each
    batch, trained, rows = to_token_batch(turns, K, learner.tokenizer.pad_token_id)
    assert rows == [[0], [1], [2], [3]]  # turns of separate episodes: a row each
    assert trained.any(-1).tolist() == [True, True, True, False] and (trained == trained[:, :1]).all()
    assert batch.advantages[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    for b, t in enumerate(tr):
        p, L = len(t.prompt_ids), len(t.response_ids)
        pos = batch.response_mask[b].nonzero()[:, 0]
        assert pos.tolist() == list(range(p, p + L))  # response token t at position p + t
        assert batch.input_ids[b, p : p + L].tolist() == t.response_ids
        assert torch.allclose(batch.behavior_logp[b, p : p + L], torch.tensor(t.response_logprobs))
        assert batch.topk_ids[b, p : p + L, :K].tolist() == [[0, 1, 2]] * L
        assert not batch.topk_valid[b, p : p + L, K].any()  # -1 slot: unused
        assert torch.isneginf(batch.topk_behavior_logp[b, p : p + L, K]).all()
        assert not batch.topk_valid[b, :p].any()


def test_plain_transition_data_falls_back_to_oats_monte_carlo_advantages(tok):
    tr = H.make_transitions(tok, 8, num_samples=2)
    learner = H.make_stock_learner(args=dppo_args(trust_region="dppo_binary_tv"), learner_cls=DPPOLearner)
    batch, _, _ = to_token_batch(H.collate(learner, tr), 0, learner.tokenizer.pad_token_id)
    assert batch.advantages is None  # the learner computes Oat's group advantages (checked below by equivalence)


# ---------------------------------------------------------------------------------------------
# Equivalence with stock Oat
# ---------------------------------------------------------------------------------------------

STOCK_EQUIV = dict(trust_region="ppo_clip", cliprange=0.2, anchor="recompute", mu_source="recompute")


@pytest.mark.parametrize("critic_type", ["grpo", "drgrpo"])
def test_ppo_clip_recompute_reproduces_stock_oat_loss_and_update(tok, critic_type):
    """One micro-batch = one optimizer step: the same loss value and the same parameters."""
    common = dict(critic_type=critic_type, train_batch_size=8, train_batch_size_per_device=8)
    stock = H.make_stock_learner(dict(tis_c=None, use_fused_lm_head=False, **common), optimizer=sgd(0.5))
    ours = H.make_stock_learner(args=dppo_args(**STOCK_EQUIV, **common), learner_cls=DPPOLearner,
                                optimizer=sgd(0.5))
    assert_same_params(stock, ours, 0)
    tr = H.make_transitions(tok, 8, behavior=stock.model, logprob_offset=-0.3)  # mu != pi: ignored by both
    before = params(stock)
    info_s, info_o = step(stock, tr), step(ours, tr)
    assert moved(before, stock) > 1e-3
    assert float(info_o["loss"]) == pytest.approx(float(info_s["pg_loss"]), rel=1e-5, abs=1e-7)
    assert_same_params(stock, ours)


@pytest.mark.parametrize("zero_stage, chunk", [(2, 4096), (2, 7), (3, 4096), (3, 7)])
def test_under_zero_the_learner_still_reproduces_stock_oat(tok, zero_stage, chunk):
    """ZeRO stage 2 (DeepSpeed partitions optimizer state and gradients; it accepts Adam-type
    optimizers only) and 3 (parameters too: each module gathers its weights on entry and releases
    them on exit, see tests/oat_harness.py), two optimizer steps of two micro-batches: the same
    parameters as stock Oat within Adam's step size (AdamW's first step is ~lr * sign(g), so float
    noise in a near-zero gradient can flip a step: 2 lr), also with the (tied, trainable) LM head in
    checkpointed 7-token blocks, whose recompute in backward gathers it again. Adam's update does not
    see the loss's scale: the SGD tests check that."""
    lr = 1e-3
    common = dict(critic_type="drgrpo", zero_stage=zero_stage, train_batch_size=4, train_batch_size_per_device=2,
                  learning_rate=lr, tis_c=None)
    stock = H.make_stock_learner(dict(use_fused_lm_head=False, **common))
    ours = H.make_stock_learner(args=dppo_args(**STOCK_EQUIV, logits_chunk_tokens=chunk, **common),
                                learner_cls=DPPOLearner)
    assert H.engine_of(ours).zero_optimization_stage() == zero_stage
    if zero_stage == 3:  # partitioned outside a module's forward: a test that read them plainly would see nothing
        assert all(p.numel() == 0 for p in H.policy_of(ours).parameters())
    tr = H.make_transitions(tok, 8, behavior=stock.model, logprob_offset=-0.3)
    before = params(stock)
    step(stock, tr), step(ours, tr)
    assert moved(before, stock) > 0.5 * lr
    assert H.engine_of(stock).global_steps == H.engine_of(ours).global_steps == 2
    assert_same_params(stock, ours, atol=2 * lr + 1e-6)


@pytest.mark.parametrize("tis_c, chunk, zero_stage", [(None, 4096, 0), (2.0, 4096, 0), (None, 7, 0), (None, 7, 3)])
def test_ppo_clip_recompute_reproduces_stock_oat_over_several_steps_with_clipping(tok, tis_c, chunk, zero_stage):
    """4 optimizer steps per call (2 epochs x 2 accumulation windows of 2 micro-batches): from the
    second step on pi != pi_old and the clip masks tokens; Oat's TIS (tis_c) is reproduced too, and
    so is everything with the LM head in checkpointed 7-token blocks (recompute and training), also
    under ZeRO-3."""
    common = dict(critic_type="drgrpo", num_ppo_epochs=2, train_batch_size=4, train_batch_size_per_device=2,
                  tis_c=tis_c, zero_stage=zero_stage)
    stock = H.make_stock_learner(dict(use_fused_lm_head=False, **common), optimizer=sgd(3.0))
    ours = H.make_stock_learner(args=dppo_args(**STOCK_EQUIV, logits_chunk_tokens=chunk, **common),
                                learner_cls=DPPOLearner, optimizer=sgd(3.0))
    tr = H.make_transitions(tok, 8, behavior=stock.model, logprob_offset=-1.0)  # pi_old/mu = e > tis_c
    info_s, info_o = step(stock, tr), step(ours, tr)
    assert H.engine_of(stock).global_steps == H.engine_of(ours).global_steps == 4
    assert float(info_s["pg_clipfrac"]) > 0  # the clip was active: the masks are compared, not just ratios of 1
    assert float(info_o["kept_frac"]) < 1
    # (ours sorts a step's rows by their tokens under the CPU's prefix layout, stock Oat does not: each step sums the
    # same rows' gradients in another order, ~1e-6 apart after 4 steps at lr 3)
    assert_same_params(stock, ours, atol=3e-6)


def lora_zero3_learner(chunk: int):
    args = dppo_args(**STOCK_EQUIV, critic_type="drgrpo", zero_stage=3, lora_rank=4, train_batch_size=4,
                     train_batch_size_per_device=2, tis_c=None)
    assert args.logits_chunk_tokens == 0  # what the CLI chooses here (it refuses a non-zero value)
    args.logits_chunk_tokens = chunk
    learner = H.make_stock_learner(args=args, learner_cls=DPPOLearner)
    head = hf_policy(learner.model).get_output_embeddings().weight
    assert not head.requires_grad and head.numel() == 0  # frozen, partitioned
    return learner


def test_lora_under_zero3_trains_with_the_lm_head_in_one_block(tok):
    """--lora-rank with --zero-stage 3 (Oat's LLM: PEFT on a model loaded under deepspeed.zero.Init):
    the adapters train, nothing else moves."""
    learner = lora_zero3_learner(0)
    tr = H.make_transitions(tok, 8, behavior=learner.model, logprob_offset=-0.3)
    before = params(learner)
    info = step(learner, tr)
    after = params(learner)
    assert math.isfinite(float(info["loss"])) and H.engine_of(learner).global_steps == 2
    adapters = {k for k in before if "lora_" in k}
    assert adapters and any(not torch.equal(before[k], after[k]) for k in adapters)
    assert all(torch.equal(before[k], after[k]) for k in before if k not in adapters)


def test_lora_under_zero3_fails_with_the_lm_head_in_checkpointed_blocks(tok):
    """Why the CLI refuses --logits-chunk-tokens > 0 with --zero-stage 3 and --lora-rank: zero.Init
    replaces F.linear with a function that saves the weight itself; the block's recompute gathers the
    frozen head and releases it (`param.data` emptied in place) before backward reads it, and torch's
    checkpoint sees a [0]-shaped weight (transformers#47254, deepspeedai/DeepSpeed#8148; a trainable
    weight is saved detached, so full fine-tuning is not affected: the ZeRO-3 tests above). If a
    DeepSpeed upgrade makes this pass, lift the refusal in backends/oat/args.py."""
    learner = lora_zero3_learner(7)
    tr = H.make_transitions(tok, 8, behavior=learner.model, logprob_offset=-0.3)
    with pytest.raises(torch.utils.checkpoint.CheckpointError, match="different metadata"):
        step(learner, tr)


def test_behavior_rollout_default_weighs_by_pi_over_mu_unlike_stock(tok):
    """With the default --mu-source rollout the same strategy is MiniRL (paper D.1): weight pi/mu. With
    mu = pi - 0.3 nats the first step's gradient is e^0.3 times stock's."""
    common = dict(critic_type="drgrpo", train_batch_size=8, train_batch_size_per_device=8)
    stock = H.make_stock_learner(dict(tis_c=None, use_fused_lm_head=False, **common), optimizer=sgd(0.1))
    ours = H.make_stock_learner(args=dppo_args(trust_region="ppo_clip", cliprange=0.2, anchor="recompute", **common),
                                learner_cls=DPPOLearner, optimizer=sgd(0.1))
    before = params(stock)
    tr = H.make_transitions(tok, 8, behavior=stock.model, logprob_offset=-0.3)
    step(stock, tr), step(ours, tr)
    after_s, after_o = params(stock), params(ours)
    for k in before:
        d_s, d_o = after_s[k] - before[k], after_o[k] - before[k]
        assert torch.allclose(d_o, d_s * math.exp(0.3), atol=1e-6, rtol=1e-4)


def test_dppo_with_on_policy_mu_takes_stocks_first_step(tok):
    """mu = pi = pi_old and one optimizer step: every trust region keeps every token, so DPPO with the
    rollout mu (no recompute) takes exactly stock Oat's step."""
    common = dict(critic_type="drgrpo", train_batch_size=8, train_batch_size_per_device=2)
    stock = H.make_stock_learner(dict(tis_c=None, use_fused_lm_head=False, **common), optimizer=sgd(0.5))
    ours = H.make_stock_learner(args=dppo_args(trust_region="dppo_binary_tv", **common), learner_cls=DPPOLearner,
                                optimizer=sgd(0.5))
    tr = H.make_transitions(tok, 8, behavior=stock.model)
    step(stock, tr)
    info = step(ours, tr)
    assert float(info["kept_frac"]) == 1.0
    assert float(info["prob_diff_mean"]) < 1e-5
    assert_same_params(stock, ours, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# The recompute forward: skipped by behavior-anchored strategies
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "trust_region, extra, recompute",
    [
        ("dppo_binary_tv", {}, False),
        ("dppo_binary_kl", {}, False),
        ("ppo_clip", {}, False),  # anchor behavior (r = pi/mu)
        ("cispo", {}, False),
        ("ppo_clip", {"anchor": "recompute"}, True),  # MiniRL
        ("dppo_binary_kl", {"anchor": "recompute"}, True),  # the decoupled ablation (figure 4)
        ("dppo_binary_tv", {"mu_source": "recompute"}, True),  # mu := pi_old
    ],
)
def test_only_recompute_anchored_runs_make_the_extra_forward(tok, trust_region, extra, recompute):
    B, mb = 8, 2
    learner = H.make_stock_learner(args=dppo_args(trust_region=trust_region, train_batch_size=8,
                                                  train_batch_size_per_device=mb, num_ppo_epochs=2, **extra),
                                   learner_cls=DPPOLearner)
    tr = H.make_transitions(tok, B, behavior=learner.model)
    calls = count_decoder_forwards(learner)
    info = step(learner, tr)
    train = 2 * B // mb
    # Each micro-batch: one forward (the padded grid) or two (a shared prefix, then the rests), as its rows decide.
    assert train <= calls[True] <= 2 * train
    assert (B // mb <= calls[False] <= 2 * B // mb) if recompute else calls[False] == 0  # pi_old: no-grad, once
    assert (float(info["recompute_s"]) > 0) == recompute


def test_stock_oat_always_recomputes(tok):
    B, mb = 8, 2
    stock = H.make_stock_learner(dict(tis_c=None, use_fused_lm_head=False, train_batch_size=8,
                                      train_batch_size_per_device=mb))
    tr = H.make_transitions(tok, B, behavior=stock.model)
    calls = [0]
    H.policy_of(stock).register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    step(stock, tr)
    assert calls[0] == B // mb + B // mb  # recompute + train


# ---------------------------------------------------------------------------------------------
# Top-K strategies, metrics, a whole learn() round
# ---------------------------------------------------------------------------------------------


def topk_extra(model, K):
    """Top-K arrays of `model`'s own distribution (what a vLLM actor records at temperature 1)."""

    @torch.no_grad()
    def extra(i, prompt_ids, response_ids):
        ids = torch.tensor([list(prompt_ids) + list(response_ids)])
        logp = model.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float().log_softmax(-1)  # [L, V]
        top_lp, top_ids = logp.topk(K, -1)
        sampled = torch.tensor(response_ids)
        inside = (top_ids == sampled[:, None]).any(-1)
        ids_out = torch.cat([top_ids, torch.where(inside, -1, sampled)[:, None]], 1)
        lp_out = torch.cat([top_lp, torch.where(inside, float("-inf"), logp.gather(1, sampled[:, None])[:, 0])[:, None]], 1)
        return dict(topk_ids=ids_out.numpy().astype(np.int32), topk_logprobs=lp_out.numpy().astype(np.float32))

    return extra


@pytest.mark.parametrize("name", ["dppo_topk_tv", "dppo_topk_kl"])
def test_topk_strategy_trains_on_the_actors_topk_arrays(tok, name):
    K = 5
    learner = H.make_stock_learner(args=dppo_args(trust_region=name, topk=K), learner_cls=DPPOLearner)
    assert learner.topk == K
    tr = H.make_transitions(tok, 8, behavior=learner.model, transition_cls=DPPOTransitionData,
                            extra=topk_extra(learner.model, K))
    before = params(learner)
    info = step(learner, tr)
    assert moved(before, learner) > 0
    # mu (the top-K arrays) is the learner's own policy before the first update: divergence ~ 0 on
    # the first micro-batches; every metric is finite.
    assert float(info["divergence_mean"]) < 0.05
    for k in ("kept_frac", "binary_tv_mean", "divergence_mean", "entropy", "loss", "grad_norm"):
        assert math.isfinite(float(info[k])), k


@pytest.mark.parametrize("name", ["ipo", "icepop", "kpop", "tis", "mis", "trm"])
def test_peer_strategies_train_in_oats_learner(tok, name):
    """Each peer mask (oat_dppo/trust_region/framework_masks.py) through Oat's learning step: the weights move,
    the trust-region metrics are finite; mu is 0.2 nats off the learner's pi, so the masks see a gap."""
    learner = H.make_stock_learner(args=dppo_args(trust_region=name), learner_cls=DPPOLearner)
    tr = H.make_transitions(tok, 8, behavior=learner.model, logprob_offset=-0.2)
    before = params(learner)
    info = step(learner, tr)
    assert moved(before, learner) > 0
    for k in ("kept_frac", "loss", "grad_norm"):
        assert math.isfinite(float(info[k])), k


def test_topk_strategy_refuses_a_batch_without_topk_arrays(tok):
    learner = H.make_stock_learner(args=dppo_args(trust_region="dppo_topk_tv", topk=4), learner_cls=DPPOLearner)
    with pytest.raises(ValueError, match="needs \\[L, K\\+1\\]"):
        step(learner, H.make_transitions(tok, 8))


def test_learn_round_reports_trust_region_metrics_in_oats_train_info(tok):
    learner = H.make_stock_learner(args=dppo_args(trust_region="dppo_binary_tv"), learner_cls=DPPOLearner)
    tr = H.make_transitions(tok, 8, behavior=learner.model, logprob_offset=-0.2)
    info = H.run_learn_round(learner, tr)
    for k in ("train/kept_frac", "train/binary_tv_mean", "train/prob_diff_mean", "train/kl_k3", "train/loss",
              "train/grad_norm", "train/entropy", "train/recompute_s"):
        assert k in info and isinstance(info[k], float), k
    assert info["train/recompute_s"] == 0.0
    assert info["train/prob_diff_mean"] > 0


def test_oat_runs_write_metrics_jsonl_like_the_local_backend(tok):
    """Oat's eval_and_log calls `learner._wandb.log(row)` every step; one row per learning round lands
    in SAVE_PATH/metrics.jsonl, Oat's actor/ metrics under the local backend's rollout/ names."""
    import json
    from pathlib import Path

    from oat_dppo.backends.oat.learner import MetricsFile

    learner = H.make_stock_learner(args=dppo_args(), learner_cls=DPPOLearner)
    assert isinstance(learner._wandb, MetricsFile) and learner._wandb.inner is None
    for step, reward in [(0, 0.25), (1, 0.5), (1, 0.5), (2, 0.75)]:  # Oat logs the same round twice: one row
        learner._wandb.log({"train/loss": 1.0, "actor/reward_mean": reward, "misc/policy_sgd_step": step,
                            "eval/reward_mean": float("nan")})
    rows = [json.loads(line) for line in (Path(learner.save_path) / "metrics.jsonl").read_text().splitlines()]
    # Oat's evaluation before any update (step 0) is iteration -1, as on the local backend.
    assert [(r["iteration"], r["rollout/reward_mean"]) for r in rows] == [(-1, 0.25), (0, 0.5), (1, 0.75)]
    assert rows[1]["eval/reward_mean"] is None and "actor/reward_mean" not in rows[1]
    assert MetricsFile(Path(learner.save_path) / "metrics.jsonl").rows == 2  # a resumed run continues at 2


def test_loss_masked_rows_train_nothing(tok):
    learner = H.make_stock_learner(args=dppo_args(trust_region="pg_is", learning_rate=1.0), learner_cls=DPPOLearner)
    tr = H.make_transitions(tok, 8, behavior=learner.model)
    for t in tr:
        t.loss_mask = False
    before = params(learner)
    info = step(learner, tr)
    assert moved(before, learner) == 0.0
    assert float(info["train_tokens"]) == 0.0


def test_prepare_data_paces_iterations_through_oats_dataloader(tok):
    """`--iterations N`: Oat's prompt loop (DeepspeedStrategy.setup_dataloader, a DistributedSampler)
    yields N x update_interval batches of rollout_batch_size_per_device placeholder slots."""
    from types import SimpleNamespace

    from oat.utils.deepspeed import DeepspeedStrategy

    args = dppo_args(iterations=3, rollout_batch_size=8, rollout_batch_size_per_device=4)  # 2 steps per round
    learner = H.make_stock_learner(args=args, learner_cls=DPPOLearner)
    strategy = SimpleNamespace(seed=0)
    strategy.setup_dataloader = DeepspeedStrategy.setup_dataloader.__get__(strategy)
    with H.single_process_group():
        learner.prepare_data(strategy, tok)
        batches = list(learner.prompts_dataloader)
    assert len(batches) == 3 * 2
    processed, raw, refs = batches[0]  # as LearnerBase.run unpacks it
    assert len(processed) == len(raw) == len(refs) == 4
    assert len(learner.prompts_dataset) == 24 and len(learner.eval_prompts_dataset) == 0


def test_hf_policy_unwraps_oats_llm_and_the_deepspeed_engine(tok):
    import deepspeed
    from transformers import PreTrainedModel

    learner = H.make_stock_learner(args=dppo_args(), learner_cls=DPPOLearner)
    engine = H.engine_of(learner)
    assert isinstance(engine, deepspeed.DeepSpeedEngine)  # the real engine, prepared by Oat's strategy
    assert hf_policy(learner.model) is engine.module and isinstance(engine.module, PreTrainedModel)
    assert hf_policy(engine) is engine.module and hf_policy(engine.module) is engine.module
    assert isinstance(learner, PPOLearner)


def test_check_sync_without_a_probe_logs_no_sync_metrics(tok, monkeypatch):
    """A round with no response to probe: the sync/... keys are absent from the log row (a 0.0 would read as
    a perfect sync); with a probe, every key of `SYNC_KEYS` is there."""
    from oat.learners.base import LearnerBase

    from oat_dppo.backends.oat.learner import SYNC_KEYS

    learner = H.make_stock_learner(args=dppo_args(trust_region="dppo_binary_tv"), learner_cls=DPPOLearner)
    learner.args.check_sync = "on"
    monkeypatch.setattr(LearnerBase, "sync_params_to_actors", lambda self: None)  # Oat's broadcast: no vLLM here
    empty = H.make_transitions(tok, 2, num_samples=2)
    for t in empty:
        t.response_ids = []
    learner.pi_buffer.clear()
    learner.pi_buffer.extend(empty)
    with H.single_process_group():
        learner.sync_params_to_actors()
    assert learner._sync_info == {}

    class Actor:  # the first actor's answer to the probe: its log-probs of the response, and a weights digest
        def __init__(self, digest):
            self.digest = digest

        def sync_probe(self, prompt_ids, response_ids):
            return [0.0] * len(response_ids), self.digest

    learner.pi_buffer.clear()
    learner.pi_buffer.extend(H.make_transitions(tok, 2, num_samples=2))
    learner.actors = [Actor("a")]
    with H.single_process_group():
        learner.sync_params_to_actors()
    assert set(learner._sync_info) == set(SYNC_KEYS) and learner._sync_info["sync/probe_tokens"] > 0


def test_a_packed_chat_episode_weighs_what_its_row_costs():
    """The balance weight of an episode is the tokens of the rows `to_token_batch` computes for it: a
    `history=chat` episode of 3 turns, each prompt extending the last, is one row, as long as its last turn's
    prompt and response; summing every turn's prompt would count the opening three times. A turn whose prompt
    does not extend the last is a row of its own and adds its whole length."""
    import numpy as np

    from oat_dppo.agent.types import Turn
    from oat_dppo.backends.oat.data import episode_data, episode_tokens, to_token_batch

    def turn(prompt, response):
        return Turn(prompt_ids=prompt, response_ids=response, behavior_logprobs=np.zeros(len(response), np.float32),
                    reward=0.0, done=False, truncated=False, well_formed=True, finish_reason="stop", advantage=1.0)

    chat = [turn([1, 2, 3, 4], [5, 6]), turn([1, 2, 3, 4, 5, 6, 7], [8]), turn([1, 2, 3, 4, 5, 6, 7, 8, 9], [10, 11])]
    item = episode_data(chat)
    batch, _, rows = to_token_batch([(0, t) for t in item.turns], topk=0, pad_id=0)
    assert rows == [[0, 1, 2]] and episode_tokens(item) == int(batch.attention_mask.sum()) == 11
    apart = episode_data(chat[:2] + [turn([9, 9], [1])])  # the third turn starts a new conversation
    batch, _, rows = to_token_batch([(0, t) for t in apart.turns], topk=0, pad_id=0)
    assert rows == [[0, 1], [2]] and episode_tokens(apart) == int(batch.attention_mask.sum()) == 8 + 3
