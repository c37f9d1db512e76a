"""HFEngine: the recorded behavior log-probs mu must be exactly what tokens were sampled from.

The reference everywhere is a teacher-forced forward pass of the same model over prompt+response.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oat_dppo.engine import Generation, HFEngine, PromptTooLongError
from oat_dppo.engine.hf import MIN_SHARED_PROMPT
from oat_dppo.models.prefix import PrefixPlan, plan_prefixes
from oat_dppo.models import apply_lora, load_policy

ATOL = 2e-5  # fp32, 4 layers: KV-cached decoding vs one full forward differ by ~1e-6


@pytest.fixture(scope="module")
def qwen():
    return load_policy("tiny-qwen3", seed=0)


@pytest.fixture(scope="module")
def llama():
    return load_policy("tiny-llama", seed=1)


@pytest.fixture(scope="module")
def sharp():
    """tiny-qwen3 with 6x logits (final norm scaled): peaked but varied mu (log-probs from ~-8 to ~0),
    so top-K often contains the sampled token and any misalignment shows up as a large error."""
    model, tok = load_policy("tiny-qwen3", seed=2)
    with torch.no_grad():
        model.model.norm.weight.mul_(6.0)
    return model, tok


def _prompts(lengths, vocab_lo=8, vocab_hi=264, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(vocab_lo, vocab_hi, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def teacher_forced(model, prompt, response):
    """log_softmax at each response position, one unpadded sequence: ([L] sampled, [L, V] full)."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0].float()  # [P+L, V]
    logp = logits[len(prompt) - 1 : -1].log_softmax(-1)  # [L, V]: position t predicts token t+1
    return logp.gather(1, torch.tensor(response)[:, None])[:, 0], logp


@torch.no_grad()
def teacher_forced_padded(model, prompts, responses, pad_id):
    """Same as `teacher_forced` but as one left-padded batch with explicit positions (the learner's setting)."""
    seqs = [p + r for p, r in zip(prompts, responses)]
    T = max(map(len, seqs))
    ids = torch.full((len(seqs), T), pad_id)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, T - len(s) :] = torch.tensor(s)
        mask[i, T - len(s) :] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)  # [B, T]: left padding must not shift positions
    logp = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float().log_softmax(-1)  # [B, T, V]
    out = []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        start = T - len(r) - 1  # logits predicting the first response token
        out.append(logp[i, start : T - 1].gather(1, torch.tensor(r)[:, None])[:, 0])
    return out


@contextlib.contextmanager
def logit_bias(model, token_id, value):
    """Add `value` to one token's logit in every forward (generation and teacher forcing alike)."""

    def hook(module, inputs, output):
        output = output.clone()
        output[..., token_id] += value
        return output

    handle = model.get_output_embeddings().register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def check_against_teacher_forcing(model, tok, prompts, gens, topk):
    for p, g in zip(prompts, gens):
        L = len(g.response_ids)
        assert g.logprobs.shape == (L,) and g.logprobs.dtype == np.float32
        ref, full = teacher_forced(model, p, g.response_ids)
        np.testing.assert_allclose(g.logprobs, ref.numpy(), atol=ATOL, rtol=0)
        if topk:
            K = topk
            assert g.topk_ids.shape == (L, K + 1) and g.topk_ids.dtype == np.int64
            assert g.topk_logprobs.shape == (L, K + 1) and g.topk_logprobs.dtype == np.float32
            top_ids, top_lp = g.topk_ids[:, :K], g.topk_logprobs[:, :K]
            assert np.all(np.diff(top_lp, axis=1) <= 0), "top-K must be sorted by descending logprob"
            # values: mu on those ids equals teacher forcing on the same ids
            np.testing.assert_allclose(top_lp, full.gather(1, torch.from_numpy(top_ids)).numpy(), atol=ATOL, rtol=0)
            # and they really are the K largest (compare values: ties may order ids differently)
            np.testing.assert_allclose(top_lp, full.topk(K, dim=1).values.numpy(), atol=ATOL, rtol=0)
            resp = np.asarray(g.response_ids)
            inside = (top_ids == resp[:, None]).any(1)  # [L]
            assert np.all(g.topk_ids[inside, K] == -1)
            assert np.all(np.isneginf(g.topk_logprobs[inside, K]))
            assert np.all(g.topk_ids[~inside, K] == resp[~inside])
            np.testing.assert_allclose(g.topk_logprobs[~inside, K], g.logprobs[~inside], atol=0, rtol=0)
        else:
            assert g.topk_ids is None and g.topk_logprobs is None


