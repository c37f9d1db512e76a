"""Preparing a policy for training: LoRA adapters, gradient checkpointing, training only the top layers."""

from __future__ import annotations

from peft import LoraConfig, get_peft_model


def enable_gradient_checkpointing(model):
    """Recompute activations in backward (less memory, ~30% more compute). Returns `model`."""
    # Non-reentrant checkpointing works with frozen inputs (LoRA) without enable_input_require_grads.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def apply_lora(
    model,
    rank: int = 8,
    alpha: float = 16.0,
    target_modules: str | list[str] = "all-linear",
    dropout: float = 0.0,
):
    """Wrap `model` with LoRA adapters (peft); only adapter weights stay trainable.

    B starts at zero, so the wrapped model's outputs equal the base model's until the first update.
    `target_modules="all-linear"` adapts every linear layer except the output head.
    """
    cfg = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


def freeze_all_but_top_layers(model, n: int) -> None:
    """Train the top `n` decoder layers and the final norm; freeze embeddings, the rest, the head
    (tied to the embeddings in small models)."""
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError("--trainable-layers needs a decoder with a `layers` list (Llama/Qwen-style models)")
    if n > len(layers):
        raise ValueError(f"--trainable-layers {n}: the model has only {len(layers)} layers")
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in list(layers)[-n:]:
        for p in layer.parameters():
            p.requires_grad_(True)
    norm = getattr(decoder, "norm", None)
    if norm is not None:
        for p in norm.parameters():
            p.requires_grad_(True)
