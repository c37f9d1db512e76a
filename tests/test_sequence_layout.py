"""The learner's decoder layouts (`learner.logprobs.sequence_layout`): one forward per row at its own length
("rows", the CPU default: no padding computed) and one packed sequence with restarting positions ("packed")
against the right-padded batch ("padded"). Exactness in float32 within 1e-5: per-token log pi, pi on mu's
top-K and the entropy over random lengths (hypothesis), and the loss and its gradient for every trust region.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oat_dppo.learner import collate, policy_logprobs, trust_region_loss
from oat_dppo.learner.batch import Sample
from oat_dppo.learner.logprobs import sequence_layout
from oat_dppo.trust_region import available, make_trust_region, requirements
from test_learner import policy  # noqa: F401  (the module's tiny-qwen3 fixture)

K = 3
TOLERANCE = 1e-5
# transformers >= 4.56 confines a packed sequence's attention to each row from its position ids (masking_utils)
PACKED = ["packed"] if importlib.util.find_spec("transformers.masking_utils") else []


def samples(lengths: list[tuple[int, int]], seed: int = 0, vocab: int = 200) -> list[Sample]:
    """Rows of (prompt, response) lengths with random ids, mu and mu's top-K (slot K unused)."""
    rng = np.random.default_rng(seed)
    out = []
    for p, r in lengths:
        ids = np.tile(rng.choice(vocab, size=K + 1, replace=False), (r, 1))
        ids[:, K] = -1
        lp = np.where(ids >= 0, -1.0 - np.arange(K + 1), -np.inf).astype(np.float32)
        out.append(Sample(prompt_ids=rng.integers(1, vocab, p).tolist(), response_ids=rng.integers(1, vocab, r).tolist(),
                          behavior_logprobs=rng.uniform(-3, -0.1, r).astype(np.float32), advantage=float(rng.normal()),
                          topk_ids=ids, topk_logprobs=lp))
    return out


def test_the_cpu_default_is_one_forward_per_row_and_zero3_keeps_the_padded_batch(policy):
    model, _ = policy
    assert sequence_layout(model) == "rows"
    partitioned = torch.nn.Linear(2, 2)
    partitioned.weight.ds_numel = 4  # what DeepSpeed ZeRO-3 sets on a partitioned parameter
    assert sequence_layout(partitioned) == "padded"


@settings(max_examples=12, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 24), st.integers(0, 6)), min_size=1, max_size=5), st.integers(0, 2**16))
def test_every_layout_gives_the_padded_log_probs(policy, lengths, seed):
    model, _ = policy
    model.eval()
    batch = collate(samples(lengths, seed), 0, K)
    with torch.no_grad():
        ref = policy_logprobs(model, batch, with_topk=True, layout="padded")
        for layout in ["rows", *PACKED]:
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


@pytest.mark.parametrize("name", available())
def test_loss_and_gradient_equal_the_padded_path_for_every_trust_region(policy, name):
    model, _ = policy
    model.train()
    tr = make_trust_region(name, **({"topk": K} if requirements(make_trust_region(name)).topk else {}))
    batch = collate(samples([(12, 4), (3, 6), (20, 1), (7, 3)], seed=1), 0, requirements(tr).topk)
    loss_ref, grads_ref = _loss_and_grads(model, batch, tr, "padded")
    for layout in ["rows", *PACKED]:
        loss, grads = _loss_and_grads(model, batch, tr, layout)
        assert loss == pytest.approx(loss_ref, abs=TOLERANCE), layout
        assert grads.keys() == grads_ref.keys()
        assert max(float((grads[n] - grads_ref[n]).abs().max()) for n in grads) < TOLERANCE, layout