# --------------------------------------------------------------------------------------------
# the key property: recorded mu == teacher-forced softmax
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["qwen", "llama", "sharp"])
@pytest.mark.parametrize("topk", [0, 5])
def test_logprobs_equal_teacher_forcing(request, which, topk):
    model, tok = request.getfixturevalue(which)
    prompts = _prompts([1, 5, 12, 30, 7, 19])  # different lengths: left padding in one batch
    gens = HFEngine(model, tok).generate(prompts, max_new_tokens=16, topk=topk, seed=11)
    assert len(gens) == len(prompts)
    check_against_teacher_forcing(model, tok, prompts, gens, topk)
    # the batched, left-padded reference (what the learner computes) agrees too
    ref = teacher_forced_padded(model, prompts, [g.response_ids for g in gens], tok.pad_token_id)
    for g, r in zip(gens, ref):
        np.testing.assert_allclose(g.logprobs, r.numpy(), atol=ATOL, rtol=0)


def test_the_equality_check_can_fail(sharp):
    """Guard against a vacuous test: recorded log-probs are far from uniform, and shifting them
    by one step (the classic off-by-one) breaks the match by orders of magnitude more than ATOL."""
    model, tok = sharp
    prompts = _prompts([4, 9])
    gens = HFEngine(model, tok).generate(prompts, max_new_tokens=12, seed=3)
    for p, g in zip(prompts, gens):
        ref, _ = teacher_forced(model, p, g.response_ids)
        if len(g.response_ids) > 2:
            assert np.abs(g.logprobs[1:] - ref.numpy()[:-1]).max() > 1000 * ATOL
    all_lp = np.concatenate([g.logprobs for g in gens])
    assert all_lp.std() > 0.5


def test_topk_sampled_slot_used_both_ways(sharp):
    """With peaked mu and K=8, some sampled tokens fall inside the top-K and some outside."""
    model, tok = sharp
    prompts = _prompts([3, 6, 9, 12, 15, 18, 21, 24], seed=5)
    gens = HFEngine(model, tok).generate(prompts, max_new_tokens=24, topk=8, seed=5)
    check_against_teacher_forcing(model, tok, prompts, gens, topk=8)
    slot = np.concatenate([g.topk_ids[:, 8] for g in gens])
    assert (slot == -1).any() and (slot >= 0).any()


def test_topk_equal_to_vocab_never_needs_the_extra_slot(qwen):
    model, tok = qwen
    V = model.config.vocab_size
    gens = HFEngine(model, tok).generate(_prompts([3, 5]), max_new_tokens=3, topk=V, seed=0)
    for g in gens:
        assert g.topk_ids.shape == (len(g.response_ids), V + 1)
        assert np.all(g.topk_ids[:, V] == -1)
        # the whole distribution is there: it sums to one
        np.testing.assert_allclose(np.exp(g.topk_logprobs[:, :V]).sum(1), 1.0, atol=1e-5)


def _set_sampling_defaults(gc):
    """What a checkpoint's generation_config may carry; each would change the sampled distribution."""
    gc.do_sample, gc.temperature, gc.top_k, gc.top_p = True, 0.3, 2, 0.5
    gc.repetition_penalty, gc.no_repeat_ngram_size, gc.min_new_tokens = 1.5, 2, 16


def test_model_generation_config_cannot_change_mu(sharp):
    """Checkpoints ship sampling defaults (SmolLM2: temperature 0.2, top_p 0.9). They must not leak
    into sampling, or the recorded mu would not be the distribution sampled from."""
    model, tok = sharp
    saved = copy.deepcopy(model.generation_config)
    try:
        _set_sampling_defaults(model.generation_config)
        own = model.generation_config
        prompts = _prompts([2, 7, 13, 4], seed=9)
        gens = HFEngine(model, tok).generate(prompts, max_new_tokens=16, topk=2, seed=9)
        check_against_teacher_forcing(model, tok, prompts, gens, topk=2)
        # top_k=2 would have kept every sampled token inside the top-2
        assert any((g.topk_ids[:, 2] >= 0).any() for g in gens)
        assert model.generation_config is own and own.min_new_tokens == 16  # the model's own config is back
    finally:
        model.generation_config = saved


