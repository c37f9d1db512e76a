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


@given(distribution_pair(), st.integers(1, 10))
def test_binary_le_topk_le_full(pair, K):
    lmu, lpi, a = pair
    tb, tl, tv = topk_slots(lmu, lpi, a, K)
    for binary, topk, full in ((binary_tv, topk_tv, full_tv), (binary_kl, topk_kl, full_kl)):
        d_bin = binary(lmu[a].float(), lpi[a].float()).item()
        d_top = topk(tb, tl, tv).item()
        d_full = full(lmu, lpi).item()
        assert d_bin <= d_top + TOL, binary.__name__
        assert d_top <= d_full + TOL, topk.__name__


@given(distribution_pair(min_vocab=4), st.integers(1, 5), st.integers(1, 5))
def test_topk_grows_as_its_set_grows(pair, k1, dk):
    lmu, lpi, a = pair
    k2 = k1 + dk
    for topk in (topk_tv, topk_kl):
        small = topk(*topk_slots(lmu, lpi, a, k1)).item()
        large = topk(*topk_slots(lmu, lpi, a, k2)).item()
        assert small <= large + TOL


@given(distribution_pair())
def test_topk_over_the_whole_vocabulary_is_the_full_divergence(pair):
    lmu, lpi, a = pair
    V = lmu.numel()
    slots = topk_slots(lmu, lpi, a, V)
    assert topk_tv(*slots).item() == pytest.approx(full_tv(lmu, lpi).item(), abs=1e-5)
    assert topk_kl(*slots).item() == pytest.approx(full_kl(lmu, lpi).item(), abs=1e-4, rel=1e-4)


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
    return dict(
        logp=lpi.gather(-1, a[..., None])[..., 0],
        behavior_logp=lmu.gather(-1, a[..., None])[..., 0],
        advantages=adv,
        mask=mask,
        topk_behavior_logp=lmu.gather(-1, ids),
        topk_logp=lpi.gather(-1, ids),
        topk_valid=valid,
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
    batch = {**batch, "logp": batch["behavior_logp"].clone(), "topk_logp": batch["topk_behavior_logp"].clone()}
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
