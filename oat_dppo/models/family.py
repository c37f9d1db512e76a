"""`model_family`: which prompt-template family suits a model (qwen3, llama3, chatml or raw)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from oat_dppo.models.common import GEMMA3, SMOLLM2


def model_family(name_or_model: Any) -> str:
    """Prompt-template family for a model: "qwen3", "llama3", "chatml" or "raw".

    Accepts a load_policy name, hub id, local path, a loaded model, or a tokenizer. Names decide
    first (SmolLM2 -> chatml, Qwen instruct -> qwen3, *-Base / OctoThinker / Llama base -> raw,
    Llama-3 instruct -> llama3); otherwise the chat template's special tokens decide.
    """
    if isinstance(name_or_model, (str, os.PathLike)):
        name, template = str(name_or_model), None
    else:
        obj = name_or_model
        template = getattr(obj, "chat_template", None)
        cfg = getattr(obj, "config", None)
        name = getattr(obj, "name_or_path", None) or (getattr(cfg, "name_or_path", None) if cfg else None) or ""
    fam = _family_from_name(name)
    if fam is not None:
        return fam
    if template is None and name and Path(name).expanduser().is_dir():
        template = _template_in_dir(Path(name).expanduser())
    if isinstance(template, dict):  # tokenizers may keep several named templates
        template = template.get("default") or next(iter(template.values()), None)
    if isinstance(template, str):
        if "<|start_header_id|>" in template:
            return "llama3"
        if "<|im_start|>" in template:
            return "chatml"
    return "raw"


def _family_from_name(name: str) -> str | None:
    base = Path(name.rstrip("/")).name.lower() if name else ""
    full = name.lower()
    if base == "tiny-qwen3" or base == SMOLLM2:
        return "chatml"
    if "smollm" in full:  # SmolLM2 instruct models use ChatML; the base ones have no template
        return "chatml" if ("instruct" in full or "smollm2-135m-instruct" in full) else "raw"
    if base == "tiny-llama":
        return "llama3"
    if base == GEMMA3 or ("gemma" in base and not base.endswith("-it")):
        return "raw"  # Gemma base models (gemma3-270m): no chat template; a User/Assistant transcript
    if "octothinker" in full:
        return "raw"
    if "qwen" in base:
        if "base" in base:
            return "raw"
        if "qwen3" in base or "instruct" in base or "chat" in base:
            return "qwen3"
        return "raw"  # Qwen2 / Qwen2.5 checkpoints without -Instruct are base models
    if "llama" in base:
        return "llama3" if ("instruct" in base or "chat" in base) else "raw"
    return None


def _template_in_dir(d: Path) -> str | None:
    jinja = d / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    cfg = d / "tokenizer_config.json"
    if cfg.is_file():
        try:
            return json.loads(cfg.read_text()).get("chat_template")
        except (OSError, ValueError):
            return None
    return None