# --------------------------------------------------------------------------------------------
# stopping, lengths, budgets
# --------------------------------------------------------------------------------------------


def test_eos_first_gives_single_token_response(qwen):
    model, tok = qwen
    eos = tok.eos_token_id
    prompts = _prompts([3, 8, 1])
    with logit_bias(model, eos, 60.0):
        gens = HFEngine(model, tok).generate(prompts, max_new_tokens=10, topk=4, seed=0)
        check_against_teacher_forcing(model, tok, prompts, gens, topk=4)
    for g in gens:
        assert g.response_ids == [eos]
        assert g.finish_reason == "stop"
        assert g.logprobs.shape == (1,) and g.logprobs[0] > -1e-3
        assert g.topk_ids.shape == (1, 5) and g.topk_ids[0, 0] == eos and g.topk_ids[0, 4] == -1


def test_eos_mid_sequence(qwen):
    """Rows stop at different steps; later steps of finished rows must not leak into their results."""
    model, tok = qwen
    eos = tok.eos_token_id
    prompts = _prompts([2, 4, 6, 8, 10, 12, 14, 16, 3, 5, 7, 9, 11, 13, 15, 17])
    with logit_bias(model, eos, 2.6):  # P(eos) ~ 5% per step
        gens = HFEngine(model, tok).generate(prompts, max_new_tokens=24, topk=3, seed=1)
        check_against_teacher_forcing(model, tok, prompts, gens, topk=3)
    reasons = {g.finish_reason for g in gens}
    assert reasons == {"stop", "length"}
    stop_lengths = set()
    for g in gens:
        ids = g.response_ids
        assert eos not in ids[:-1] and tok.pad_token_id not in ids[:-1]
        if g.finish_reason == "stop":  # mostly the biased EOS; the pad token stops too (test below)
            assert ids[-1] in (eos, tok.pad_token_id) and 1 <= len(ids) <= 24
            stop_lengths.add(len(ids))
        else:
            assert len(ids) == 24 and ids[-1] != eos
    assert len(stop_lengths) > 1


def test_pad_token_also_stops(qwen):
    model, tok = qwen
    pad = tok.pad_token_id
    assert pad != tok.eos_token_id
    with logit_bias(model, pad, 60.0):
        gens = HFEngine(model, tok).generate(_prompts([5, 2]), max_new_tokens=6, seed=0)
    assert all(g.response_ids == [pad] and g.finish_reason == "stop" for g in gens)


def test_no_stop_tokens_runs_every_row_to_its_budget(qwen):
    """stop_token_ids=[]: the model's own eos must not end a row either (transformers 4.51 copied it
    from the model's generation_config into an unset eos_token_id)."""
    model, tok = qwen
    prompts = _prompts([3, 5])
    with logit_bias(model, tok.eos_token_id, 8.0):
        gens = HFEngine(model, tok, stop_token_ids=[]).generate(prompts, max_new_tokens=6, seed=0)
        check_against_teacher_forcing(model, tok, prompts, gens, topk=0)
    assert all(len(g.response_ids) == 6 and g.finish_reason == "length" for g in gens)
    assert any(tok.eos_token_id in g.response_ids[:-1] for g in gens)  # eos was sampled and did not stop


def test_llama_stops_on_eot(llama):
    model, tok = llama
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    assert tok.eos_token_id == eot
    with logit_bias(model, eot, 60.0):
        gens = HFEngine(model, tok).generate(_prompts([5, 2]), max_new_tokens=6, seed=0)
    assert all(g.response_ids == [eot] and g.finish_reason == "stop" for g in gens)


@pytest.mark.parametrize("max_new_tokens", [1, 7])
def test_max_new_tokens_respected(qwen, max_new_tokens):
    model, tok = qwen
    with logit_bias(model, tok.eos_token_id, -1e4), logit_bias(model, tok.pad_token_id, -1e4):
        gens = HFEngine(model, tok).generate(_prompts([4, 9, 1]), max_new_tokens=max_new_tokens, topk=2, seed=0)
    for g in gens:
        assert len(g.response_ids) == max_new_tokens == len(g.logprobs) == len(g.topk_ids)
        assert g.finish_reason == "length"


