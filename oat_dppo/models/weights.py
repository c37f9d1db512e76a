"""A policy's weights for other consumers: the trained weights under plain Hugging Face names (vLLM
weight syncs, export; LoRA merged), and where a separate inference engine loads the model from."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer

from oat_dppo.models import common, gemma3, smollm2
from oat_dppo.models.common import GEMMA3, GEMMA3_HUB_ID, SMOLLM2, SMOLLM2_HUB_ID, TINY_MODELS


def policy_weights(model, *, trainable_only: bool = False):
    """Yield `(name, tensor)` for the weights of `model` under the plain Hugging Face names (what
    `from_pretrained` and vLLM's `load_weights` read), detached, on the model's device.

    With LoRA (a peft model) every adapted layer yields its merged weight W + scale * B @ A (no
    adapter tensors, nothing modified in place). `trainable_only`: only the weights an update can
    change: parameters that require grad, or, with LoRA, the adapted layers' merged weights. Tied
    weights come once (named_parameters deduplicates them).
    """
    with torch.no_grad():
        if not isinstance(model, PeftModel):
            for name, p in model.named_parameters():
                if p.requires_grad or not trainable_only:
                    yield name, p.detach()
            return
        base = model.get_base_model()
        adapted = {}
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer):
                weight = module.get_base_layer().weight
                delta = sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)
                adapted[name] = (weight + delta).to(weight.dtype) if not isinstance(delta, int) else weight
        for name, w in adapted.items():
            yield f"{name}.weight", w.detach()
        if trainable_only:
            return
        for name, p in base.named_parameters():
            if "lora_" in name:
                continue
            name = name.replace(".base_layer.", ".")
            if name.endswith(".weight") and name[: -len(".weight")] in adapted:
                continue
            yield name, p.detach()


def engine_model_source(name: str, model, tokenizer, scratch: str | os.PathLike) -> str:
    """Where a separate inference engine (vLLM) loads the policy `load_policy(name)` returned: its
    Hugging Face directory or hub id, or, for a model that exists only in memory (`tiny-*`), a copy
    saved under `scratch`. The engine receives the learner's weights before it samples anyway; the
    source gives it the architecture, the tokenizer and a first set of weights."""
    key = name.strip().lower()
    if key == SMOLLM2 or (key == SMOLLM2_HUB_ID.lower() and common.hub_offline() and not common.in_hf_cache(name)):
        return str(smollm2.smollm2_dir())
    if key == GEMMA3 or (key == GEMMA3_HUB_ID.lower() and common.hub_offline() and not common.in_hf_cache(name)
                         and gemma3.gemma3_available() is None):
        return str(gemma3.gemma3_dir())
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if key not in TINY_MODELS:
        return name  # a hub id, loaded by the engine from the Hugging Face cache
    out = Path(scratch) / key
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.save_pretrained(out)
    common.save_config_for_both(out)  # config and tokenizer loadable by transformers 4 (Oat) and 5
    common.save_tokenizer(tokenizer, out)
    return str(out)
