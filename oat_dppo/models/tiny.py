"""tiny-qwen3 / tiny-llama: random-init ~0.8 M parameter models with byte-level tokenizers built in
code (no files, no network, deterministic given the seed), for tests and smoke runs."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast, Qwen3Config

from oat_dppo.models.common import DTYPE_KW

# Every special token the project's prompt templates use, in both tiny tokenizers, so any template
# renders with single-id specials on either model.
_TINY_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)

CHATML_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def tiny_tokenizer(arch: str = "qwen3") -> PreTrainedTokenizerFast:
    """Byte-level tokenizer (8 specials + 256 bytes = 264 ids); every string round-trips exactly.

    `arch="qwen3"`: ChatML template, eos `<|im_end|>`, pad `<|endoftext|>`.
    `arch="llama"`: Llama-3 template, bos `<|begin_of_text|>` (added when encoding with special
    tokens, as Llama 3's tokenizer does), eos `<|eot_id|>`, pad `<|end_of_text|>`.
    """

    vocab = {s: i for i, s in enumerate(_TINY_SPECIALS)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    # BPE without merges over the byte alphabet: one id per byte, no training data needed.
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tk.add_special_tokens(list(_TINY_SPECIALS))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    if arch == "qwen3":
        roles = dict(eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None)
        template = CHATML_TEMPLATE
    elif arch == "llama":
        roles = dict(eos_token="<|eot_id|>", pad_token="<|end_of_text|>", bos_token="<|begin_of_text|>")
        template = LLAMA3_TEMPLATE
        # Like Llama 3's tokenizer, encoding with special tokens puts BOS first.
        bos = "<|begin_of_text|>"
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    else:
        raise ValueError(f"unknown tiny arch {arch!r}; expected 'qwen3' or 'llama'")
    named = {v for v in roles.values() if v}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        unk_token=None,
        additional_special_tokens=[s for s in _TINY_SPECIALS if s not in named],
        # no token_type_ids: transformers 4.51 generate() rejects them
        model_input_names=["input_ids", "attention_mask"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
        **roles,
    )
    tok.chat_template = template
    return tok


def tiny_model(
    tok,
    arch: str = "qwen3",
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    hidden: int = 128,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int = 384,
    max_position_embeddings: int = 2048,
):
    """Random-init causal LM sized for `tok`; identical weights for identical arguments."""

    common = dict(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=ffn,
        head_dim=hidden // heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id,
    )
    if arch == "qwen3":
        # sliding_window=None: Qwen3Config's default (4096, unused) only triggers an sdpa warning
        cfg = Qwen3Config(sliding_window=None, **common)
    elif arch == "llama":
        cfg = LlamaConfig(**common)
    else:
        raise ValueError(f"unknown tiny arch {arch!r}; expected 'qwen3' or 'llama'")
    # Seed a private RNG stream so building a model neither depends on nor disturbs the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, **{DTYPE_KW: dtype})
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval()
