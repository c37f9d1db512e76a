"""What the model modules share: names, the asset cache, the hub's offline state, the dtype keyword."""

from __future__ import annotations

import json
import os
from pathlib import Path

import transformers
from huggingface_hub import constants as hub_constants
from huggingface_hub import try_to_load_from_cache

from oat_dppo.model_names import (  # noqa: F401 (re-exported)
    GEMMA3,
    GEMMA3_HUB_ID,
    GEMMA3_PACKAGES,
    SMOLLM2,
    SMOLLM2_HUB_ID,
    SMOLLM2_WHEEL,
    TINY_MODELS,
)

# transformers 5 renamed `torch_dtype=` to `dtype=`; the project pins 4.51.3 but should not break on 5.
DTYPE_KW = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"


class ModelNotFoundError(OSError):
    """The requested model is neither local, cached, nor downloadable (offline)."""


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The oat_dppo asset cache: `cache_dir`, else $OAT_DPPO_CACHE, else ~/.cache/oat_dppo."""
    root = cache_dir or os.environ.get("OAT_DPPO_CACHE") or "~/.cache/oat_dppo"
    return Path(root).expanduser()


def hub_offline() -> bool:
    env = os.environ.get("HF_HUB_OFFLINE", "") or os.environ.get("TRANSFORMERS_OFFLINE", "")
    if env.strip().upper() in {"1", "ON", "YES", "TRUE"}:
        return True
    # huggingface_hub reads it at import time: covers a value set before this process started
    return bool(getattr(hub_constants, "HF_HUB_OFFLINE", False))


def in_hf_cache(repo_id: str) -> bool:
    try:
        hit = try_to_load_from_cache(repo_id=repo_id, filename="config.json")
    except Exception:  # invalid repo id syntax and the like: certainly not cached
        return False
    return isinstance(hit, str)


def save_tokenizer(tok, out: Path) -> None:
    """`tok.save_pretrained(out)` in the layout transformers 4.x and 5.x both load.

    The cache is shared by every venv on a machine (the Oat pin is 4.51.3, the GPU kit 5.x). 5.x
    names the class `TokenizersBackend` and writes `extra_special_tokens` as a list; 4.x knows
    neither (unknown class; it expects a dict there), while 5.x reads 4.x's names as well.
    """
    tok.save_pretrained(str(out))
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    if isinstance(cfg.get("extra_special_tokens"), list):
        cfg["additional_special_tokens"] = cfg.pop("extra_special_tokens")
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
