"""Checkpoints of the local backend that load without running code: tensors in safetensors files,
everything else in JSON (a shared run directory can be resumed safely).

    RUN_DIR/checkpoint/trainable.safetensors   the parameters training changes (what resume restores)
    RUN_DIR/checkpoint/state.safetensors       optimizer state tensors, torch (and CUDA) RNG states
    RUN_DIR/checkpoint/state.json              last completed iteration, optimizer hyper-parameters,
                                               Python and numpy RNG states, the format version

One complete copy is kept at rest: a new checkpoint is written next to it, then swapped in; the old
one survives as `checkpoint.prev` only until the swap is done (a crash in between leaves one of the
two complete, and `load` falls back to it).

`--keep-best` keeps a second directory, RUN_DIR/best/: the trained weights of the best held-out evaluation
so far (`trainable.safetensors`) and `best.json` (its iteration, metric and value), no optimizer state.

Checkpoints of oat_dppo 0.1 (`checkpoint/state.pt`, a pickle) are read with `torch.load(...,
weights_only=True)` and only numpy's array type allowed besides tensors: a crafted file is refused
before any of its code runs.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from oat_dppo.rundir import CHECKPOINT_LEGACY as LEGACY
from oat_dppo.rundir import CHECKPOINT_STATE as STATE
from oat_dppo.rundir import give_new_file_mode

FORMAT = 2  # 1: the pickled state.pt of oat_dppo 0.1
TRAINABLE, TENSORS = "trainable.safetensors", "state.safetensors"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (missing, truncated, foreign or unsafe)."""


@dataclass
class Restored:
    iteration: int  # the last completed iteration
    path: Path
    extra: dict  # what the trainer saved besides (a warm start's progress)


def save(target: Path, *, iteration: int, model, optimizer: torch.optim.Optimizer, extra: dict | None = None) -> None:
    """Write the checkpoint of `iteration` into `target` (a directory), replacing any older one; `extra`: JSON
    the trainer gets back from `load`."""
    tmp = _write_trainable(target, model)
    tensors, opt_json = _split_optimizer(optimizer.state_dict())
    tensors["rng/torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = s
    save_file(tensors, str(tmp / TENSORS))
    give_new_file_mode(tmp / TENSORS)
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "format": FORMAT,
        "iteration": int(iteration),
        "optimizer": opt_json,
        "extra": extra or {},
        "rng": {"python": [py_version, list(py_state), py_gauss],
                "numpy": [np_name, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)]},
    }
    (tmp / STATE).write_text(json.dumps(state))
    _swap_in(tmp, target)


BEST = "best.json"


def save_best(target: Path, *, iteration: int, model, metric: str, value: float) -> None:
    """Write the trained weights of the policy evaluated at `iteration` into `target`, replacing the older best."""
    tmp = _write_trainable(target, model)
    (tmp / BEST).write_text(json.dumps({"format": FORMAT, "iteration": int(iteration), "metric": metric,
                                        "value": float(value)}))
    _swap_in(tmp, target)


def read_best(target: Path) -> dict | None:
    """`best.json` of a best-policy directory (`iteration`, `metric`, `value`), or None where there is none."""
    for path in (target, target.with_name(target.name + ".prev")):  # a crashed save leaves the older one
        if (path / BEST).is_file() and (path / TRAINABLE).is_file():
            return {**json.loads((path / BEST).read_text()), "path": str(path)}
    return None


def best_weights(target: Path) -> dict[str, torch.Tensor]:
    """The trained parameters of the best policy kept in `target` (for export)."""
    best = read_best(target)
    if best is None:
        raise CheckpointError(f"{target}: no best policy (the run ran without --keep-best, or never evaluated)")
    return load_file(str(Path(best["path"]) / TRAINABLE))


def load(target: Path, *, model, optimizer: torch.optim.Optimizer) -> Restored:
    """Restore the newest usable checkpoint (`target`, else `target.prev`) into `model` and
    `optimizer` and the global RNGs. Raises `CheckpointError` naming what was wrong with each."""
    return _newest(target, lambda p: _load_current(p, model, optimizer) if (p / STATE).is_file()
                   else _load_legacy(p, model, optimizer))


def trained_weights(target: Path) -> dict[str, torch.Tensor]:
    """The trained parameters of the newest usable checkpoint in `target` (for export), read safely."""
    def read(path: Path) -> dict[str, torch.Tensor]:
        if (path / STATE).is_file():
            _read_state(path)  # checks the format
            return load_file(str(path / TRAINABLE))
        return _read_legacy(path)["trainable"]

    return _newest(target, read)


