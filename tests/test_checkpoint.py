"""Checkpoints load without running code (safetensors + JSON), restore exactly, and keep one copy at
rest; oat_dppo 0.1's pickled state.pt is still read, but only as tensors and arrays."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from oat_dppo.backends.local import checkpoint


def model_and_optimizer(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    model[0].weight.requires_grad_(False)  # a frozen parameter is not saved (--trainable-layers, LoRA)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    return model, opt


def test_round_trip_restores_weights_optimizer_and_every_rng(tmp_path):
    model, opt = model_and_optimizer()
    random.seed(3), np.random.seed(4), torch.manual_seed(5)
    checkpoint.save(tmp_path / "checkpoint", iteration=7, model=model, optimizer=opt)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    other, other_opt = model_and_optimizer(seed=1)
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    restored = checkpoint.load(tmp_path / "checkpoint", model=other, optimizer=other_opt)
    assert restored.iteration == 7
    for (n, p), q in zip(model.named_parameters(), other.parameters()):
        if p.requires_grad:
            assert torch.equal(p, q), n
    a, b = opt.state_dict(), other_opt.state_dict()
    assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        assert a["state"][i].keys() == b["state"][i].keys()
        assert all(torch.equal(a["state"][i][k], b["state"][i][k]) for k in a["state"][i])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    assert {p.name for p in (tmp_path / "checkpoint").iterdir()} == {"trainable.safetensors", "state.safetensors",
                                                                    "state.json"}


def test_one_complete_copy_at_rest(tmp_path):
    model, opt = model_and_optimizer()
    for it in range(3):
        checkpoint.save(tmp_path / "checkpoint", iteration=it, model=model, optimizer=opt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def test_a_crafted_pickle_is_refused_and_runs_nothing(tmp_path):
    """A shared run directory whose state.pt would run code when unpickled: refused, nothing runs."""
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))  # unpickling would create the marker file

    (tmp_path / "checkpoint").mkdir()
    torch.save({"iteration": 1, "trainable": {}, "optimizer": Payload()}, tmp_path / "checkpoint" / "state.pt")
    model, opt = model_and_optimizer()
    with pytest.raises(checkpoint.CheckpointError, match="refused"):
        checkpoint.load(tmp_path / "checkpoint", model=model, optimizer=opt)
    assert not marker.exists()


def test_the_pickled_checkpoints_of_oat_dppo_0_1_still_load(tmp_path):
    model, opt = model_and_optimizer()
    (tmp_path / "checkpoint").mkdir()
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    torch.save({"iteration": 4, "trainable": trainable, "optimizer": opt.state_dict(),
                "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
                "config": {"env": "rg:arc_1d"}}, tmp_path / "checkpoint" / "state.pt")
    other, other_opt = model_and_optimizer(seed=1)
    assert checkpoint.load(tmp_path / "checkpoint", model=other, optimizer=other_opt).iteration == 4
    assert all(torch.equal(trainable[n], p) for n, p in other.named_parameters() if p.requires_grad)
