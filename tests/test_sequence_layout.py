"""The learner's decoder layouts (`learner.logprobs.sequence_layout`): the rows' common prefix computed once
("prefix", the CPU default), one forward per row at its own length ("rows": no padding computed) and one packed
sequence with restarting positions ("packed") against the right-padded batch ("padded"). Exactness in float32 within 1e-5: per-token log pi, pi on mu's
top-K and the entropy over random lengths (hypothesis), and the loss and its gradient for every trust region.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oat_dppo.learner import collate, policy_logprobs, trust_region_loss
from oat_dppo.learner.batch import Sample
from oat_dppo.learner.logprobs import MIN_SHARED_PREFIX, prefix_plan, sequence_layout
from oat_dppo.models.prefix import PrefixPlan
from oat_dppo.trust_region import available, make_trust_region, requirements
from test_learner import policy  # noqa: F401  (the module's tiny-qwen3 fixture)

K = 3
TOLERANCE = 1e-5


def samples(lengths: list[tuple[int, int]], seed: int = 0, vocab: int = 200, shared: int = 0) -> list[Sample]:
    """Rows of (prompt, response) lengths with random ids, mu and mu's top-K (slot K unused); the first `shared`
    prompt tokens the same in every row (a group's prompt, a game's instructions)."""
    rng = np.random.default_rng(seed)
    head = rng.integers(1, vocab, shared).tolist()
    out = []
    for p, r in lengths:
        ids = np.tile(rng.choice(vocab, size=K + 1, replace=False), (r, 1))
        ids[:, K] = -1
        lp = np.where(ids >= 0, -1.0 - np.arange(K + 1), -np.inf).astype(np.float32)
        out.append(Sample(prompt_ids=head + rng.integers(1, vocab, p).tolist(), response_ids=rng.integers(1, vocab, r).tolist(),
                          behavior_logprobs=rng.uniform(-3, -0.1, r).astype(np.float32), advantage=float(rng.normal()),
                          topk_ids=ids, topk_logprobs=lp))
    return out


def test_the_cpu_default_shares_prefixes_and_zero3_and_zero2_ranks_keep_the_padded_batch(policy):
    model, _ = policy
    assert sequence_layout(model) == "prefix"
    assert sequence_layout(model, reduced_during_backward=True) == "padded"
    partitioned = torch.nn.Linear(2, 2)
    partitioned.weight.ds_numel = 4  # what DeepSpeed ZeRO-3 sets on a partitioned parameter
    assert sequence_layout(partitioned) == "padded"


def test_the_prefix_layout_completes_the_gradients_in_another_order(policy):
    """Why ranks that reduce during the backward (ZeRO-2) keep the padded grid: DeepSpeed fills its buckets in the
    order the parameters' gradients complete, and the prefix layout's two decoder calls complete them in another
    order than one call; "rows" (a call per row) keeps the padded grid's order."""
    model, _ = policy
    model.train()
    names = {p: n for n, p in model.named_parameters()}
    order: list[str] = []
    hooks = [p.register_post_accumulate_grad_hook(lambda p: order.append(names[p])) for p in model.parameters()]
    tr = make_trust_region("dppo_binary_tv")
    batch = collate(samples([(5, 2), (3, 1), (8, 3)], shared=20), 0)
    try:
        orders = {}
        for layout in ["padded", "rows", "prefix"]:
            order.clear()
            _loss_and_grads(model, batch, tr, layout)
            orders[layout] = list(order)
    finally:
        for h in hooks:
            h.remove()
    assert sorted(orders["prefix"]) == sorted(orders["padded"]) == sorted(names.values())
    assert orders["rows"] == orders["padded"]
    assert orders["prefix"] != orders["padded"]


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 24), st.integers(0, 6)), min_size=1, max_size=5), st.integers(0, 2**16),
       st.sampled_from([0, 20]))
