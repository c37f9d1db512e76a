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


def save_config_for_both(out: Path) -> None:
    """Make the config.json `save_pretrained` wrote under transformers 5.x read the same under 4.x.

    5.x writes RoPE as `rope_parameters` (`{"rope_theta": ..., "rope_type": ...}`, or one such dict per
    attention type: Gemma 3's `full_attention` / `sliding_attention`); 4.x reads `rope_theta`, `rope_scaling`
    and `rope_local_base_freq`, and where they are missing silently takes its class default: a SmolLM2
    exported for an Oat run (Oat's stack is 4.51) ran with Llama's 10000 instead of its 100000, and played
    GuessTheNumber at 0.47 where the same weights win 0.71-0.76 (docs/oat.md). The 4.x keys are added beside
    the 5.x ones, which 5.x keeps reading."""
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    for section in (cfg, cfg.get("text_config")):
        if not isinstance(section, dict) or not isinstance(section.get("rope_parameters"), dict):
            continue
        rope = section["rope_parameters"]
        if "full_attention" in rope:  # per attention type
            if "rope_theta" in rope.get("sliding_attention", {}):
                section.setdefault("rope_local_base_freq", rope["sliding_attention"]["rope_theta"])
            rope = rope["full_attention"]
        if "rope_theta" in rope:
            section.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default":
            section.setdefault("rope_scaling", {k: v for k, v in rope.items() if k != "rope_theta"})
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


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
