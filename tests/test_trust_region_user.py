"""User strategies plug in by name and by import path, and train."""

from __future__ import annotations

import torch

from oat_dppo.trust_region import TrustRegionInputs, aggregate, available, make_trust_region, register
from helpers.user_trust_regions import SymmetricTV


def train_bandit(trust_region, steps: int = 60, seed: int = 0) -> tuple[float, float]:
    """A 16-armed softmax bandit (arm 3 pays 1), 32 samples per step, 4 gradient steps per batch
    against the batch's behavior log-probs: returns the mean reward of the first and last batches."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.zeros(16, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.1)
    rewards = []
    for _ in range(steps):
        with torch.no_grad():
            behavior = torch.log_softmax(logits, -1)
            actions = torch.multinomial(behavior.exp(), 32, replacement=True, generator=g)  # [32]
            reward = (actions == 3).float()
            adv = (reward - reward.mean())[:, None]  # [32, 1]
        rewards.append(reward.mean().item())
        for _ in range(4):
            logp = torch.log_softmax(logits, -1)[actions][:, None]  # [32, 1]
            out = trust_region(TrustRegionInputs(logp, behavior[actions][:, None], adv, torch.ones(32, 1, dtype=torch.bool)))
            loss = aggregate(out.loss_terms, torch.ones(32, 1, dtype=torch.bool))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return rewards[0], sum(rewards[-5:]) / 5


def test_registered_user_strategy_trains():
    if "symmetric_tv" not in available():
        register("symmetric_tv", SymmetricTV)
    tr = make_trust_region("symmetric_tv", delta=0.2)
    assert isinstance(tr, SymmetricTV) and tr.delta == 0.2
    first, last = train_bandit(tr)
    assert first < 0.25 and last > 0.8


def test_strategy_loaded_by_import_path_trains():
    tr = make_trust_region("helpers.user_trust_regions:make", delta=0.3)
    assert isinstance(tr, SymmetricTV) and tr.delta == 0.3
    first, last = train_bandit(tr)
    assert first < 0.25 and last > 0.8


def test_user_strategy_mask_is_applied():
    tr = make_trust_region("helpers.user_trust_regions:make", delta=0.1)
    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    blp = torch.log(torch.tensor([[0.3, 0.45]]))
    out = tr(TrustRegionInputs(logp, blp, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2, dtype=torch.bool)))
    assert out.keep.tolist() == [[False, True]]


def test_bad_import_paths_are_explained():
    import pytest

    with pytest.raises(ValueError, match="cannot import module 'no_such_pkg.mod'"):
        make_trust_region("no_such_pkg.mod:make")
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        make_trust_region("helpers.user_trust_regions:nope")
    with pytest.raises(ValueError, match="already registered"):
        register("dppo_binary_tv", SymmetricTV)