def test_every_layout_gives_the_padded_log_probs(policy, lengths, seed, shared):
    model, _ = policy
    model.eval()
    batch = collate(samples(lengths, seed, shared=shared), 0, K)
    with torch.no_grad():
        ref = policy_logprobs(model, batch, with_topk=True, layout="padded")
        for layout in ["rows", "prefix", "packed"]:
            got = policy_logprobs(model, batch, with_topk=True, layout=layout)
            resp = batch.response_mask
            assert torch.allclose(got.logp, ref.logp, atol=TOLERANCE), layout
            assert torch.allclose(got.entropy, ref.entropy, atol=TOLERANCE), layout
            assert torch.allclose(got.topk_logp[resp], ref.topk_logp[resp], atol=TOLERANCE), layout


def test_rows_without_a_response_are_not_computed(policy):
    model, _ = policy
    calls = []
    hook = model.get_decoder().register_forward_hook(lambda m, a, kw, out: calls.append(kw["input_ids"].shape),
                                                     with_kwargs=True)
    try:
        batch = collate(samples([(5, 2), (9, 0), (3, 1)]), 0)
        policy_logprobs(model, batch, layout="rows")
    finally:
        hook.remove()
    assert calls == [torch.Size([1, 7]), torch.Size([1, 4])]  # rows 0 and 2, each at its own length


def _loss_and_grads(model, batch, tr, layout):
    model.zero_grad(set_to_none=True)
    loss, _ = trust_region_loss(model, batch, tr, aggregation="seq_mean_token_mean", num_tokens=float(batch.num_tokens),
                                num_sequences=float(batch.num_rows), layout=layout)
    loss.backward()
    return float(loss), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def two_groups() -> list[Sample]:
    """Two groups' rows interleaved (GRPO's samples of two prompts), sharing 20 and 30 leading tokens within a group
    and nothing across, and a row of its own: two clusters and a row computed whole."""
    a = samples([(12, 4), (3, 6), (5, 0)], seed=1, shared=20)
    b = samples([(2, 3), (9, 1)], seed=2, shared=30)
    return [a[0], b[0], a[1], samples([(20, 1)], seed=3)[0], b[1], a[2]]


@pytest.mark.parametrize("name", available())
def test_loss_and_gradient_equal_the_padded_path_for_every_trust_region(policy, name):
    model, _ = policy
    model.train()
    tr = make_trust_region(name, **({"topk": K} if requirements(make_trust_region(name)).topk else {}))
    batch = collate(two_groups(), 0, requirements(tr).topk)
    loss_ref, grads_ref = _loss_and_grads(model, batch, tr, "padded")
    for layout in ["rows", "prefix", "packed"]:
        loss, grads = _loss_and_grads(model, batch, tr, layout)
        assert loss == pytest.approx(loss_ref, abs=TOLERANCE), layout
        assert grads.keys() == grads_ref.keys()
        assert max(float((grads[n] - grads_ref[n]).abs().max()) for n in grads) < TOLERANCE, layout


def test_a_shared_prefix_is_computed_once(policy):
    """Three rows with a response share 20 prompt tokens: one forward of them, then the three rests in one batch
    (the row without a response is not computed); short rows sharing too little run as the padded grid."""
    model, _ = policy
    calls = []
    hook = model.get_decoder().register_forward_hook(lambda m, a, kw, out: calls.append(kw["input_ids"].shape),
                                                     with_kwargs=True)
    try:
        with torch.no_grad():
            policy_logprobs(model, collate(samples([(5, 2), (9, 0), (3, 1), (8, 3)], shared=20), 0), layout="prefix")
            shared = list(calls)
            calls.clear()
            policy_logprobs(model, collate(samples([(5, 2), (3, 1)], shared=MIN_SHARED_PREFIX - 1), 0), layout="prefix")
    finally:
        hook.remove()
    assert shared == [torch.Size([1, 20]), torch.Size([3, 8 + 3])]  # the prefix, then rests up to 8 + 3 tokens
    assert calls == [torch.Size([2, MIN_SHARED_PREFIX - 1 + 5 + 2])]  # short rows, little padding: the padded grid


