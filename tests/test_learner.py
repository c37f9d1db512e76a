"""The learner: batch alignment, log-probs at response tokens, accumulation, forward counts."""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers.sharp_tails import issue_11_case

from oat_dppo.agent import Turn
from oat_dppo.engine.hf import HFEngine
from oat_dppo.learner import Learner, LearnerConfig, TokenBatch, collate, policy_logprobs, trust_region_loss
from oat_dppo.learner.timing import PIECES
from oat_dppo.models import load_policy
from oat_dppo.trust_region import make_trust_region


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return load_policy("tiny-qwen3", seed=0)


def sampled_turns(policy, n=4, new_tokens=6, topk=0, seed=0) -> list[Turn]:
    """Real turns: prompts of different lengths, responses and mu sampled by the HF engine."""
    model, tok = policy
    engine = HFEngine(model, tok)
    rng = random.Random(seed)
    prompts = [tok(f"prompt {i} " + "x" * rng.randint(1, 12), add_special_tokens=False)["input_ids"] for i in range(n)]
    gens = engine.generate(prompts, new_tokens, topk, seed=seed)
    return [
        Turn(prompt_ids=p, response_ids=g.response_ids, behavior_logprobs=g.logprobs, reward=0.0, done=True,
             truncated=False, well_formed=True, finish_reason=g.finish_reason, topk_ids=g.topk_ids,
             topk_logprobs=g.topk_logprobs, advantage=rng.choice([-1.0, 1.0]))
        for p, g in zip(prompts, gens)
    ]


def test_collate_aligns_tokens_and_behavior_logprobs(policy):
    turns = sampled_turns(policy, topk=3)
    batch = collate(turns, pad_id=0, topk=3)
    for b, t in enumerate(turns):
        p, r = len(t.prompt_ids), len(t.response_ids)
        assert batch.input_ids[b, p : p + r].tolist() == t.response_ids
        assert batch.response_mask[b].nonzero()[:, 0].tolist() == list(range(p, p + r))
        assert torch.allclose(batch.behavior_logp[b, p : p + r], torch.from_numpy(t.behavior_logprobs))
        assert not batch.attention_mask[b, p + r :].any()
        assert (batch.topk_valid[b, p : p + r, :3]).all()
    assert batch.num_tokens == sum(len(t.response_ids) for t in turns)


def test_policy_logprobs_equal_mu_and_the_full_forward(policy):
    model, _ = policy
    turns = sampled_turns(policy, topk=4)
    batch = collate(turns, pad_id=0, topk=4)
    out = policy_logprobs(model, batch, with_topk=True)
    m = batch.response_mask
    # The engine's mu (KV-cached generate) is the learner's pi before any update.
    assert torch.allclose(out.logp[m], batch.behavior_logp[m], atol=1e-5)
    assert torch.allclose(out.topk_logp[m][batch.topk_valid[m]], batch.topk_behavior_logp[m][batch.topk_valid[m]], atol=1e-5)
    # And equals the plain full-logits path.
    with torch.no_grad():
        full = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits.float().log_softmax(-1)
    b, t = m.nonzero(as_tuple=True)
    ref = full[b, t - 1].gather(-1, batch.input_ids[b, t][:, None])[:, 0]
    assert torch.allclose(out.logp[b, t], ref, atol=1e-5)
    assert (out.entropy[m] > 0).all()
    # pi's mass outside the valid slots: log-sum-exp over the other ids (unused slots hold id 0, which
    # may also be a valid slot or a token outside the set).
    outside = torch.ones_like(full[b, t - 1], dtype=torch.bool)  # [N, V]
    for n, (ids, ok) in enumerate(zip(batch.topk_ids[b, t], batch.topk_valid[b, t])):
        outside[n, ids[ok]] = False
    assert torch.allclose(out.topk_other_logp[b, t], full[b, t - 1].masked_fill(~outside, -torch.inf).logsumexp(-1),
                          atol=1e-5)


