"""Trust-region strategies: exact vectors from the paper and by hand, gradients of eq. 23, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.sharp_tails import issue_11_case

from oat_dppo.trust_region import (
    TrustRegionInputs,
    aggregate,
    available,
    binary_kl,
    binary_tv,
    full_kl,
    make_trust_region,
    topk_kl,
    topk_tv,
)

ALL = [
    "pg_is",
    "cispo",
    "ppo_clip",
    "ppo_clip_relaxed",
    "neg_tv_mask",
    "dppo_binary_tv",
    "dppo_binary_kl",
    "dppo_topk_tv",
    "dppo_topk_kl",
    # the peers' masks (oat_dppo/trust_region/framework_masks.py, tests/test_framework_masks.py)
    "ipo",
    "icepop",
    "kpop",
    "tis",
    "mis",
    "trm",
]


def run(name: str, pi, mu, adv, mask=None, old=None, **params):
    """Keep mask and per-token gradient d(sum loss_terms)/d(logp) for probabilities pi, mu."""
    logp = torch.log(torch.tensor([pi], dtype=torch.float64)).float().requires_grad_()
    blp = torch.log(torch.tensor([mu], dtype=torch.float64)).float()
    a = torch.tensor([adv], dtype=torch.float32)
    m = torch.ones_like(a, dtype=torch.bool) if mask is None else torch.tensor([mask])
    old_lp = None if old is None else torch.log(torch.tensor([old], dtype=torch.float64)).float()
    out = make_trust_region(name, **params)(TrustRegionInputs(logp, blp, a, m, old_logp=old_lp))
    (grad,) = torch.autograd.grad(out.loss_terms.sum(), logp)
    return out.keep[0].tolist(), grad[0].tolist(), out


def test_available_lists_every_strategy_of_the_design():
    assert available()[: len(ALL)] == ALL


# ---- Section 4.2's example: mu(a_low) = 1e-4 -> pi 1e-2 (r = 100, TV 0.0099, binary KL 0.009489)
# and mu(a_high) = 0.99 -> pi 0.80 (r = 0.808, TV 0.19, binary KL 0.181005). Columns: A = +1 low,
# A = +1 high, A = -1 low, A = -1 high.
PAPER_PI = [1e-2, 0.80, 1e-2, 0.80]
PAPER_MU = [1e-4, 0.99, 1e-4, 0.99]
PAPER_ADV = [1.0, 1.0, -1.0, -1.0]


@pytest.mark.parametrize(
    "name, params, keep",
    [
        # PPO clips the harmless low-probability move (r = 100 > 1.28) and lets the 0.19 mass drop of
        # the dominant token through (r = 0.808 > 0.8): the paper's over/under-penalization.
        ("ppo_clip", {}, [False, True, True, True]),
        # Binary TV at 0.15 blocks the dominant token's drop (0.19 > 0.15) and keeps the low one.
        ("dppo_binary_tv", {"delta": 0.15}, [True, True, True, False]),
        # At 0.2 nothing exceeds delta.
        ("dppo_binary_tv", {"delta": 0.2}, [True, True, True, True]),
        # Binary KL 0.181 > 0.05 blocks the dominant token's drop; the low token's 0.0095 is kept.
        ("dppo_binary_kl", {"delta": 0.05}, [True, True, True, False]),
    ],
)
def test_paper_section_4_2_example(name, params, keep):
    got_keep, grad, _ = run(name, PAPER_PI, PAPER_MU, PAPER_ADV, **params)
    assert got_keep == keep
    # eq. 23: d loss / d logp = -M * r * A with C = inf; r = 100 and 0.80/0.99.
    r = [100.0, 0.80 / 0.99, 100.0, 0.80 / 0.99]
    expected = [-(k * ri * a) for k, ri, a in zip(keep, r, PAPER_ADV)]
    assert grad == pytest.approx(expected, rel=1e-5)


def test_paper_example_divergence_values():
    mu = torch.log(torch.tensor(PAPER_MU[:2]))
    pi = torch.log(torch.tensor(PAPER_PI[:2]))
    assert binary_tv(mu, pi).tolist() == pytest.approx([0.0099, 0.19], abs=1e-6)
    # 1e-4 ln(1e-4/1e-2) + (1-1e-4) ln((1-1e-4)/(1-1e-2)) = -4.6052e-4 + 0.0099493 = 0.0094888
    # 0.99 ln(0.99/0.80) + 0.01 ln(0.01/0.20) = 0.2109623 - 0.0299573 = 0.1810050
    assert binary_kl(mu, pi).tolist() == pytest.approx([0.0094888, 0.1810050], rel=2e-5)


@pytest.mark.parametrize(
    "mu, pi, tv, kl",
    [
        # 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1) = -0.2938933 + 0.8047190
        (0.5, 0.9, 0.4, 0.5108256),
        # 0.5 ln(0.5/0.6) + 0.5 ln(0.5/0.4) = -0.0911608 + 0.1115718
        (0.5, 0.6, 0.1, 0.0204110),
        # 0.1 ln(0.1/0.35) + 0.9 ln(0.9/0.65) = -0.1252763 + 0.2928802
        (0.1, 0.35, 0.25, 0.1676039),
        # asymmetric: 0.2 ln(0.2/0.01) + 0.8 ln(0.8/0.99) = 0.5991465 - 0.1704745
        (0.2, 0.01, 0.19, 0.4286720),
    ],
)
def test_binary_divergences_by_hand(mu, pi, tv, kl):
    lmu, lpi = torch.log(torch.tensor([mu])), torch.log(torch.tensor([pi]))
    assert binary_tv(lmu, lpi).item() == pytest.approx(tv, abs=1e-6)
    assert binary_kl(lmu, lpi).item() == pytest.approx(kl, rel=1e-5)


# A vocabulary of 8: mu = [.50 .20 .12 .08 .05 .03 .015 .005], pi = [.30 .35 .10 .10 .06 .05 .035 .005].
# Full TV = (.2 + .15 + .02 + .02 + .01 + .02 + .02 + 0) / 2 = 0.22.
VOCAB_MU = [0.50, 0.20, 0.12, 0.08, 0.05, 0.03, 0.015, 0.005]
VOCAB_PI = [0.30, 0.35, 0.10, 0.10, 0.06, 0.05, 0.035, 0.005]


def test_topk_adds_the_sampled_token_as_an_extra_slot():
    # K = 2, sampled a = 5 (outside the top-2): the set is {0, 1} ∪ {5} plus "other", not {0, 5}.
    # mu: .5 .2 .03 | other .27 ; pi: .3 .35 .05 | other .30
    # TV = (.2 + .15 + .02 + .03) / 2 = 0.2
    # KL = .5 ln(.5/.3) + .2 ln(.2/.35) + .03 ln(.03/.05) + .27 ln(.27/.30)
    #    = .2554128 - .1119232 - .0153248 - .0284474 = 0.0997174
    ids = [0, 1, 5]
    tb = torch.log(torch.tensor([VOCAB_MU[i] for i in ids]))
    tl = torch.log(torch.tensor([VOCAB_PI[i] for i in ids]))
    assert topk_tv(tb, tl).item() == pytest.approx(0.2, abs=1e-6)
    assert topk_kl(tb, tl).item() == pytest.approx(0.0997174, rel=1e-4)
    # The evicting variant some implementations use, {0, 5}, gives a smaller KL (0.087695).
    ev = [0, 5]
    kl_evict = topk_kl(torch.log(torch.tensor([VOCAB_MU[i] for i in ev])), torch.log(torch.tensor([VOCAB_PI[i] for i in ev])))
    assert kl_evict.item() == pytest.approx(0.087695, rel=1e-4)
    assert kl_evict.item() < topk_kl(tb, tl).item()


def test_topk_strategy_masks_what_binary_keeps():
    # Sampled a = 1 (pi .35 > mu .2), A > 0, delta 0.15: binary TV = 0.15 (not > 0.15 -> kept,
    # computed as 0.14999998 in float32), top-2 TV over {0, 1} + other = (.2 + .15 + .05) / 2 = 0.2 -> masked.
    logp = torch.log(torch.tensor([[0.349]])).requires_grad_()  # 0.149 away from mu, clear of delta
    blp = torch.log(torch.tensor([[0.2]]))
    tb = torch.log(torch.tensor([[[0.5, 0.2, 1.0]]]))
    tl = torch.log(torch.tensor([[[0.3, 0.349, 1.0]]]))
    tv = torch.tensor([[[True, True, False]]])
    inputs = TrustRegionInputs(logp, blp, torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool),
                               topk_behavior_logp=tb, topk_logp=tl, topk_valid=tv)
    assert make_trust_region("dppo_binary_tv", delta=0.15)(inputs).keep.item() is True
    out = make_trust_region("dppo_topk_tv", delta=0.15, topk=2)(inputs)
    assert out.keep.item() is False
    assert out.metrics["divergence_mean"] == pytest.approx(0.5 * (0.2 + 0.149 + 0.051), abs=1e-6)


@pytest.mark.parametrize(
    "A, mu, pi, keep, grad",
    [
        # TV delta 0.15 (gradient -M * r * A): moving away beyond delta is blocked, toward mu never.
        (+1, 0.5, 0.6, True, -1.2),
        (+1, 0.5, 0.8, False, 0.0),
        (-1, 0.5, 0.2, False, 0.0),
        (-1, 0.5, 0.4, True, 0.8),
        (+1, 0.5, 0.2, True, -0.4),  # toward mu, |pi - mu| = 0.3 > delta: kept
        (-1, 0.5, 0.8, True, 1.6),  # toward mu: kept
        (+1, 1e-4, 1e-2, True, -100.0),
    ],
)
def test_binary_tv_gradients_by_hand(A, mu, pi, keep, grad):
    k, g, _ = run("dppo_binary_tv", [pi], [mu], [A], delta=0.15)
    assert k == [keep]
    assert g == pytest.approx([grad], rel=1e-5)


def test_truncation_c_caps_the_weight():
    # r = 100: cispo's default C = 3 caps the weight, and so does C = 5 on DPPO.
    _, g, out = run("cispo", [1e-2], [1e-4], [1.0])
    assert g == pytest.approx([-3.0])
    assert out.metrics["truncated_frac"] == 1.0
    _, g, _ = run("dppo_binary_tv", [1e-2], [1e-4], [1.0], C=5)
    assert g == pytest.approx([-5.0])


def test_loss_value_is_the_truncated_surrogate():
    # value of loss_terms = -M * min(r, C) * A; its gradient is the same number (eq. 23).
    _, _, out = run("pg_is", [0.6, 0.3], [0.5, 0.5], [1.0, -2.0])
    assert out.loss_terms[0].tolist() == pytest.approx([-1.2, 1.2], rel=1e-5)


def test_ppo_clip_recompute_anchor_masks_on_pi_old_and_weights_by_pi_over_mu():
    # mu = 0.5, pi_old = 0.3, pi = 0.45, A = +1: r_old = 1.5 > 1.28 -> blocked under recompute,
    # r = 0.9 -> kept under behavior. When kept, the weight is pi / mu either way (eq. 23).
    k, _, _ = run("ppo_clip", [0.45], [0.5], [1.0], old=[0.3], anchor="recompute")
    assert k == [False]
    k, g, _ = run("ppo_clip", [0.45], [0.5], [1.0], old=[0.45], anchor="recompute")
    assert k == [True] and g == pytest.approx([-0.9], rel=1e-5)
    k, _, _ = run("ppo_clip", [0.45], [0.5], [1.0])
    assert k == [True]


@pytest.mark.parametrize(
    "name, divergence",
    [
        # TV: |pi_old - pi| = [0.25, 0.05] against delta 0.2; against mu it would be [0.05, 0.45].
        ("dppo_binary_tv", [0.25, 0.05]),
        # KL(Bern(pi_old) || Bern(pi)): 0.5 ln(0.5/0.75) + 0.5 ln(0.5/0.25) = 0.1438410 and
        # 0.7 ln(0.7/0.75) + 0.3 ln(0.3/0.25) = 0.0064013 against delta 0.05; against mu, 0.0064 and 0.4458.
        ("dppo_binary_kl", [0.1438410, 0.0064013]),
    ],
)
def test_dppo_recompute_anchor_measures_the_divergence_from_pi_old_not_mu(name, divergence):
    """anchor="recompute" (figure 4's decoupled ablation): eq. 12's D and its r > 1 test are taken
    between pi_old and pi, never between mu and pi; the weight stays min(pi / mu, C) (eq. 23).
    Two A > 0 tokens with pi = 0.75 where mu and pi_old disagree about the mask (default deltas):
      token 0: pi_old 0.5, mu 0.7: D(pi_old, pi) exceeds delta -> blocked (against mu it is kept);
      token 1: pi_old 0.7, mu 0.3: D(pi_old, pi) is below delta -> kept with weight pi / mu = 2.5
               (against mu it is blocked).
    The behavior anchor gives the opposite mask on the same tokens."""
    pi, mu, old, adv = [0.75, 0.75], [0.7, 0.3], [0.5, 0.7], [1.0, 1.0]
    keep, grad, out = run(name, pi, mu, adv, old=old, anchor="recompute")
    assert keep == [False, True]
    assert grad == pytest.approx([0.0, -0.75 / 0.3], rel=1e-5)
    # divergence_mean is the mean of the divergence the mask thresholded: pi_old's, not mu's.
    assert out.metrics["divergence_mean"] == pytest.approx(sum(divergence) / 2, rel=1e-4)
    keep, _, _ = run(name, pi, mu, adv)
    assert keep == [True, False]


def test_ppo_clip_asymmetric_epsilons_clip_each_side_at_its_own_epsilon():
    """Eq. 9 (clip-higher) with eps_low = 0.1 != eps_high = 0.3, mu = 0.5 everywhere (r = 2 pi):
    A > 0 is blocked only above r = 1 + eps_high = 1.3, A < 0 only below r = 1 - eps_low = 0.9.
    With the epsilons swapped the bounds would be 1.1 and 0.7: tokens 0 and 2 pin which is which.
      0: A+ r 1.2 kept (1.2 <= 1.3)     1: A+ r 1.4 blocked      2: A- r 0.8 blocked (0.8 < 0.9)
      3: A- r 0.6 blocked               4: A- r 1.2 kept (an A < 0 token is never clipped above)
      5: A+ r 0.8 kept (an A > 0 token is never clipped below)
    """
    pi = [0.6, 0.7, 0.4, 0.3, 0.6, 0.4]
    adv = [1.0, 1.0, -1.0, -1.0, -1.0, 1.0]
    keep, grad, out = run("ppo_clip", pi, [0.5] * 6, adv, eps_low=0.1, eps_high=0.3)
    assert keep == [True, False, False, False, True, True]
    # eq. 23: -M * r * A
    assert grad == pytest.approx([-1.2, 0.0, 0.0, 0.0, 1.2, -0.8], rel=1e-5)
    assert out.metrics["kept_frac_pos"] == pytest.approx(2 / 3)
    assert out.metrics["kept_frac_neg"] == pytest.approx(1 / 3)
    # The same tokens with the epsilons given the other way round: now 0 is blocked and 2 kept.
    keep, _, _ = run("ppo_clip", pi, [0.5] * 6, adv, eps_low=0.3, eps_high=0.1)
    assert keep == [False, False, True, False, True, True]


@pytest.mark.parametrize(
    "direction, keep",
    [
        # tokens: (mu 0.05, pi 0.10, A+) r=2 ; (mu 0.05, pi 0.02, A-) r=0.4 ; (mu 0.5, pi 0.9, A+) r=1.8
        ("high", [True, False, False]),
        ("low", [False, True, False]),
        ("both", [True, True, False]),
    ],
)
def test_relaxed_clip_lifts_only_low_probability_tokens(direction, keep):
    k, _, out = run("ppo_clip_relaxed", [0.10, 0.02, 0.9], [0.05, 0.05, 0.5], [1.0, -1.0, 1.0], direction=direction)
    assert k == keep
    k, _, _ = run("ppo_clip", [0.10, 0.02, 0.9], [0.05, 0.05, 0.5], [1.0, -1.0, 1.0])
    assert k == [False, False, False]


def test_neg_tv_mask_blocks_only_large_drops_on_negative_samples():
    # mu - pi: 0.6 (A-) blocked; 0.4 (A-) kept; 0.6 with A+ kept; the drop of exactly 0.5 is blocked
    # (>= delta), tested at 0.55 - 0.04 = 0.51 to stay off the float boundary.
    k, _, out = run("neg_tv_mask", [0.3, 0.5, 0.3, 0.04], [0.9, 0.9, 0.9, 0.55], [-1.0, -1.0, 1.0, -1.0])
    assert k == [False, True, True, False]
    assert out.metrics["bad_update_frac"] == pytest.approx(0.5)


# ---- Boundaries at exactly delta ----------------------------------------------------------------
# Strategies compute in float32 (`prepare`). Dyadic probabilities survive the round trip exactly:
# exp(float32(log p)) == p for p = 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, so the differences below are exact.
DYADIC = [0.25, 0.375, 0.5, 0.625, 0.75, 0.875]


def test_dyadic_probabilities_are_exact_in_float32():
    lp = torch.log(torch.tensor(DYADIC, dtype=torch.float64)).float()  # [6], as `run` builds them
    assert lp.exp().tolist() == DYADIC
    assert binary_tv(lp[[2, 4]], lp[[4, 2]]).tolist() == [0.25, 0.25]  # |0.5 - 0.75| both ways


def test_dppo_mask_is_strict_at_exactly_delta():
    """Eq. 12 blocks an update only where D > delta: strict, as the paper writes it (eq. 12 and
    its restatements in the appendix), since the trust region of eqs. 4 and 8 is D <= delta, which a token at
    D == delta still satisfies. So D == delta is kept; the code compares `divergence > self.delta`.
    Binary TV (eq. 13) is exactly 0.25 = delta here (dyadic probabilities, float32):
      0: A+ mu 0.5 -> pi 0.75   (r > 1, D = delta)  kept
      1: A- mu 0.75 -> pi 0.5   (r < 1, D = delta)  kept
      2: A+ mu 0.5 -> pi 0.875  (r > 1, D = 0.375)  blocked: the mask is live just above delta
      3: A- mu 0.75 -> pi 0.375 (r < 1, D = 0.375)  blocked
    Top-K TV (eq. 15) over {a_t, rest} is the same number here and goes through the same comparison."""
    pi, mu, adv = [0.75, 0.5, 0.875, 0.375], [0.5, 0.75, 0.5, 0.75], [1.0, -1.0, 1.0, -1.0]
    keep, grad, out = run("dppo_binary_tv", pi, mu, adv, delta=0.25)
    assert keep == [True, True, False, False]
    assert grad == pytest.approx([-1.5, 2 / 3, 0.0, 0.0], rel=1e-6)
    assert out.metrics["divergence_mean"] == (0.25 + 0.25 + 0.375 + 0.375) / 4  # exact: D == delta really
    # Top-K with K = 1: slots [a_t, the other token] carry the whole distribution, TV = |mu - pi| again.
    logp = torch.log(torch.tensor([pi], dtype=torch.float64)).float()  # [1, 4]
    blp = torch.log(torch.tensor([mu], dtype=torch.float64)).float()
    tb = torch.stack([blp, torch.log1p(-blp.double().exp()).float()], -1)  # [1, 4, 2]
    tl = torch.stack([logp, torch.log1p(-logp.double().exp()).float()], -1)
    inputs = TrustRegionInputs(logp, blp, torch.tensor([adv]), torch.ones(1, 4, dtype=torch.bool),
                               topk_behavior_logp=tb, topk_logp=tl, topk_valid=torch.ones_like(tb, dtype=torch.bool))
    out = make_trust_region("dppo_topk_tv", delta=0.25, topk=1)(inputs)
    assert out.keep[0].tolist() == [True, True, False, False]
    assert out.metrics["divergence_mean"] == (0.25 + 0.25 + 0.375 + 0.375) / 4


def test_neg_tv_mask_blocks_a_drop_of_exactly_delta():
    """Section 5.3's mask is inclusive: M_t = 0 if A < 0 and mu - pi >= delta (the paper's text
    writes >=, unlike eq. 12's strict D > delta); the code compares `drop >= self.delta`. The drops
    here are exact in float32 (dyadic probabilities):
      0: A- mu 0.75 -> pi 0.25  (drop 0.5 = delta)   blocked
      1: A- mu 0.875 -> pi 0.5  (drop 0.375 < delta) kept
      2: A+ mu 0.75 -> pi 0.25  (drop 0.5, A > 0)    kept: only negative samples are masked
    and at delta 0.25 the drop of 0.25 (mu 0.75 -> pi 0.5) is blocked likewise."""
    keep, grad, _ = run("neg_tv_mask", [0.25, 0.5, 0.25], [0.75, 0.875, 0.75], [-1.0, -1.0, 1.0])
    assert keep == [False, True, True]
    assert grad == pytest.approx([0.0, 0.5 / 0.875, -1 / 3], rel=1e-6)
    keep, _, _ = run("neg_tv_mask", [0.5, 0.5], [0.75, 0.625], [-1.0, -1.0], delta=0.25)
    assert keep == [False, True]


def test_metrics_count_only_informative_tokens_and_report_mismatch():
    # Token 3 has A = 0: never masked, not in the kept fractions.
    _, _, out = run("dppo_binary_tv", [0.9, 0.5, 0.2], [0.5, 0.5, 0.9], [1.0, -1.0, 0.0], delta=0.2)
    m = out.metrics
    assert m["kept_frac"] == pytest.approx(0.5)
    assert m["kept_frac_pos"] == 0.0 and m["kept_frac_neg"] == 1.0
    assert m["prob_diff_mean"] == pytest.approx((0.4 + 0.0 + 0.7) / 3, abs=1e-6)
    assert m["prob_diff_max"] == pytest.approx(0.7, abs=1e-6)
    assert m["masked_mu_mean"] == pytest.approx(0.5)
    assert m["ratio_max"] == pytest.approx(1.8, rel=1e-5)
    assert m["ratio_min"] == pytest.approx(0.2 / 0.9, rel=1e-5)
    # k3 = r - 1 - ln r averaged: (1.8-1-ln1.8 + 0 + 0.2222-1-ln0.2222) / 3
    k3 = ((1.8 - 1 - math.log(1.8)) + (2 / 9 - 1 - math.log(2 / 9))) / 3
    assert m["kl_k3"] == pytest.approx(k3, rel=1e-5)
    assert m["nonfinite_frac"] == 0.0 and m["num_tokens"] == 3


# ---- Numerics -------------------------------------------------------------------------------------
EDGE_PROBS = [0.0, 1.0, 1e-30, 1 - 1e-7, 0.5, 1e-7]


@pytest.mark.parametrize("name", ALL)
def test_extreme_probabilities_give_finite_results(name):
    pairs = [(a, b) for a in EDGE_PROBS for b in EDGE_PROBS]
    mu = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
    pi = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
    n = len(pairs)
    blp = mu.log().float()[None]
    lp = pi.log().float()[None].requires_grad_()
    adv = torch.tensor([[1.0, -1.0] * (n // 2)])
    # Top-K inputs: the sampled token plus one other token with the complementary mass.
    tb = torch.stack([blp, torch.log1p(-blp.exp().clamp(max=1 - 1e-7))], -1)
    tl = torch.stack([lp.detach(), torch.log1p(-lp.detach().exp().clamp(max=1 - 1e-7))], -1)
    inputs = TrustRegionInputs(lp, blp, adv, torch.ones(1, n, dtype=torch.bool), topk_behavior_logp=tb,
                               topk_logp=tl, topk_valid=torch.ones_like(tb, dtype=torch.bool))
    out = make_trust_region(name, topk=1)(inputs) if "topk" in name else make_trust_region(name)(inputs)
    (g,) = torch.autograd.grad(out.loss_terms.sum(), lp)
    assert torch.isfinite(out.loss_terms).all()
    # A sampled token with mu = 0 or pi = 0 has a -inf log-prob: excluded and counted, not NaN.
    assert torch.isfinite(g).all()
    assert out.metrics["nonfinite_frac"] == pytest.approx(sum(a == 0.0 or b == 0.0 for a, b in pairs) / n)
    for k, v in out.metrics.items():
        if k != "masked_mu_mean":
            assert math.isfinite(v), k


def test_divergences_are_finite_and_non_negative_at_the_edges():
    probs = torch.tensor(EDGE_PROBS, dtype=torch.float64)
    a, b = torch.meshgrid(probs, probs, indexing="ij")
    la, lb = a.log().float(), b.log().float()
    for fn in (binary_tv, binary_kl):
        d = fn(la, lb)
        assert torch.isfinite(d).all() and (d >= 0).all(), fn.__name__
    tb = torch.stack([la, torch.log1p(-a.clamp(max=1 - 1e-7)).float()], -1)
    tl = torch.stack([lb, torch.log1p(-b.clamp(max=1 - 1e-7)).float()], -1)
    for fn in (topk_tv, topk_kl):
        d = fn(tb, tl)
        assert torch.isfinite(d).all() and (d >= 0).all(), fn.__name__


def test_binary_kl_is_accurate_near_one():
    # log mu = -1e-4, log pi = -1e-6: the exact value is 3.61499e-4 (float64, log1p). The
    # 1e-8-in-probability-space formula of some implementations gives 3.5932e-4 in float32.
    got = binary_kl(torch.tensor([-1e-4]), torch.tensor([-1e-6])).item()
    assert got == pytest.approx(3.61499e-4, rel=2e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_are_computed_in_float32(dtype):
    torch.manual_seed(0)
    lp = (torch.rand(4, 16) * -3).to(dtype).requires_grad_()
    blp = (torch.rand(4, 16) * -3).to(dtype)
    adv = torch.randn(4, 1).to(dtype)
    mask = torch.ones(4, 16, dtype=torch.bool)
    tr = make_trust_region("dppo_binary_kl")
    out = tr(TrustRegionInputs(lp, blp, adv, mask))
    ref = tr(TrustRegionInputs(lp.detach().float().requires_grad_(), blp.float(), adv.float(), mask))
    assert out.loss_terms.dtype == torch.float32
    assert torch.equal(out.keep, ref.keep)
    assert torch.allclose(out.loss_terms, ref.loss_terms)
    assert out.metrics == pytest.approx(ref.metrics, nan_ok=True)


def test_minus_inf_topk_entries_are_zero_probabilities():
    # mu's top-3 has a -inf entry (a token the sampler could not pick): that slot is probability 0.
    tb = torch.tensor([[math.log(0.6), math.log(0.4), -math.inf]])
    tl = torch.tensor([[math.log(0.5), math.log(0.4), math.log(0.05)]])
    # TV: (|.6-.5| + 0 + |0-.05| + |0 - .05|) / 2 = 0.1 ; KL: .6 ln(.6/.5) + .4 ln 1 + 0 = 0.1093929
    assert topk_tv(tb, tl).item() == pytest.approx(0.1, abs=1e-6)
    assert topk_kl(tb, tl).item() == pytest.approx(0.6 * math.log(1.2), rel=1e-5)


def test_topk_tail_of_a_peaked_distribution_survives_float32():
    """Found by Hypothesis: mu's top slot holds 0.9993 and pi's 0.9982; pi's mass outside the 6 slots
    is ~1.5e-8, below float32's resolution of 1 - sum(slots). Rounded to 0 (then 1e-30), KL's tail
    term came out 5e-5 too large and top-K KL exceeded the full KL. Given pi's other mass (as the
    learner gives it) top-K KL is exact; from the slots alone it reads the tail at the slot sum's
    float32 noise (n = S * eps32 * sum): below the exact value, by at most mu(other) log(n / pi(other))."""
    lmu = torch.tensor([-6.9073e-04, -8.7751e+00, -2.8631e+01, -1.3785e+01, -1.7998e+01,
                        -1.7280e+01, -1.0995e+01, -1.0603e+01, -1.0010e+01, -7.7100e+00], dtype=torch.float64)
    lpi = torch.tensor([-1.8256e-03, -1.1472e+01, -3.1961e+01, -1.8293e+01, -2.0996e+01,
                        -2.0380e+01, -1.1459e+01, -1.4926e+01, -1.2734e+01, -6.3201e+00], dtype=torch.float64)
    lmu, lpi = lmu.log_softmax(-1), lpi.log_softmax(-1)
    slots = torch.topk(lmu, 6).indices  # the sampled token (id 0) is among them
    mu, pi = lmu.exp(), lpi.exp()
    other_mu, other_pi = 1 - mu[slots].sum(), 1 - pi[slots].sum()  # float64: exact enough
    assert other_pi < 1e-7
    kl_ref = (mu[slots] * (lmu[slots] - lpi[slots])).sum() + other_mu * torch.log(other_mu / other_pi)
    tv_ref = 0.5 * ((mu[slots] - pi[slots]).abs().sum() + (other_mu - other_pi).abs())
    tb, tl = lmu[slots].float()[None], lpi[slots].float()[None]  # [1, 6] float32, as the learner has them
    other_logp = other_pi.log().float()[None]  # [1]
    assert topk_kl(tb, tl, other_logp=other_logp).item() == pytest.approx(kl_ref.item(), abs=1e-7)
    assert topk_tv(tb, tl).item() == pytest.approx(tv_ref.item(), abs=1e-7)
    slot_only = topk_kl(tb, tl).item()
    noise = 6 * torch.finfo(torch.float32).eps * pi[slots].sum()
    assert kl_ref.item() - other_mu * math.log(noise / other_pi) - 1e-7 <= slot_only <= kl_ref.item() + 1e-7
    assert topk_kl(tb, tl, other_logp=other_logp).item() <= full_kl(lmu, lpi).item()


def _one_token(lpi_a, lmu_a, adv=1.0, **topk):
    """[1, 1] inputs for one token with log pi(a) `lpi_a` and log mu(a) `lmu_a` (float32 scalars)."""
    return TrustRegionInputs(lpi_a.reshape(1, 1).float(), lmu_a.reshape(1, 1).float(), torch.tensor([[adv]]),
                             torch.ones(1, 1, dtype=torch.bool), **topk)


@pytest.mark.parametrize("pi_tail", [1e-9, 1e-7, 1e-6])
def test_topk_kl_of_a_sharp_float32_pi(pi_tail):
    """Issue 11: mu keeps 1e-3 outside its top-20, the learner's float32 pi keeps 1e-9..1e-6 there, below
    the noise of its float32 slot sum (above 1 for 1e-9). Read as 0 and floored at 1e-30, pi's "other"
    added ~0.06 and delta 0.05 masked a token with mu(a) = 0.05, pi(a) = 0.05005 whose top-K KL is
    0.013 / 0.008 / 0.006. Given pi's other mass it is exact; from the slots alone it is a lower
    estimate (<= the exact value, <= the full KL) that keeps the token too."""
    case = issue_11_case(pi_tail)
    lpi, ids, a = case.lpi32, case.ids, case.a  # [V] the learner's float32 log pi
    K = ids.numel()
    assert abs(lpi[ids].double().exp().sum().item() - 1.0) < 1e-7  # 1 - sum(slots) is float32 noise
    # [1, 1, S] slots as a rollout records them: mu's top-K, slot K unused (the sampled token is in the top-K)
    topk = dict(topk_behavior_logp=torch.cat([case.lmu[ids].float(), torch.tensor([-math.inf])])[None, None],
                topk_logp=torch.cat([lpi[ids], torch.tensor([-math.inf])])[None, None],
                topk_valid=torch.tensor([[[True] * K + [False]]]))
    slots = (topk["topk_behavior_logp"], topk["topk_logp"], topk["topk_valid"])
    other = lpi[K:].logsumexp(-1).reshape(1, 1)  # log pi outside the slots (ids K..V-1), as the learner has it
    assert topk_kl(*slots, other_logp=other).item() == pytest.approx(case.exact, abs=1e-5)
    slots_only = topk_kl(*slots).item()
    assert 0.004 < slots_only <= case.exact + 1e-7 and slots_only <= case.full
    # Through the strategy at delta 0.05: A > 0 and r = pi/mu = 1.001 > 1, so D > delta would mask it.
    assert lpi[a].exp().item() == pytest.approx(0.05005, rel=1e-4)
    for other_logp, value in ((other, case.exact), (None, slots_only)):
        out = make_trust_region("dppo_topk_kl")(_one_token(lpi[a], case.lmu[a], **topk, topk_other_logp=other_logp))
        assert out.keep.item()
        assert out.metrics["divergence_mean"] == pytest.approx(value, abs=1e-5)


def test_binary_kl_when_float32_log_pi_rounds_to_zero():
    """Issue 11, binary: a float32 log-softmax returns log pi(a) = 0 once 1 - pi(a) is below half of
    float32's eps (its normalizer rounds to 1). Read as 1e-30, 1 - pi added (1 - mu) x 52 nats: mu(a) =
    0.999 against pi(a) = 1 - 1e-9 gave 0.062 where the exact binary KL is 0.0128, and delta 0.05
    masked the token. 1 - pi is now taken >= eps32: 0.0080, a lower estimate."""
    V = 1000
    logits = torch.full((V,), math.log(1e-9 / (V - 1)), dtype=torch.float64)
    logits[0] = math.log1p(-1e-9)
    lpi = logits.float().log_softmax(-1)  # [V] the learner's float32
    assert lpi[0].item() == 0.0
    lmu = torch.tensor(math.log(0.999))
    exact = 0.999 * math.log(0.999 / (1 - 1e-9)) + 1e-3 * math.log(1e-3 / 1e-9)
    eps = torch.finfo(torch.float32).eps
    got = binary_kl(lmu.float(), lpi[0]).item()
    assert got == pytest.approx(0.999 * math.log(0.999) + 1e-3 * math.log(1e-3 / eps), rel=1e-4)
    assert got <= exact
    out = make_trust_region("dppo_binary_kl")(_one_token(lpi[0], lmu))  # A > 0, r = 1.001
    assert out.keep.item()
    # Away from 1 nothing changed: 1 - pi = 1e-6 (> eps) is still resolved (see the test above).
    assert binary_kl(torch.tensor([-1e-4]), torch.tensor([-1e-6])).item() == pytest.approx(3.61499e-4, rel=2e-3)


def test_nonfinite_inputs_are_excluded_and_counted():
    logp = torch.tensor([[math.log(0.5), float("nan"), math.log(0.5), float("inf")]]).requires_grad_()
    blp = torch.tensor([[math.log(0.4), math.log(0.5), float("-inf"), math.log(0.5)]])
    out = make_trust_region("dppo_binary_tv")(TrustRegionInputs(logp, blp, torch.ones(1, 1), torch.ones(1, 4, dtype=torch.bool)))
    (g,) = torch.autograd.grad(out.loss_terms.sum(), logp)
    assert out.keep[0].tolist() == [True, False, False, False]
    assert torch.isfinite(g).all()
    assert g[0].tolist() == pytest.approx([-0.5 / 0.4, 0.0, 0.0, 0.0], rel=1e-5)
    assert out.metrics["nonfinite_frac"] == 0.75
    assert out.metrics["num_tokens"] == 1


# ---- Bad input ------------------------------------------------------------------------------------
def test_unknown_name_lists_available_and_closest():
    with pytest.raises(ValueError) as e:
        make_trust_region("dppo_binary_tvv")
    msg = str(e.value)
    assert "unknown trust region 'dppo_binary_tvv' (did you mean 'dppo_binary_tv'?); valid: " in msg
    for name in ALL:
        assert name in msg


@pytest.mark.parametrize(
    "name, params, needle",
    [
        ("dppo_binary_tv", {"delta": -0.1}, "delta must be >= 0"),
        ("ppo_clip", {"eps_low": -0.2}, "eps_low must be >= 0"),
        ("ppo_clip", {"eps_high": -1}, "eps_high must be >= 0"),
        ("ppo_clip_relaxed", {"alpha": -0.1}, "alpha must be >= 0"),
        ("ppo_clip_relaxed", {"direction": "up"}, "direction must be"),
        ("cispo", {"C": 0}, "C (the ratio truncation) must be > 0"),
        ("dppo_binary_kl", {"C": -1}, "C (the ratio truncation) must be > 0"),
        ("dppo_binary_kl", {"anchor": "old"}, "anchor must be"),
        ("pg_is", {"delta": 0.2}, "does not take 'delta'"),
        ("dppo_topk_kl", {"topk": 0}, "topk must be a positive integer"),
        ("pg_is", {"anchor": "recompute"}, "has no trust-region anchor"),
    ],
)
def test_bad_parameters_name_the_argument(name, params, needle):
    with pytest.raises(ValueError, match=None) as e:
        make_trust_region(name, **params)
    assert needle in str(e.value)


def _inputs(B=2, T=3, **over):
    base = dict(logp=torch.zeros(B, T), behavior_logp=torch.zeros(B, T), advantages=torch.ones(B, 1),
                mask=torch.ones(B, T, dtype=torch.bool))
    base.update(over)
    return TrustRegionInputs(**base)


@pytest.mark.parametrize(
    "name, inputs, needle",
    [
        ("pg_is", _inputs(behavior_logp=torch.zeros(2, 4)), "behavior_logp must have shape (2, 3)"),
        ("pg_is", _inputs(mask=torch.ones(3, 3, dtype=torch.bool)), "mask must have shape (2, 3)"),
        ("pg_is", _inputs(advantages=torch.ones(2, 2)), "advantages must have shape"),
        ("pg_is", _inputs(logp=torch.zeros(6)), "logp must be a [B, T] tensor"),
        ("dppo_topk_tv", _inputs(), "needs topk_behavior_logp, topk_logp, topk_valid"),
        ("dppo_binary_tv", _inputs(), None),
        ("ppo_clip", _inputs(), None),
    ],
)
def test_bad_inputs_are_reported(name, inputs, needle):
    tr = make_trust_region(name)
    if needle is None:
        tr(inputs)  # well-formed inputs go through
        with pytest.raises(ValueError, match="old_logp is required for anchor='recompute'"):
            make_trust_region(name, anchor="recompute")(inputs)
        return
    with pytest.raises(ValueError) as e:
        tr(inputs)
    assert needle in str(e.value)


def test_topk_shapes_are_checked():
    bad = _inputs(topk_behavior_logp=torch.zeros(2, 3, 4), topk_logp=torch.zeros(2, 3, 5),
                  topk_valid=torch.ones(2, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="topk_logp must have the shape"):
        make_trust_region("dppo_topk_kl")(bad)
    topk = dict(topk_behavior_logp=torch.zeros(2, 3, 4), topk_logp=torch.zeros(2, 3, 4),
                topk_valid=torch.ones(2, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"topk_other_logp must have shape \[B, T\] = \(2, 3\)"):
        make_trust_region("dppo_topk_kl")(_inputs(**topk, topk_other_logp=torch.zeros(2, 3, 1)))


def test_nan_other_logp_falls_back_to_the_slots():
    # Row 0: pi's other mass given; row 1: NaN there (or a NaN slot): pi(other) from the slots instead.
    tb = torch.log(torch.tensor([[0.6, 0.3], [0.6, 0.3]]))
    tl = torch.log(torch.tensor([[0.5, 0.3], [0.5, 0.3]]))
    other = torch.log(torch.tensor([0.2, float("nan")]))
    got = topk_kl(tb, tl, other_logp=other)
    assert torch.isfinite(got).all()
    assert got[0].item() == pytest.approx(got[1].item(), abs=1e-5)  # 1 - 0.8 = 0.2 either way
    assert got[0].item() == pytest.approx(0.6 * math.log(0.6 / 0.5) + 0.1 * math.log(0.1 / 0.2), rel=1e-5)


# ---- Aggregation ---------------------------------------------------------------------------------
def test_aggregation_modes():
    terms = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    assert aggregate(terms, mask, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate(terms, mask, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(terms, mask, "seq_mean_token_sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(terms, mask, "seq_sum_constant_length", constant_length=8).item() == pytest.approx(10 / (2 * 8))
    assert aggregate(terms, mask, "token_mean", num_tokens=20).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="constant_length"):
        aggregate(terms, mask, "seq_sum_constant_length")
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        aggregate(terms, mask, "mean")  # type: ignore[arg-type]