def test_each_group_computes_its_prefix_once(policy):
    """The two groups' prefixes run as one batch of two (padded to 30), then the five rests with a response (the
    row of its own whole: 21 tokens) in one batch; the log-probs equal the padded grid's."""
    model, _ = policy
    batch = collate(two_groups(), 0, K)
    calls = []
    hook = model.get_decoder().register_forward_hook(lambda m, a, kw, out: calls.append(kw["input_ids"].shape),
                                                     with_kwargs=True)
    try:
        with torch.no_grad():
            got = policy_logprobs(model, batch, with_topk=True, layout="prefix")
    finally:
        hook.remove()
    assert calls == [torch.Size([2, 30]), torch.Size([5, 21])]
    assert got.computed_tokens == 2 * 30 + 5 * 21
    ref = policy_logprobs(model, batch, with_topk=True, layout="padded")
    assert torch.allclose(got.logp, ref.logp, atol=TOLERANCE)
    assert torch.allclose(got.topk_logp[batch.response_mask], ref.topk_logp[batch.response_mask], atol=TOLERANCE)


def test_the_shared_prefix_stops_before_the_first_predicted_token():
    def shared(ids, attn, t_idx):  # the one cluster's prefix length
        b_idx = torch.arange(len(ids))
        plan = prefix_plan(ids, attn, b_idx, t_idx)
        return plan.lengths[0] if plan.lengths else 0

    head = list(range(1, 20))  # 19 shared tokens, then rows that differ
    ids = torch.tensor([head + [4, 5], head + [4, 6], head + [4, 0]])
    attn = torch.ones_like(ids, dtype=torch.bool)
    attn[2, -1] = False
    assert shared(ids, attn, torch.tensor([21, 21, 18])) == 17  # position 17 predicts row 2's token 18
    assert shared(ids, attn, torch.tensor([21, 21, 20])) == 19
    assert shared(ids, attn, torch.tensor([21, 21, 21])) == 20  # row 2's real tokens end at 20
    assert shared(ids[:2], attn[:2], torch.tensor([21, 21])) == 20
    # row 2 could share only 14 < MIN_SHARED_PREFIX tokens: rows 0 and 1 would share 20 and row 2 run whole, 20 + 3 x 20
    # positions against the padded grid's 3 x 21: no cluster (models.prefix.MAX_GRID_SHARE)
    assert prefix_plan(ids, attn, torch.arange(3), torch.tensor([21, 21, 15])) == PrefixPlan((-1, -1, -1), ())


def test_each_layout_reports_the_tokens_its_decoder_computed(policy):
    """Rows of 20 shared + (5, 9, 3, 8) prompt tokens and (2, 0, 1, 3) response tokens: the padded grid computes
    4 x 31, "rows" the three rows with a response (27 + 24 + 31), "prefix" the 20 shared tokens once and the three
    rests padded to 11; `trust_region_loss` reports the ratio to the trained tokens."""
    model, _ = policy
    batch = collate(samples([(5, 2), (9, 0), (3, 1), (8, 3)], shared=20), 0)
    with torch.no_grad():
        computed = {layout: policy_logprobs(model, batch, layout=layout).computed_tokens
                    for layout in ["padded", "rows", "prefix"]}
        _, metrics = trust_region_loss(model, batch, make_trust_region("dppo_binary_tv"), layout="prefix")
    assert computed == {"padded": 4 * 31, "rows": 27 + 24 + 31, "prefix": 20 + 3 * 11}
    assert metrics["decoder_tokens_per_token"] == pytest.approx((20 + 3 * 11) / 6)


def test_without_a_shared_prefix_only_long_padded_rows_run_one_by_one():
    from oat_dppo.learner.logprobs import _rows_pay

    def grid(lengths):
        T = max(lengths)
        return torch.tensor([[True] * n + [False] * (T - n) for n in lengths])

    assert _rows_pay(grid([180, 380, 250, 300]))  # long, 29% padding: a forward per row (0.69x measured)
    assert not _rows_pay(grid([40, 49, 45, 49]))  # short (the peers job): the padded grid
    assert not _rows_pay(grid([300, 310, 305, 300]))  # long but nearly unpadded: the padded grid