def _newest(target: Path, read):
    """`read(path)` of the first usable of `target` and `target.prev` (a crashed save leaves the
    older one there); every failure is named in the `CheckpointError`."""
    errors = []
    for path in (target, target.with_name(target.name + ".prev")):
        try:
            if (path / STATE).is_file() or (path / LEGACY).is_file():
                return read(path)
            errors.append(f"{path}: no checkpoint")
        except CheckpointError as e:
            errors.append(str(e))
        except Exception as e:  # a truncated or foreign file: say which, try the older one
            errors.append(f"{path}: unreadable ({type(e).__name__}: {e})")
    raise CheckpointError("; ".join(errors))


# ---------------------------------------------------------------------------------------------


def _write_trainable(target: Path, model) -> Path:
    """A fresh scratch directory beside `target` holding the model's trained parameters (`_swap_in` it)."""
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    trainable = {n: p.detach().to("cpu", copy=True).contiguous() for n, p in model.named_parameters()
                 if p.requires_grad}
    save_file(trainable, str(tmp / TRAINABLE))
    give_new_file_mode(tmp / TRAINABLE)  # save_file leaves 0600, not what open() gives
    return tmp


def _swap_in(tmp: Path, target: Path) -> None:
    prev = target.with_name(target.name + ".prev")
    shutil.rmtree(prev, ignore_errors=True)
    if target.exists():
        target.rename(prev)
    tmp.rename(target)
    shutil.rmtree(prev, ignore_errors=True)  # one complete copy at rest


def _split_optimizer(sd: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """An optimizer state_dict -> (its tensors by flat name, the rest as JSON-able data)."""
    tensors, plain = {}, {}
    for idx, entry in sd["state"].items():
        plain[str(idx)] = {}
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer/{idx}/{name}"] = value.detach().to("cpu", copy=True).contiguous()
            else:
                plain[str(idx)][name] = value
    return tensors, {"param_groups": sd["param_groups"], "state": plain}


def _join_optimizer(tensors: dict[str, torch.Tensor], data: dict) -> dict:
    state: dict[int, dict[str, Any]] = {int(i): dict(v) for i, v in data["state"].items()}
    for key, value in tensors.items():
        if key.startswith("optimizer/"):
            _, idx, name = key.split("/", 2)
            state.setdefault(int(idx), {})[name] = value
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in data["param_groups"]]
    return {"state": state, "param_groups": groups}


def _restore(model, optimizer, trainable: dict, optimizer_state: dict, path: Path) -> None:
    result = model.load_state_dict(trainable, strict=False)
    if result.unexpected_keys:
        raise CheckpointError(f"{path}: parameters this model does not have: {result.unexpected_keys[:3]}")
    wanted = {n for n, p in model.named_parameters() if p.requires_grad}
    missing = sorted(wanted - set(trainable))
    if missing:
        raise CheckpointError(f"{path}: no values for trainable parameters {missing[:3]} (another configuration?)")
    optimizer.load_state_dict(optimizer_state)


def _read_state(path: Path) -> dict:
    state = json.loads((path / STATE).read_text())
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {state.get('format')!r}, this version reads {FORMAT}")
    return state


def _load_current(path: Path, model, optimizer) -> Restored:
    state = _read_state(path)
    tensors = load_file(str(path / TENSORS))
    _restore(model, optimizer, load_file(str(path / TRAINABLE)), _join_optimizer(tensors, state["optimizer"]), path)
    torch.set_rng_state(tensors["rng/torch"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng/cuda/"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, py_state, gauss = state["rng"]["python"]
    random.setstate((version, tuple(py_state), gauss))
    name, keys, pos, has_gauss, np_gauss = state["rng"]["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, np_gauss))
    return Restored(int(state["iteration"]), path, state.get("extra", {}))


def _load_legacy(path: Path, model, optimizer) -> Restored:
    state = _read_legacy(path)
    _restore(model, optimizer, state["trainable"], state["optimizer"], path)
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    return Restored(int(state["iteration"]), path, {})


def _read_legacy(path: Path) -> dict:
    """oat_dppo 0.1's pickled state.pt, read without running code (tensors and numpy arrays only)."""
    safe_globals = getattr(torch.serialization, "safe_globals", None)
    if safe_globals is None:
        raise CheckpointError(f"{path / LEGACY}: an oat_dppo 0.1 checkpoint; reading it safely needs torch >= 2.5")
    from numpy.core.multiarray import _reconstruct  # numpy's array pickling (the RNG state holds one)

    allowed = [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        with safe_globals(allowed):
            state = torch.load(path / LEGACY, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle.UnpicklingError for anything beyond tensors and arrays
        raise CheckpointError(f"{path / LEGACY}: refused: it holds objects other than tensors and arrays, and "
                              f"unpickling them could run code ({type(e).__name__})") from None
    return state