def test_context_limit_trims_each_row_and_rejects_overlong_prompts(qwen):
    model, tok = qwen
    engine = HFEngine(model, tok, max_context=40)
    prompts = _prompts([10, 35, 39])
    with logit_bias(model, tok.eos_token_id, -1e4), logit_bias(model, tok.pad_token_id, -1e4):
        gens = engine.generate(prompts, max_new_tokens=20, seed=0)
        check_against_teacher_forcing(model, tok, prompts, gens, topk=0)
    assert [len(g.response_ids) for g in gens] == [20, 5, 1]
    assert all(g.finish_reason == "length" for g in gens)

    with pytest.raises(PromptTooLongError) as err:
        engine.generate(_prompts([10, 40, 5, 41]), max_new_tokens=4)
    assert err.value.indices == [1, 3] and err.value.lengths == [40, 41] and err.value.max_context == 40
    assert "context of 40 tokens" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_default_context_is_the_models(qwen):
    model, tok = qwen
    engine = HFEngine(model, tok)
    assert engine.max_context == model.config.max_position_embeddings == 2048
    with pytest.raises(PromptTooLongError):
        engine.generate([[10] * 2048], max_new_tokens=1)


def test_input_validation(qwen):
    engine = HFEngine(*qwen)
    assert engine.generate([], max_new_tokens=4) == []
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[5], []], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([[5]], max_new_tokens=0)
    with pytest.raises(ValueError, match="topk"):
        engine.generate([[5]], max_new_tokens=1, topk=-1)
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([[5]], max_new_tokens=1, topk=10_000)


# --------------------------------------------------------------------------------------------
# randomness, modes, wrappers
# --------------------------------------------------------------------------------------------


def test_seeded_generation_is_reproducible_and_private(qwen):
    engine = HFEngine(*qwen)
    prompts = _prompts([3, 11, 6])
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = engine.generate(prompts, max_new_tokens=12, topk=3, seed=7)
    assert torch.equal(torch.get_rng_state(), state), "a seeded call must not touch the global RNG"
    b = engine.generate(prompts, max_new_tokens=12, topk=3, seed=7)
    c = engine.generate(prompts, max_new_tokens=12, topk=3, seed=8)
    for x, y in zip(a, b):
        assert x.response_ids == y.response_ids and x.finish_reason == y.finish_reason
        np.testing.assert_array_equal(x.logprobs, y.logprobs)
        np.testing.assert_array_equal(x.topk_ids, y.topk_ids)
    assert [g.response_ids for g in a] != [g.response_ids for g in c]
    # seed=None follows (and advances) the global RNG
    torch.manual_seed(5)
    before = torch.get_rng_state()
    d = engine.generate(prompts, max_new_tokens=12, seed=None)
    assert not torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(5)
    e = engine.generate(prompts, max_new_tokens=12, seed=None)
    assert [g.response_ids for g in d] == [g.response_ids for g in e]


def test_evaluation_temperature_zero_is_greedy(qwen):
    """--eval-temperature 0: the most likely token each step, whatever the seed; the engine's own sampling
    (temperature None) draws other replies from other seeds."""
    engine = HFEngine(*qwen)
    prompts = _prompts([3, 11, 6])
    a, b = (engine.generate(prompts, max_new_tokens=8, seed=s, temperature=0.0) for s in (1, 2))
    assert [g.response_ids for g in a] == [g.response_ids for g in b]
    for p, g in zip(prompts, a):  # each token is the argmax given the prompt and the tokens before it
        ids = torch.tensor([p + g.response_ids])
        logits = engine.model(input_ids=ids).logits[0, len(p) - 1:-1]
        assert logits.argmax(-1).tolist() == g.response_ids
    c, d = (engine.generate(prompts, max_new_tokens=8, seed=s) for s in (1, 2))
    assert [g.response_ids for g in c] != [g.response_ids for g in d]


def test_training_mode_is_restored(qwen):
    model, tok = qwen
    model.train()
    try:
        HFEngine(model, tok).generate(_prompts([3]), max_new_tokens=2, seed=0)
        assert model.training
    finally:
        model.eval()
    HFEngine(model, tok).generate(_prompts([3]), max_new_tokens=2, seed=0)
    assert not model.training


