"""Property tests (hypothesis) of the trust-region math on random distributions."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oat_dppo.trust_region import (
    TrustRegionInputs,
    binary_kl,
    binary_tv,
    full_kl,
    full_tv,
    make_trust_region,
    topk_kl,
    topk_tv,
)

TOL = 2e-5


def test_hypothesis_profile_is_the_one_conftest_loaded():
    """Every test module is imported by now: none replaced the profile (CI: fixed examples), and no
    property test runs under a per-example deadline."""
    assert settings.default.deadline is None and HealthCheck.too_slow in settings.default.suppress_health_check
    assert settings.default.derandomize == (os.environ.get("HYPOTHESIS_PROFILE") == "ci")


@st.composite
def distribution_pair(draw, min_vocab=2, max_vocab=40):
    """log mu, log pi over a vocabulary of V (long-tailed: logits with a wide spread), a sampled token."""
    V = draw(st.integers(min_vocab, max_vocab))
    seed = draw(st.integers(0, 2**31 - 1))
    spread = draw(st.floats(0.5, 6.0))
    shift = draw(st.floats(0.0, 3.0))
    g = torch.Generator().manual_seed(seed)
    logits_mu = torch.randn(V, generator=g, dtype=torch.float64) * spread
    logits_pi = logits_mu + torch.randn(V, generator=g, dtype=torch.float64) * shift
    lmu = torch.log_softmax(logits_mu, -1)
    lpi = torch.log_softmax(logits_pi, -1)
    a = draw(st.integers(0, V - 1))
    return lmu, lpi, a


def topk_slots(lmu: torch.Tensor, lpi: torch.Tensor, a: int, K: int):
    """[S] slots of TopK(mu, K) ∪ {a}: K top ids plus a in an extra slot when outside the top-K."""
    K = min(K, lmu.numel())
    top = torch.topk(lmu, K).indices.tolist()
    ids = top + ([a] if a not in top else [])
    valid = [True] * len(ids)
    while len(ids) < K + 1:  # pad to S = K + 1 slots
        ids.append(0)
        valid.append(False)
    idx = torch.tensor(ids)
    return lmu[idx].float(), lpi[idx].float(), torch.tensor(valid)


def other_logp(lpi: torch.Tensor, valid_ids) -> torch.Tensor:
    """log pi outside the slot ids (what the learner passes as topk_other_logp); -inf when none are left."""
    outside = torch.ones(lpi.shape[-1], dtype=torch.bool)
    outside[torch.as_tensor(valid_ids)] = False
    return lpi[outside].logsumexp(-1).float()


def topk_slots_and_other(lmu: torch.Tensor, lpi: torch.Tensor, a: int, K: int):
    """`topk_slots` and pi's exact mass outside them (in log space)."""
    K = min(K, lmu.numel())
    top = torch.topk(lmu, K).indices.tolist()
    return topk_slots(lmu, lpi, a, K), other_logp(lpi, top + ([a] if a not in top else []))


@given(distribution_pair(), st.integers(1, 10))
def test_binary_le_topk_le_full(pair, K):
    """Appendix C's chain. Top-K KL gets pi's other mass as the learner gives it (exact); from the slots
    alone it is a lower estimate: never above the exact value, so never above the full KL either."""
    lmu, lpi, a = pair
    (tb, tl, tv), other = topk_slots_and_other(lmu, lpi, a, K)
    for binary, topk, full in ((binary_tv, topk_tv, full_tv), (binary_kl, topk_kl, full_kl)):
        d_bin = binary(lmu[a].float(), lpi[a].float()).item()
        d_top = (topk(tb, tl, tv, other_logp=other) if topk is topk_kl else topk(tb, tl, tv)).item()
        d_full = full(lmu, lpi).item()
        assert d_bin <= d_top + TOL, binary.__name__
        assert d_top <= d_full + TOL, topk.__name__
    assert topk_kl(tb, tl, tv).item() <= topk_kl(tb, tl, tv, other_logp=other).item() + TOL