def _grads_after_one_step(policy, turns, micro: int, chunk: int = 0, strategy: str = "dppo_binary_tv",
                          frozen_head: bool = False, **params):
    model = copy.deepcopy(policy[0])
    if frozen_head:  # as with LoRA or --trainable-layers: the (tied) LM head gets no gradient
        model.get_output_embeddings().weight.requires_grad_(False)
    tr = make_trust_region(strategy, **params)
    learner = Learner(model, tr, LearnerConfig(learning_rate=1e-3, mini_batch_size=len(turns), micro_batch_size=micro,
                                               max_grad_norm=0.0, logits_chunk_tokens=chunk), pad_id=0)
    # Capture the accumulated gradient right before the optimizer step.
    captured = {}
    step = learner.optimizer.step

    def capture(*a, **k):
        captured.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        return step(*a, **k)

    learner.optimizer.step = capture
    learner.update(turns, random.Random(0))
    return captured


def test_gradient_accumulation_equals_one_big_batch(policy):
    turns = sampled_turns(policy, n=4)
    one = _grads_after_one_step(policy, turns, micro=4)
    acc = _grads_after_one_step(policy, turns, micro=1)
    assert one.keys() == acc.keys()
    for k in one:
        assert torch.allclose(one[k], acc[k], atol=1e-6, rtol=1e-4), k


@pytest.mark.parametrize("chunk, frozen_head", [(1, False), (5, False), (16, False), (5, True)])
def test_chunked_head_gives_the_same_logprobs_and_gradients(policy, chunk, frozen_head):
    """Checkpointed LM-head blocks change memory, not math: log pi, pi on mu's top-K, entropy and the
    accumulated gradient of a top-K strategy equal the one-block computation (also with a frozen head)."""
    model, _ = policy
    turns = sampled_turns(policy, n=4, topk=3)
    batch = collate(turns, pad_id=0, topk=3)
    assert batch.num_tokens > 16  # every chunk size above splits the batch
    whole = policy_logprobs(model, batch, with_topk=True)
    split = policy_logprobs(model, batch, with_topk=True, chunk_tokens=chunk)
    for a, b in [(whole.logp, split.logp), (whole.topk_logp, split.topk_logp), (whole.entropy, split.entropy),
                 (whole.topk_other_logp, split.topk_other_logp)]:
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    one = _grads_after_one_step(policy, turns, micro=2, strategy="dppo_topk_kl", topk=3, frozen_head=frozen_head)
    chunked = _grads_after_one_step(policy, turns, micro=2, chunk=chunk, strategy="dppo_topk_kl", topk=3,
                                    frozen_head=frozen_head)
    assert one.keys() == chunked.keys() and one
    assert ("model.embed_tokens.weight" in one) != frozen_head
    for k in one:
        torch.testing.assert_close(one[k], chunked[k], rtol=1e-5, atol=1e-6)  # float32 summation order