def test_lora_wrapped_policy():
    model, tok = load_policy("tiny-llama", seed=4)
    peft_model = apply_lora(model, rank=4, alpha=8)
    with torch.no_grad():  # make the adapter matter (B starts at zero)
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    _set_sampling_defaults(model.generation_config)  # the wrapped model's defaults must not leak either
    prompts = _prompts([4, 9, 2])
    gens = HFEngine(peft_model, tok).generate(prompts, max_new_tokens=8, topk=3, seed=0)
    check_against_teacher_forcing(peft_model, tok, prompts, gens, topk=3)


def test_generation_dataclass_is_the_contract():
    names = [f.name for f in dataclasses.fields(Generation)]
    assert names == ["response_ids", "logprobs", "topk_ids", "topk_logprobs", "finish_reason"]


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 20), min_size=1, max_size=5),
    max_new=st.integers(1, 10),
    topk=st.integers(0, 4),
    eos_bias=st.sampled_from([0.0, 3.0]),
    seed=st.integers(0, 2**16),
)
def test_invariants_for_any_batch(qwen, lengths, max_new, topk, eos_bias, seed):
    model, tok = qwen
    prompts = _prompts(lengths, seed=seed)
    with logit_bias(model, tok.eos_token_id, eos_bias):
        gens = HFEngine(model, tok).generate(prompts, max_new_tokens=max_new, topk=topk, seed=seed)
        check_against_teacher_forcing(model, tok, prompts, gens, topk)
    for g in gens:
        assert 1 <= len(g.response_ids) <= max_new
        assert (g.finish_reason == "stop") == (g.response_ids[-1] in (tok.eos_token_id, tok.pad_token_id))


def test_samples_follow_the_recorded_mu(sharp):
    """Statistical check that tokens are drawn from the recorded distribution itself (a warper left
    on after the recorder, e.g. top-k or temperature, would record p but sample from q != p)."""
    model, tok = sharp
    N = 4096
    prompt = _prompts([6], seed=21)[0]
    gens = HFEngine(model, tok).generate([prompt] * N, max_new_tokens=1, seed=21)
    _, full = teacher_forced(model, prompt, [gens[0].response_ids[0]])
    logp = full[0].double()  # [V] the one next-token distribution all rows share
    p = logp.exp()
    sampled = torch.tensor([g.response_ids[0] for g in gens])  # [N]
    np.testing.assert_allclose(np.array([g.logprobs[0] for g in gens]), logp[sampled].numpy(), atol=ATOL)
    # 1) mean log p(a) must match E_p[log p] = -H(p)   (temperature < 1 or truncation raises it)
    lp = logp[sampled]
    z = (lp.mean() - (p * logp).sum()) / (((p * logp**2).sum() - (p * logp).sum() ** 2).sqrt() / N**0.5)
    assert abs(z) < 5, f"mean log-prob of samples is {z:.1f} sigma off"
    # 2) chi-square of the token counts against N * p, over tokens with enough expected mass
    counts = torch.bincount(sampled, minlength=p.numel()).double()
    expected = N * p
    big = expected >= 5
    rest_obs, rest_exp = counts[~big].sum(), expected[~big].sum()
    chi2 = (((counts[big] - expected[big]) ** 2) / expected[big]).sum() + (rest_obs - rest_exp) ** 2 / rest_exp
    dof = int(big.sum())
    assert chi2 < dof + 8 * (2 * dof) ** 0.5, f"chi2 {chi2:.0f} for {dof} dof"


def _sharing(lengths, shared=24, seed=0):
    """Prompts whose first `shared` tokens are the same (a group's prompt, a game's instructions)."""
    head = _prompts([shared], seed=seed + 1)[0]
    return [head + p for p in _prompts(lengths, seed=seed)]