@given(distribution_pair(min_vocab=4), st.integers(1, 5), st.integers(1, 5))
def test_topk_grows_as_its_set_grows(pair, k1, dk):
    lmu, lpi, a = pair
    k2 = k1 + dk
    small, large = topk_slots_and_other(lmu, lpi, a, k1), topk_slots_and_other(lmu, lpi, a, k2)
    assert topk_tv(*small[0]).item() <= topk_tv(*large[0]).item() + TOL
    assert topk_kl(*small[0], other_logp=small[1]).item() <= topk_kl(*large[0], other_logp=large[1]).item() + TOL


@given(distribution_pair())
def test_topk_over_the_whole_vocabulary_is_the_full_divergence(pair):
    lmu, lpi, a = pair
    V = lmu.numel()
    slots, other = topk_slots_and_other(lmu, lpi, a, V)
    assert other.item() == -math.inf
    assert topk_tv(*slots).item() == pytest.approx(full_tv(lmu, lpi).item(), abs=1e-5)
    for kl in (topk_kl(*slots, other_logp=other), topk_kl(*slots)):
        assert kl.item() == pytest.approx(full_kl(lmu, lpi).item(), abs=1e-4, rel=1e-4)


@st.composite
def sharp_pair(draw):
    """Issue 11's regime: mu keeps 1e-1..1e-6 outside a head of K tokens, pi (float32 logits, as an LM
    head gives them) keeps 1e-5..1e-12 there, below float32's resolution of 1 - sum(slots)."""
    V = draw(st.integers(30, 2000))
    K = draw(st.integers(1, 20))
    seed = draw(st.integers(0, 2**31 - 1))
    mu_tail = 10 ** -draw(st.floats(1.0, 6.0))
    pi_tail = 10 ** -draw(st.floats(5.0, 12.0))
    shift = draw(st.floats(0.0, 2.0))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randperm(V, generator=g)
    head, tail = ids[:K], ids[K:]
    mu = torch.empty(V, dtype=torch.float64)
    logits_head = torch.randn(K, generator=g, dtype=torch.float64) * 2
    mu[head] = logits_head.softmax(-1) * (1 - mu_tail)
    mu[tail] = (torch.randn(V - K, generator=g, dtype=torch.float64) * 2).softmax(-1) * mu_tail
    pi = torch.empty(V, dtype=torch.float64)
    pi[head] = (logits_head + torch.randn(K, generator=g, dtype=torch.float64) * shift).softmax(-1) * (1 - pi_tail)
    pi[tail] = (torch.randn(V - K, generator=g, dtype=torch.float64) * 3).softmax(-1) * pi_tail
    logits = (pi.log() + 3.0).float()  # [V]
    a = int(head[draw(st.integers(0, K - 1))]) if draw(st.booleans()) else int(tail[draw(st.integers(0, V - K - 1))])
    return mu.log(), logits, a, K


@given(sharp_pair())
def test_topk_kl_of_a_sharp_pi_never_exceeds_the_full_kl(pair):
    """Issue 11 found top-K KL above the full KL by up to 7.8 nats on sharp pi. With pi's other mass from
    the learner's own float32 log-softmax, top-K KL <= the full KL of those float32 values. On correctly
    rounded float32 values the chain binary <= top-K <= full holds, and from the slots alone top-K KL
    stays <= the exact value and the full KL."""
    lmu, logits, a, K = pair
    lpi32 = logits.log_softmax(-1)  # [V] the learner's float32 log pi
    (tb, tl, tv), other = topk_slots_and_other(lmu, lpi32.double(), a, K)
    d_full = full_kl(lmu, lpi32).item()
    assert topk_kl(tb, tl, tv, other_logp=other).item() <= d_full + TOL + 1e-6 * d_full
    lpi = logits.double().log_softmax(-1)  # the exact pi of those logits
    (tb, tl, tv), other = topk_slots_and_other(lmu, lpi, a, K)
    d_top = topk_kl(tb, tl, tv, other_logp=other).item()
    d_full = full_kl(lmu, lpi).item()
    assert binary_kl(lmu[a].float(), lpi[a].float()).item() <= d_top + TOL
    assert d_top <= d_full + TOL + 1e-6 * d_full
    d_slots = topk_kl(tb, tl, tv).item()
    assert d_slots <= d_top + TOL
    assert d_slots <= d_full + TOL