class FixedLogits(torch.nn.Module):
    """A model whose next-token logits are `logits` [V] at every position, or [T, V] per position (no
    decoder / head split)."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = torch.nn.Parameter(logits.clone())

    def get_output_embeddings(self):
        return None

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        logits = self.logits if self.logits.dim() == 1 else self.logits[: input_ids.shape[1]]
        return SimpleNamespace(logits=logits.expand(*input_ids.shape, -1))


def test_entropy_is_float32_accurate_at_a_real_vocabulary_size():
    """The logged entropy sums p log p over V = 49,152 (SmolLM2's vocabulary) per position. It equals
    the float64 sum to a relative 3e-5 (measured 1.1e-5 on an AVX2 CPU, under 1e-5 on AVX-512: float32's
    log-softmax rounds differently with the vector width); a one-dot-product reduction (einsum) was off by
    up to 1e-4."""
    torch.manual_seed(0)
    T, V = 65, 49152
    logits = torch.randn(T, V) * torch.linspace(0.5, 6.0, T)[:, None]  # flat to sharp rows
    batch = TokenBatch(input_ids=torch.randint(V, (1, T)), attention_mask=torch.ones(1, T, dtype=torch.bool),
                       response_mask=torch.arange(T)[None] > 0, behavior_logp=torch.zeros(1, T),
                       advantages=torch.ones(1, 1))
    entropy = policy_logprobs(FixedLogits(logits), batch).entropy[0, 1:]  # [T - 1], position t reads logits[t - 1]
    lp = logits[:-1].double().log_softmax(-1)
    torch.testing.assert_close(entropy.double(), -(lp.exp() * lp).sum(-1), rtol=3e-5, atol=0)


@pytest.mark.parametrize("pi_tail", [1e-9, 1e-7, 1e-6])
def test_topk_kl_of_a_sharp_pi_is_exact_through_the_learner(pi_tail):
    """Issue 11 through the learner: mu keeps 1e-3 outside its top-20, the learner's float32 pi keeps
    1e-9..1e-6 there. The project reported 0.0611 (pi's "other" read as 0, floored at 1e-30) and
    dppo_topk_kl at delta 0.05 masked the sampled token (mu(a) = 0.05, pi(a) = 0.05005, A > 0); the
    exact top-K KL is 0.013 / 0.008 / 0.006. The learner now passes pi's other mass from its full row."""
    case = issue_11_case(pi_tail)
    K = case.ids.numel()
    slots = torch.zeros(1, 2, K + 1, dtype=torch.long)  # position 1 is the response token; slot K unused (id 0)
    slots[0, 1, :K] = case.ids
    topk_mu = torch.full((1, 2, K + 1), -torch.inf)
    topk_mu[0, 1, :K] = case.lmu[case.ids].float()
    valid = torch.zeros(1, 2, K + 1, dtype=torch.bool)
    valid[0, 1, :K] = True
    batch = TokenBatch(input_ids=torch.tensor([[7, case.a]]), attention_mask=torch.ones(1, 2, dtype=torch.bool),
                       response_mask=torch.tensor([[False, True]]),
                       behavior_logp=torch.tensor([[0.0, float(case.lmu[case.a])]]), advantages=torch.tensor([[1.0]]),
                       topk_ids=slots, topk_behavior_logp=topk_mu, topk_valid=valid)
    loss, metrics = trust_region_loss(FixedLogits(case.logits), batch, make_trust_region("dppo_topk_kl"))  # delta 0.05
    assert metrics["ratio_mean"] == pytest.approx(1.001, rel=1e-5)  # r > 1 and A > 0: D > delta would mask
    assert metrics["divergence_mean"] == pytest.approx(case.exact, abs=1e-5)
    assert metrics["kept_frac"] == 1.0
    loss.backward()


def _largest_saved_head_block(model, batch, chunk: int) -> int:
    """Rows of the largest [rows, V] tensor autograd keeps for backward in one training forward."""
    V = model.config.vocab_size
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}  # the head's W^T is [H, V]
    rows = [0]

    def pack(t):
        if t.dim() == 2 and t.shape[-1] == V and t.untyped_storage().data_ptr() not in weights:
            rows.append(t.shape[0])
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        policy_logprobs(model, batch, chunk_tokens=chunk).logp.sum().backward()
    model.zero_grad()
    return max(rows)


def test_chunked_head_keeps_no_full_logits_for_backward(policy):
    model, _ = policy
    batch = collate(sampled_turns(policy, n=4), pad_id=0)
    # One block keeps [N, V] logits (and log-softmax) until backward ...
    assert _largest_saved_head_block(model, batch, chunk=0) == batch.num_tokens
    # ... checkpointed blocks keep none: each is recomputed, one at a time, in backward.
    assert _largest_saved_head_block(model, batch, chunk=4) == 0


class ForwardCounter:
    """Counts the rows the policy's decoder computed, with a real hook, split by whether gradients were on (rows,
    not calls: the same count whether a micro-batch runs as one padded call or a call per row)."""

    def __init__(self, model):
        self.grad = self.no_grad = 0
        self.handle = model.get_decoder().register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output):
        rows = kwargs["input_ids"].shape[0]
        if torch.is_grad_enabled():
            self.grad += rows
        else:
            self.no_grad += rows