@pytest.mark.parametrize("topk", [0, 3])
def test_a_shared_prompt_is_prefilled_once_and_changes_nothing(qwen, topk):
    """Prompts sharing 24 tokens: one forward of those (a batch of one), then the rests as one batch, then one
    forward per step; mu equals teacher forcing on each row alone, and greedy decoding equals transformers'
    `generate` token for token on each prompt alone."""
    model, tok = qwen
    engine = HFEngine(model, tok)
    prompts = _sharing([3, 11, 6, 1])
    calls = []
    hook = model.get_decoder().register_forward_hook(
        lambda m, a, kw, out: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        gens = engine.generate(prompts, max_new_tokens=5, topk=topk, seed=3)
    finally:
        hook.remove()
    greedy = engine.generate(prompts, max_new_tokens=5, temperature=0.0)
    assert calls[0] == (1, 24) and calls[1] == (4, 11)  # the shared 24 once, then the rests up to 11 tokens
    assert calls[2:] == [(4, 1)] * (len(calls) - 2) and len(calls) - 2 < 5  # a step per token after the first
    check_against_teacher_forcing(model, tok, prompts, gens, topk=topk)
    for p, g in zip(prompts, greedy):
        out = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=len(g.response_ids),
                             eos_token_id=engine.stop_ids, pad_token_id=engine.pad_id, top_k=None, top_p=None)
        assert out[0, len(p):].tolist() == g.response_ids


def test_prompts_sharing_little_are_prefilled_together(qwen):
    model, tok = qwen
    prompts = _sharing([3, 5], shared=MIN_SHARED_PROMPT - 1)
    calls = []
    hook = model.get_decoder().register_forward_hook(
        lambda m, a, kw, out: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        HFEngine(model, tok).generate(prompts, max_new_tokens=2, seed=0)
    finally:
        hook.remove()
    assert calls[0] == (2, MIN_SHARED_PROMPT - 1 + 5)
    # never a prompt's last token: its logits start the sampling
    assert plan_prefixes([[1, 2, 3], [1, 2, 3]], [2, 2], min_shared=2) == PrefixPlan((0, 0), (2,))
    assert plan_prefixes([[1, 2, 3], [1, 5, 3, 4]], [2, 3], min_shared=1) == PrefixPlan((0, 0), (1,))


def test_groups_of_prompts_each_prefill_their_prompt_once(qwen):
    """Two groups of two prompts (GRPO's samples of two questions), interleaved, sharing 24 and 30 tokens within a
    group and none across: one forward of the two prefixes (padded to 30), then the four rests; mu equals teacher
    forcing and greedy decoding equals `generate` on each prompt alone."""
    model, tok = qwen
    engine = HFEngine(model, tok)
    a, b = _sharing([3, 7], shared=24, seed=0), _sharing([5, 2], shared=30, seed=7)
    prompts = [a[0], b[0], a[1], b[1]]
    calls = []
    hook = model.get_decoder().register_forward_hook(
        lambda m, a, kw, out: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        gens = engine.generate(prompts, max_new_tokens=4, topk=3, seed=1)
    finally:
        hook.remove()
    assert calls[0] == (2, 30) and calls[1] == (4, 7)  # the rests: 3, 5, 7, 2 tokens after their group's prefix
    check_against_teacher_forcing(model, tok, prompts, gens, topk=3)
    greedy = engine.generate(prompts, max_new_tokens=4, temperature=0.0)
    for p, g in zip(prompts, greedy):
        out = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=len(g.response_ids),
                             eos_token_id=engine.stop_ids, pad_token_id=engine.pad_id, top_k=None, top_p=None)
        assert out[0, len(p):].tolist() == g.response_ids


def test_rows_that_could_reach_a_sliding_window_run_alone(qwen):
    """With a sliding window shorter than prompt + budget each row runs unpadded (its cache slots are its
    positions); the merged batch still records mu exactly, rows ending at different lengths."""
    model, tok = qwen
    prompts = _sharing([3, 11, 6], shared=20)
    calls = []
    hook = model.get_decoder().register_forward_hook(
        lambda m, a, kw, out: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    saved = model.config.sliding_window
    model.config.sliding_window = 16
    try:
        with logit_bias(model, tok.eos_token_id, 2.0):
            gens = HFEngine(model, tok).generate(prompts, max_new_tokens=6, topk=3, seed=5)
            check_against_teacher_forcing(model, tok, prompts, gens, topk=3)
    finally:
        model.config.sliding_window = saved
        hook.remove()
    assert all(c[0] == 1 for c in calls)  # every forward a single row
    assert len({len(g.response_ids) for g in gens}) > 1 or all(g.finish_reason == "length" for g in gens)