@given(st.floats(-30, 0), st.floats(-30, 0))
def test_binary_pinsker(lmu, lpi):
    tv = binary_tv(torch.tensor(lmu), torch.tensor(lpi)).item()
    kl = binary_kl(torch.tensor(lmu), torch.tensor(lpi)).item()
    assert 2 * tv * tv <= kl + 1e-5
    assert tv >= 0 and kl >= 0


# ---- Masks ----------------------------------------------------------------------------------------
MASKED = ["ppo_clip", "ppo_clip_relaxed", "neg_tv_mask", "dppo_binary_tv", "dppo_binary_kl", "dppo_topk_tv", "dppo_topk_kl"]


@st.composite
def token_batch(draw, B=3, T=7, K=3, V=12):
    """A [B, T] batch drawn from random distributions, with top-K slots and mixed advantages."""
    seed = draw(st.integers(0, 2**31 - 1))
    shift = draw(st.floats(0.0, 4.0))
    g = torch.Generator().manual_seed(seed)
    logits_mu = torch.randn(B, T, V, generator=g) * 3
    lmu = torch.log_softmax(logits_mu, -1)
    lpi = torch.log_softmax(logits_mu + torch.randn(B, T, V, generator=g) * shift, -1)
    a = torch.multinomial(lmu.exp().view(-1, V), 1, generator=g).view(B, T)
    top = torch.topk(lmu, K, -1).indices  # [B, T, K]
    in_top = (top == a[..., None]).any(-1)  # [B, T]
    ids = torch.cat([top, torch.where(in_top, torch.zeros_like(a), a)[..., None]], -1)  # [B, T, K+1]
    valid = torch.cat([torch.ones_like(top, dtype=torch.bool), ~in_top[..., None]], -1)
    adv = torch.randn(B, T, generator=g).round()  # some exact zeros
    mask = torch.rand(B, T, generator=g) > 0.2
    # [B, T, V] True outside the slots (unused slots point at a, itself a slot)
    outside = torch.ones(B, T, V, dtype=torch.bool).scatter_(-1, torch.where(valid, ids, a[..., None]), False)
    other = lpi.masked_fill(~outside, -math.inf).logsumexp(-1) if draw(st.booleans()) else None  # [B, T]
    return dict(
        logp=lpi.gather(-1, a[..., None])[..., 0],
        behavior_logp=lmu.gather(-1, a[..., None])[..., 0],
        advantages=adv,
        mask=mask,
        topk_behavior_logp=lmu.gather(-1, ids),
        topk_logp=lpi.gather(-1, ids),
        topk_valid=valid,
        topk_other_logp=other,
    )


def call(name, batch, **params):
    logp = batch["logp"].clone().requires_grad_()
    inputs = TrustRegionInputs(**{**batch, "logp": logp})
    out = make_trust_region(name, **params)(inputs)
    (grad,) = torch.autograd.grad(out.loss_terms.sum(), logp)
    return out, grad


@given(token_batch())
@pytest.mark.parametrize("name", MASKED)
def test_mask_never_blocks_an_update_toward_mu(name, batch):
    out, _ = call(name, batch)
    toward = ((batch["advantages"] > 0) & (batch["logp"] < batch["behavior_logp"])) | (
        (batch["advantages"] < 0) & (batch["logp"] > batch["behavior_logp"])
    )
    zero_adv = batch["advantages"] == 0
    trained = batch["mask"]
    assert out.keep[(toward | zero_adv) & trained].all()


DELTA_PARAM = {
    "ppo_clip": ("eps_high", "eps_low"),
    "ppo_clip_relaxed": ("eps_high", "eps_low"),
    "neg_tv_mask": ("delta",),
    "dppo_binary_tv": ("delta",),
    "dppo_binary_kl": ("delta",),
    "dppo_topk_tv": ("delta",),
    "dppo_topk_kl": ("delta",),
}