@pytest.mark.parametrize("name, params, recompute", [
    ("dppo_binary_tv", {}, False),
    ("ppo_clip", {}, False),
    ("dppo_topk_kl", {"topk": 3}, False),
    ("ppo_clip", {"anchor": "recompute"}, True),
    ("dppo_binary_kl", {"anchor": "recompute"}, True),
])
def test_behavior_anchored_strategies_never_recompute(policy, name, params, recompute):
    turns = sampled_turns(policy, n=4, topk=3)
    model = copy.deepcopy(policy[0])
    forwards = ForwardCounter(model)
    learner = Learner(model, make_trust_region(name, **params),
                      LearnerConfig(mini_batch_size=2, micro_batch_size=1, num_ppo_epochs=2), pad_id=0)
    metrics = learner.update(turns, random.Random(0))
    assert forwards.grad == 2 * 4  # epochs x micro-batches of one turn, nothing else
    assert forwards.no_grad == (4 if recompute else 0)  # pi_old: one no-grad pass over the 4 turns
    assert metrics["optimizer_steps"] == 4
    assert (metrics["recompute_s"] > 0) == recompute


def test_the_timing_hook_sees_every_piece_and_changes_nothing(policy):
    """`on_timing` gets each piece of the update (what benchmarks/local.py reads instead of patching the
    learner); the weights after the update are those of a learner without the hook."""
    turns = sampled_turns(policy, n=4)
    cfg = LearnerConfig(learning_rate=1e-3, mini_batch_size=2, micro_batch_size=1)
    seen: list[tuple[str, float]] = []
    timed = Learner(copy.deepcopy(policy[0]), make_trust_region("ppo_clip", anchor="recompute"), cfg, pad_id=0,
                    on_timing=lambda name, s: seen.append((name, s)))
    plain = Learner(copy.deepcopy(policy[0]), make_trust_region("ppo_clip", anchor="recompute"), cfg, pad_id=0)
    timed.update(turns, random.Random(0))
    plain.update(turns, random.Random(0))
    names = [n for n, _ in seen]
    assert set(names) == set(PIECES) and all(s >= 0 for _, s in seen)
    # 4 micro-batches: each collated, forwarded, through the trust region and backward; 2 optimizer steps;
    # plus the batch's collate and pi_old's forward
    assert [names.count(n) for n in PIECES] == [5, 5, 4, 4, 2]
    for a, b in zip(timed.model.parameters(), plain.model.parameters()):
        assert torch.equal(a, b)
    batch, plan = timed.prepare(turns, random.Random(0))  # the plan update ran with this seed
    assert batch.num_rows == 4 and [len(step) for step in plan] == [2, 2]


def test_a_micro_batch_holds_one_groups_samples(policy):
    """Four groups of two samples of one prompt each, shuffled: the local learner's plan (CPU: the prefix layout)
    sorts a step's rows by their tokens, so each micro-batch of two holds one group and its prompt is computed
    once (`train/decoder_tokens_per_token` below the padded grid's)."""
    model, tok = policy
    prompts = [tok(f"question {i}: " + "what is two plus two, answered in one word? " * 2, add_special_tokens=False)["input_ids"]
               for i in range(4)]
    turns = [Turn(prompt_ids=p, response_ids=[5 + k, 7], behavior_logprobs=np.zeros(2, np.float32), reward=0.0,
                  done=True, truncated=False, well_formed=True, finish_reason="stop", advantage=1.0 - 2 * k)
             for p in prompts for k in range(2)]
    learner = Learner(copy.deepcopy(model), make_trust_region("pg_is"),
                      LearnerConfig(learning_rate=1e-3, mini_batch_size=8, micro_batch_size=2), pad_id=0)
    batch, plan = learner.prepare(turns, random.Random(0))
    groups = [{tuple(batch.input_ids[r, : len(prompts[0])].tolist()) for r in micro} for step in plan for micro in step]
    assert len(groups) == 4 and all(len(g) == 1 for g in groups)
    metrics = learner.update(turns, random.Random(0))
    assert metrics["decoder_tokens_per_token"] < (len(prompts[0]) + 2) / 2 * 0.6


