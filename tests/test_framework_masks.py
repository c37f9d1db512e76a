"""Other frameworks' masks (`oat_dppo.trust_region.framework_masks`): exact vectors from each source's formula, the
side each source takes at its threshold, sequence-level decisions (rows and packed sequence ids), and
hypothesis properties: the gradient is -M * w * A (w = min(r, C), or one weight per sequence for
sequence TIS), masked tokens get exactly 0, on-policy batches are the plain policy gradient, padding
changes nothing, thresholds only relax as they widen."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from oat_dppo.trust_region import TrustRegionInputs, binary_kl, make_trust_region
from oat_dppo.trust_region.framework_masks import clamped_binary_kl
from oat_dppo.trust_region.sequences import per_sequence

PEERS = ["ipo", "icepop", "kpop", "tis", "mis", "trm"]
SEQUENCE_LEVEL = [("tis", {"level": "sequence"}), ("mis", {"level": "sequence"}), ("mis", {"level": "geometric"}),
                  ("trm", {"reduce": "max"}), ("trm", {"reduce": "mean"})]
VARIANTS = [(n, {}) for n in PEERS] + SEQUENCE_LEVEL


def run(name, pi, mu, adv, sequence_ids=None, **params):
    """[B, T] probabilities (nested lists) -> keep, gradient d(sum loss)/d(logp), output."""
    logp = torch.tensor(pi, dtype=torch.float64).log().float().requires_grad_()
    blp = torch.tensor(mu, dtype=torch.float64).log().float()
    a = torch.tensor(adv, dtype=torch.float32)
    ids = None if sequence_ids is None else torch.tensor(sequence_ids)
    out = make_trust_region(name, **params)(TrustRegionInputs(logp, blp, a, torch.ones_like(a, dtype=torch.bool),
                                                              sequence_ids=ids))
    (grad,) = torch.autograd.grad(out.loss_terms.sum(), logp)
    return out.keep.tolist(), grad, out


# ---- exact vectors -----------------------------------------------------------------------------
def test_ipo_masks_by_the_probability_gap_whatever_the_sign():
    """prime-rl: mask |pi - mu| > 0.3. mu 0.1 -> pi 0.5 (gap 0.4): masked for A = +1 AND for A = -1
    (DPPO would keep the second: it moves pi back toward mu); gap 0.2: kept with the raw ratio 2."""
    keep, grad, _ = run("ipo", [[0.5, 0.5, 0.2]], [[0.1, 0.1, 0.1]], [[1.0, -1.0, 1.0]])
    assert keep == [[False, False, True]]
    assert grad.tolist() == [[0.0, 0.0, pytest.approx(-2.0, rel=1e-6)]]
    keep, _, _ = run("dppo_binary_tv", [[0.5]], [[0.1]], [[-1.0]], delta=0.3)
    assert keep == [[True]]


def test_icepop_masks_outside_its_ratio_band():
    """IcePop [0.2, 5]: r = 0.1 and r = 6 masked (both advantage signs), r = 0.5 and 4 kept with r."""
    keep, grad, _ = run("icepop", [[0.01, 0.6, 0.05, 0.4]], [[0.1, 0.1, 0.1, 0.1]], [[1.0, -1.0, 1.0, -1.0]])
    assert keep == [[False, False, True, True]]
    assert grad[0].tolist() == pytest.approx([0.0, 0.0, -0.5, 4.0], rel=1e-6)


def test_kpop_masks_when_either_binary_kl_exceeds_phi():
    """KPop: KL(Bern(mu)||Bern(pi)) or KL(Bern(pi)||Bern(mu)) > 0.1, by hand: mu 0.5, pi 0.2 gives
    0.5 ln(2.5) + 0.5 ln(0.625) = 0.2231 (masked); mu 0.5, pi 0.4 gives 0.0204 and 0.0201 (kept)."""
    forward = 0.5 * math.log(0.5 / 0.2) + 0.5 * math.log(0.5 / 0.8)
    assert float(clamped_binary_kl(torch.tensor(0.5).log(), torch.tensor(0.2).log())) == pytest.approx(forward, rel=1e-5)
    keep, grad, out = run("kpop", [[0.2, 0.4]], [[0.5, 0.5]], [[1.0, 1.0]])
    assert keep == [[False, True]] and grad[0].tolist() == pytest.approx([0.0, -0.8], rel=1e-6)
    # the clamp to [1e-6, 1 - 1e-6]: pi = 0 and mu = 1 give a finite divergence
    assert math.isfinite(float(clamped_binary_kl(torch.tensor(0.0), torch.tensor(-math.inf))))


def test_tis_truncates_per_token_or_per_sequence():
    """C = 2. Token: r = [4, 0.5] -> w = [2, 0.5]. Sequence: prod r = 2 * 0.5 * 4 = 4 -> w = 2 on every
    token of the row; a row of prod 0.5 * 0.5 * 1 = 0.25 keeps 0.25 on each token."""
    _, grad, _ = run("tis", [[0.4, 0.05]], [[0.1, 0.1]], [[1.0, 1.0]])
    assert grad[0].tolist() == pytest.approx([-2.0, -0.5], rel=1e-6)
    _, grad, _ = run("tis", [[0.2, 0.05, 0.4], [0.05, 0.05, 0.1]], [[0.1, 0.1, 0.1], [0.1, 0.1, 0.1]],
                     [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], level="sequence")
    assert grad.tolist() == [pytest.approx([-2.0] * 3, rel=1e-5), pytest.approx([-0.25] * 3, rel=1e-5)]


def test_mis_rejects_tokens_sequences_or_geometric_means():
    """Token (threshold 2, low 1/2): r = [3, 0.4, 1.5] -> [masked, masked, kept w 1.5]. Sequence: the
    row's prod r = 3 * 0.4 * 1.5 = 1.8 is inside [0.5, 2]: all kept, each with its own r. Geometric
    (threshold 1.001): mean log r of [1.0005, 1.0005] is inside, of [1.01, 1.0] outside."""
    pi, mu = [[0.3, 0.04, 0.15]], [[0.1, 0.1, 0.1]]
    keep, grad, _ = run("mis", pi, mu, [[1.0, 1.0, 1.0]])
    assert keep == [[False, False, True]] and grad[0, 2].item() == pytest.approx(-1.5, rel=1e-5)
    keep, grad, _ = run("mis", pi, mu, [[1.0, 1.0, 1.0]], level="sequence")
    assert keep == [[True, True, True]] and grad[0].tolist() == pytest.approx([-3.0, -0.4, -1.5], rel=1e-5)
    keep, _, _ = run("mis", [[0.10005, 0.10005], [0.101, 0.1]], [[0.1, 0.1], [0.1, 0.1]], [[1.0, 1.0], [1.0, 1.0]],
                     level="geometric")
    assert keep == [[True, True], [False, False]]


def test_mis_veto_rejects_a_sequence_with_one_catastrophic_token():
    keep, _, _ = run("mis", [[0.1, 1e-6], [0.1, 0.1]], [[0.1, 0.5], [0.1, 0.1]], [[1.0, 1.0], [1.0, 1.0]],
                     level="token", threshold=1e9, veto=1e-4)
    assert keep == [[False, False], [True, True]]


def test_trm_masks_the_whole_sequence_by_its_max_or_mean_token_kl():
    """Row 0: one token with binary KL 0.2231 (mu 0.5 -> pi 0.2), one at 0: max 0.22 > 0.05 -> both
    masked, including the token that did not move; mean 0.11 > 0.05 too. Row 1: KL 0.0204 and 0: max
    0.0204 and mean 0.0102 are inside -> kept."""
    pi, mu, adv = [[0.2, 0.3], [0.4, 0.3]], [[0.5, 0.3], [0.5, 0.3]], [[1.0, -1.0], [1.0, -1.0]]
    for reduce in ("max", "mean"):
        keep, _, _ = run("trm", pi, mu, adv, reduce=reduce)
        assert keep == [[False, False], [True, True]]
    keep, _, _ = run("trm", pi, mu, adv, reduce="mean", delta=0.15)  # mean 0.11 < 0.15 < max 0.22
    assert keep == [[True, True], [True, True]]


# ---- boundaries: a value exactly at a threshold is kept by every source -------------------------
@pytest.mark.parametrize("name, params, pi, mu", [
    ("ipo", {"delta": 0.25}, 0.75, 0.5),        # |pi - mu| = 0.25 exactly (binary fractions)
    ("icepop", {"high": 2.0}, 0.5, 0.25),       # r = 2 exactly
    ("icepop", {"low": 0.5}, 0.125, 0.25),      # r = 0.5 exactly
    ("mis", {"threshold": 2.0}, 0.5, 0.25),     # r = 2 = threshold
    ("mis", {"threshold": 2.0}, 0.125, 0.25),   # r = 0.5 = 1 / threshold
])
def test_exactly_at_the_threshold_is_kept(name, params, pi, mu):
    keep, _, _ = run(name, [[pi]], [[mu]], [[1.0]], **params)
    assert keep == [[True]]


def test_kpop_and_trm_boundaries_keep_equality():
    """A divergence exactly at phi (KPop) or delta (TRM) is kept: both mask with a strict >."""
    mu, pi = torch.tensor([[0.5]]).log(), torch.tensor([[0.2]]).log()
    kl = float(torch.maximum(clamped_binary_kl(mu, pi), clamped_binary_kl(pi, mu)))
    assert run("kpop", [[0.2]], [[0.5]], [[1.0]], phi=kl)[0] == [[True]]
    assert run("kpop", [[0.2]], [[0.5]], [[1.0]], phi=kl * 0.999)[0] == [[False]]
    d = float(binary_kl(mu, pi))  # eq. 14, what TRM reduces per sequence
    assert run("trm", [[0.2]], [[0.5]], [[1.0]], delta=d)[0] == [[True]]
    assert run("trm", [[0.2]], [[0.5]], [[1.0]], delta=d * 0.999)[0] == [[False]]


# ---- sequences ----------------------------------------------------------------------------------
def test_per_sequence_rows_and_packed_ids_agree():
    values = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, -1.0, 0.0, 0.0]])
    valid = torch.tensor([[True, True, True, False], [True, True, False, False]])
    packed_values = values.reshape(1, -1)
    packed_valid = valid.reshape(1, -1)
    ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])
    for reduce, expected in (("sum", [6.0, 3.0]), ("mean", [2.0, 1.5]), ("max", [3.0, 4.0])):
        rows = per_sequence(values, valid, None, reduce)
        assert rows[:, 0].tolist() == expected and (rows == rows[:, :1]).all()
        packed = per_sequence(packed_values, packed_valid, ids, reduce).reshape(2, 4)
        assert torch.equal(packed, rows)
    assert per_sequence(values, torch.zeros_like(valid), None, "max").abs().sum() == 0  # no valid token: 0


@pytest.mark.parametrize("name, params", SEQUENCE_LEVEL)
def test_packed_sequences_decide_as_rows_do(name, params):
    g = torch.Generator().manual_seed(0)
    pi = torch.rand(3, 5, generator=g) * 0.8 + 0.1
    mu = (pi * torch.exp(torch.randn(3, 5, generator=g) * 0.3)).clamp(0.01, 0.99)
    adv = torch.randn(3, 5, generator=g)
    keep_rows, grad_rows, _ = run(name, pi.tolist(), mu.tolist(), adv.tolist(), **params)
    ids = torch.arange(3).repeat_interleave(5).reshape(1, 15)
    keep_packed, grad_packed, _ = run(name, pi.reshape(1, -1).tolist(), mu.reshape(1, -1).tolist(),
                                      adv.reshape(1, -1).tolist(), sequence_ids=ids.tolist(), **params)
    assert torch.tensor(keep_packed).reshape(3, 5).tolist() == keep_rows
    assert torch.allclose(grad_packed.reshape(3, 5), grad_rows, rtol=1e-5, atol=1e-7)


def test_sequence_ids_are_checked():
    logp = torch.zeros(1, 2)
    for ids, needle in ((torch.zeros(1, 3, dtype=torch.long), "sequence_ids must have shape"),
                        (torch.zeros(1, 2), "integer"), (torch.tensor([[0, -1]]), ">= 0")):
        with pytest.raises(ValueError, match=needle):
            make_trust_region("trm")(TrustRegionInputs(logp, logp, torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool),
                                                       sequence_ids=ids))


# ---- properties ---------------------------------------------------------------------------------
@st.composite
def batch(draw, B=3, T=6):
    seed = draw(st.integers(0, 2**31 - 1))
    shift = draw(st.floats(0.0, 3.0))
    g = torch.Generator().manual_seed(seed)
    lmu = torch.log_softmax(torch.randn(B, T, 9, generator=g) * 2, -1)[..., 0]
    lpi = (lmu + torch.randn(B, T, generator=g) * shift).clamp(max=0.0)
    return dict(logp=lpi, behavior_logp=lmu, advantages=torch.randn(B, T, generator=g).round(),
                mask=torch.rand(B, T, generator=g) > 0.2)


def call(name, params, b):
    logp = b["logp"].clone().requires_grad_()
    tr = make_trust_region(name, **params)
    out = tr(TrustRegionInputs(**{**b, "logp": logp}))
    (grad,) = torch.autograd.grad(out.loss_terms.sum(), logp)
    return tr, out, grad


def expected_weight(tr, b):
    """min(r_t, C), or for sequence TIS min(prod of the row's trained r, C) on each of its tokens."""
    log_r = torch.where(b["mask"], b["logp"] - b["behavior_logp"], torch.zeros(()))
    if getattr(tr, "level", "token") == "sequence" and tr.name == "tis":
        return log_r.sum(1, keepdim=True).clamp(-20, 20).exp().clamp(max=tr.C).expand_as(log_r)
    return log_r.exp().clamp(max=tr.C)


@given(batch())
@pytest.mark.parametrize("name, params", VARIANTS)
def test_gradient_is_minus_mask_times_weight_times_advantage(name, params, b):
    tr, out, grad = call(name, params, b)
    expected = torch.where(out.keep, -expected_weight(tr, b) * b["advantages"], torch.zeros(()))
    assert torch.allclose(grad, expected, rtol=1e-5, atol=1e-6)
    assert (grad[~out.keep] == 0).all() and (out.weights[~out.keep] == 0).all()
    assert not out.keep[~b["mask"]].any()


@given(batch())
@pytest.mark.parametrize("name, params", VARIANTS)
def test_on_policy_keeps_everything_and_is_the_plain_policy_gradient(name, params, b):
    b = {**b, "logp": b["behavior_logp"].clone()}
    _, out, grad = call(name, params, b)
    assert out.keep[b["mask"]].all()
    assert torch.allclose(grad, torch.where(b["mask"], -b["advantages"], torch.zeros(())), atol=1e-6)


@given(batch(), st.integers(1, 4))
@pytest.mark.parametrize("name, params", VARIANTS)
def test_padding_changes_nothing(name, params, b, pad):
    _, out, grad = call(name, params, b)
    B = b["logp"].shape[0]
    big = {k: torch.cat([v, torch.full((B, pad), fill, dtype=v.dtype)], 1)
           for (k, v), fill in zip(b.items(), (float("nan"), 0.0, 1e6, False))}
    _, out_p, grad_p = call(name, params, big)
    T = b["logp"].shape[1]
    assert torch.equal(grad_p[:, T:], torch.zeros(B, pad)) and torch.allclose(grad_p[:, :T], grad)
    assert out_p.metrics == pytest.approx(out.metrics, nan_ok=True)


WIDEN = {"ipo": lambda x: {"delta": x}, "kpop": lambda x: {"phi": x}, "trm": lambda x: {"delta": x},
         "icepop": lambda x: {"low": 1 / (1 + x), "high": 1 + x}, "mis": lambda x: {"threshold": 1 + x}}


@given(batch(), st.floats(0.0, 2.0), st.floats(0.0, 2.0))
@pytest.mark.parametrize("name", sorted(WIDEN))
def test_masks_only_relax_as_thresholds_widen(name, b, x, dx):
    _, tight, _ = call(name, WIDEN[name](x), b)
    _, loose, _ = call(name, WIDEN[name](x + dx), b)
    assert (loose.keep | ~tight.keep).all()


@given(batch())
@pytest.mark.parametrize("name, params", VARIANTS)
def test_extreme_ratios_stay_finite(name, params, b):
    b = {**b, "logp": torch.where(torch.rand(b["logp"].shape) > 0.5, torch.full_like(b["logp"], -60.0), b["logp"] * 0)}
    _, out, grad = call(name, params, b)
    assert torch.isfinite(out.loss_terms).all() and torch.isfinite(grad).all()
    assert all(math.isfinite(v) or math.isnan(v) for v in out.metrics.values())