@given(token_batch(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
@pytest.mark.parametrize("name", MASKED)
def test_mask_only_relaxes_as_delta_grows(name, batch, d1, dd):
    params = DELTA_PARAM[name]
    tight, _ = call(name, batch, **{p: d1 for p in params})
    loose, _ = call(name, batch, **{p: d1 + dd for p in params})
    assert (loose.keep | ~tight.keep).all()  # tight.keep implies loose.keep


@given(token_batch(), st.sampled_from([math.inf, 3.0, 1.5]))
@pytest.mark.parametrize("name", ["dppo_binary_tv", "dppo_binary_kl", "dppo_topk_tv", "dppo_topk_kl", "neg_tv_mask"])
def test_infinite_delta_is_exactly_pg_is(name, batch, C):
    _, grad = call(name, batch, delta=math.inf, C=C)
    reference = "pg_is" if C == math.inf else "cispo"
    _, ref_grad = call(reference, batch, C=C)
    assert torch.equal(grad, ref_grad)


@given(token_batch())
@pytest.mark.parametrize("name", ["pg_is", "cispo"] + MASKED)
def test_on_policy_gives_the_plain_policy_gradient(name, batch):
    # pi = mu: r = 1, D = 0, every token kept, d loss / d logp = -A on trained tokens.
    batch = {**batch, "logp": batch["behavior_logp"].clone(), "topk_logp": batch["topk_behavior_logp"].clone(),
             "topk_other_logp": None}
    out, grad = call(name, batch)
    assert out.keep[batch["mask"]].all()
    expected = torch.where(batch["mask"], -batch["advantages"], torch.zeros(()))
    assert torch.allclose(grad, expected, atol=1e-6)


@given(token_batch(), st.integers(1, 5))
@pytest.mark.parametrize("name", ["pg_is", "cispo"] + MASKED)
def test_padding_gets_zero_gradient_and_changes_no_metric(name, batch, pad):
    out, grad = call(name, batch)
    B = batch["logp"].shape[0]

    def padded(key, fill):
        t = batch[key]
        extra = torch.full((B, pad) + t.shape[2:], fill, dtype=t.dtype)
        return torch.cat([t, extra], 1)

    # Garbage in the padding: NaN log-probs, prob-1 top-K slots, huge advantages.
    big = {
        "logp": padded("logp", float("nan")),
        "behavior_logp": padded("behavior_logp", 0.0),
        "advantages": padded("advantages", 1e6),
        "mask": padded("mask", False),
        "topk_behavior_logp": padded("topk_behavior_logp", 0.0),
        "topk_logp": padded("topk_logp", float("nan")),
        "topk_valid": padded("topk_valid", True),
        "topk_other_logp": None if batch["topk_other_logp"] is None else padded("topk_other_logp", float("nan")),
    }
    out_p, grad_p = call(name, big)
    T = batch["logp"].shape[1]
    assert torch.equal(grad_p[:, T:], torch.zeros(B, pad))
    assert torch.allclose(grad_p[:, :T], grad)
    assert out_p.metrics == pytest.approx(out.metrics, nan_ok=True)


@given(token_batch())
def test_ppo_clip_recompute_with_old_equal_to_mu_is_the_behavior_anchor(batch):
    out_b, grad_b = call("ppo_clip", batch)
    out_r, grad_r = call("ppo_clip", {**batch, "old_logp": batch["behavior_logp"].clone()}, anchor="recompute")
    assert torch.equal(out_b.keep, out_r.keep)
    assert torch.equal(grad_b, grad_r)


@given(token_batch())
@pytest.mark.parametrize("name", ["dppo_binary_tv", "dppo_binary_kl", "neg_tv_mask"])
def test_dppo_recompute_with_old_equal_to_mu_is_the_behavior_anchor(name, batch):
    _, grad_b = call(name, batch)
    _, grad_r = call(name, {**batch, "old_logp": batch["behavior_logp"].clone()}, anchor="recompute")
    assert torch.equal(grad_b, grad_r)


@given(token_batch())
@pytest.mark.parametrize("name", ["pg_is", "cispo"] + MASKED)
def test_gradient_is_eq_23(name, batch):
    # d loss / d logp = -M * min(pi/mu, C) * A, token by token, whatever the mask.
    out, grad = call(name, batch)
    tr = make_trust_region(name)
    r = torch.exp(batch["logp"] - batch["behavior_logp"]).clamp(max=tr.C)
    expected = torch.where(out.keep, -r * batch["advantages"], torch.zeros(()))
    assert torch.allclose(grad, expected, rtol=1e-5, atol=1e-6)