def test_first_update_is_on_policy_and_later_ones_move_pi(policy):
    turns = sampled_turns(policy, n=4)
    learner = Learner(copy.deepcopy(policy[0]), make_trust_region("pg_is"),
                      LearnerConfig(learning_rate=5e-3, mini_batch_size=4, micro_batch_size=4), pad_id=0)
    first = learner.update(turns, random.Random(0))
    # One optimizer step on fresh rollouts: the engine's mu is the learner's pi (ratio 1, no mismatch).
    assert first["optimizer_steps"] == 1
    assert abs(first["ratio_min"] - 1) < 1e-5 and abs(first["ratio_max"] - 1) < 1e-5
    assert first["prob_diff_max"] < 1e-5
    # The same turns again: pi has moved away from the recorded mu.
    second = learner.update(turns, random.Random(1))
    assert second["prob_diff_max"] > 1e-3
    assert np.isfinite(second["loss"]) and np.isfinite(second["grad_norm"])


def test_mismatch_is_measured_before_the_first_step_and_drift_is_not(policy):
    """`mismatch_*` is |pi - mu| while pi is still pi_old (the first optimizer step's tokens); the later
    steps' drift shows only in `prob_diff_*`. With mu = pi (fresh rollouts) the mismatch is ~0 however
    far the update moves pi."""
    turns = sampled_turns(policy, n=8)
    learner = Learner(copy.deepcopy(policy[0]), make_trust_region("pg_is"),
                      LearnerConfig(learning_rate=5e-2, mini_batch_size=2, micro_batch_size=2), pad_id=0)
    m = learner.update(turns, random.Random(0))
    assert m["optimizer_steps"] == 4
    assert m["mismatch_max"] < 1e-5 < m["prob_diff_max"]
    # A real mismatch (mu recorded off by 0.3 nats) is measured as such, before any step.
    for t in turns:
        t.behavior_logprobs = t.behavior_logprobs - 0.3
    fresh = Learner(copy.deepcopy(policy[0]), make_trust_region("pg_is"),
                    LearnerConfig(learning_rate=5e-2, mini_batch_size=2, micro_batch_size=2), pad_id=0)
    shifted = fresh.update(turns, random.Random(0))
    assert shifted["mismatch_mean"] > 1e-3 and shifted["mismatch_max"] <= shifted["prob_diff_max"]


def test_a_shifted_mu_shows_in_the_ratio(policy):
    """The check above has teeth: mu recorded 0.3 nats too low is a ratio pi/mu of e^0.3."""
    turns = sampled_turns(policy, n=4)
    for t in turns:
        t.behavior_logprobs = t.behavior_logprobs - 0.3
    learner = Learner(copy.deepcopy(policy[0]), make_trust_region("pg_is"),
                      LearnerConfig(learning_rate=5e-3, mini_batch_size=4, micro_batch_size=4), pad_id=0)
    m = learner.update(turns, random.Random(0))
    assert m["ratio_min"] == pytest.approx(np.exp(0.3), rel=1e-4) and m["prob_diff_max"] > 1e-3


def test_learner_rejects_a_frozen_model(policy):
    model = copy.deepcopy(policy[0])
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        Learner(model, make_trust_region("pg_is"), LearnerConfig(), pad_id=0)


def test_mu_source_recompute_uses_pi_old_as_mu(policy):
    # With mu taken from a recomputed pi_old, the first step sees r = 1 exactly even when the
    # recorded mu is wrong; with mu from the rollout, the wrong mu shows up as mismatch.
    turns = sampled_turns(policy, n=4)
    for t in turns:
        t.behavior_logprobs = t.behavior_logprobs - 0.5  # a deliberately off engine
    cfg = dict(learning_rate=1e-9, mini_batch_size=4, micro_batch_size=4)
    rollout_model, recompute_model = copy.deepcopy(policy[0]), copy.deepcopy(policy[0])
    rollout = Learner(rollout_model, make_trust_region("pg_is"), LearnerConfig(**cfg), pad_id=0)
    recompute = Learner(recompute_model, make_trust_region("pg_is"), LearnerConfig(**cfg, mu_source="recompute"), pad_id=0)
    counts = ForwardCounter(rollout_model), ForwardCounter(recompute_model)
    m_roll = rollout.update(turns, random.Random(0))
    m_rec = recompute.update(turns, random.Random(0))
    assert m_roll["ratio_mean"] == pytest.approx(np.exp(0.5), rel=1e-4)
    assert m_rec["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert (counts[0].no_grad, counts[1].no_grad) == (0, 4) and counts[0].grad == counts[1].grad == 4  # 4 turns


def test_template_end_of_turn_tokens_stop_generation(policy):
    # tiny-llama's tokenizer ends documents with its eos; under the chatml template the turn ends at
    # <|im_end|>, which must stop the engine too (a base model would otherwise run on).
    from oat_dppo.agent import PromptFormat

    model, tok = load_policy("tiny-llama", seed=0)
    fmt = PromptFormat(tok, "chatml")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert fmt.stop_token_ids() == [im_end]
    engine = HFEngine(model, tok, extra_stop_token_ids=fmt.stop_token_ids())
    assert im_end in engine.stop_ids and tok.eos_token_id in engine.stop_ids
    assert PromptFormat(tok, "none").stop_token_ids() == []


@pytest.mark.parametrize("name, params", [("ipo", {}), ("icepop", {}), ("kpop", {}), ("tis", {}),
                                          ("tis", {"level": "sequence"}), ("mis", {}), ("mis", {"level": "geometric"}),
                                          ("trm", {}), ("trm", {"reduce": "mean"})])
def test_peer_strategies_train_through_the_learner(policy, name, params):
    """Each peer mask (oat_dppo/trust_region/framework_masks.py) in the local learner: two epochs over sampled
    turns, the weights move, every metric finite, and the second epoch (pi moved off mu) is where a
    mask can act."""
    turns = sampled_turns(policy, n=4)
    model = copy.deepcopy(policy[0])
    before = [p.detach().clone() for p in model.parameters()]
    learner = Learner(model, make_trust_region(name, **params),
                      LearnerConfig(learning_rate=5e-2, mini_batch_size=2, micro_batch_size=2, num_ppo_epochs=2), pad_id=0)
    metrics = learner.update(turns, random.Random(0))
    assert metrics["optimizer_steps"] == 4
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    for k in ("loss", "grad_norm", "kept_frac", "ratio_max"):
        assert np.isfinite(metrics[k]), k


def test_turns_in_loss_counts_what_the_loss_computed_and_a_dropped_turn_is_missing(policy):
    """`turns_in_loss` is counted where the loss is computed: every turn sent is there, and a turn the learner
    drops (its tokens masked out of the loss, as an untrained turn's are) is not, though it was sent."""
    from oat_dppo.learner.loop import run_update
    from oat_dppo.learner.learner import _TorchOptimizerHooks

    turns = sampled_turns(policy, n=5)
    learner = Learner(copy.deepcopy(policy[0]), make_trust_region("dppo_binary_tv"),
                      LearnerConfig(learning_rate=1e-4, mini_batch_size=2, micro_batch_size=1), pad_id=0)
    assert learner.update(turns, random.Random(0))["turns_in_loss"] == 5.0
    batch, plan = learner.prepare(turns, random.Random(0))
    batch.response_mask[3] = False  # the learner-side drop
    out = run_update(learner.model, batch, plan, learner.trust_region,
                     _TorchOptimizerHooks(learner.optimizer, 1.0), device="cpu")
    assert out["turns_in_loss"] == 4.0 and len(turns) == 5
