"""`--env-option history=chat`: the episode as a conversation, token in, token out.

Turn t+1's prompt is turn t's prompt ids + the ids the engine sampled + the end of the assistant's turn (when the
response did not sample it) + the reply as the next user turn: nothing earlier is re-tokenized, so the learner
scores exactly the ids that were sampled ("retokenization drift", which verl and SkyRL test for, is zero). The
control: `concat_with_action` writes earlier moves back as text, and a move sampled in a non-canonical split of
its text is then scored as other ids.
"""

from __future__ import annotations

import numpy as np
import pytest

from oat_dppo.agent import PromptFormat, play_episodes
from oat_dppo.agent.types import Turn
from oat_dppo.config import ConfigError, TrainConfig
from oat_dppo.engine.base import stop_token_ids
from oat_dppo.envs import chat_turn, make_env
from oat_dppo.learner import collate

GAME = "game:GuessTheNumber-v0-easy"
# SmolLM2 (the real model whose template is in question) takes a minute to load and play here
real_model = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    from oat_dppo.models import load_policy

    return load_policy("smollm2")


def _play(model, tok, history: str, seeds=(1, 2, 3, 4)):
    from oat_dppo.engine.hf import HFEngine

    fmt = PromptFormat(tok, "chatml", None, "\\boxed{")
    engine = HFEngine(model, tok, stop_token_ids=stop_token_ids(tok, None, fmt.stop_token_ids()))
    envs = [make_env(GAME, seed=i, history=history) for i in range(len(seeds))]
    episodes, stats = play_episodes(engine, envs, list(seeds), fmt, max_new_tokens=6, generation_seed=0)
    assert stats.env_errors == 0
    return fmt, episodes


@real_model
def test_every_earlier_move_is_scored_as_the_ids_that_were_sampled(smollm2):
    """SmolLM2 on a real GEM game, chat history: every turn's prompt starts with the turn before, prompt and
    sampled ids, and the learner's packed row holds those ids where the move was sampled."""
    model, tok = smollm2
    fmt, episodes = _play(model, tok, "chat")
    pairs = [(a, b) for e in episodes for a, b in zip(e.turns, e.turns[1:])]
    assert len(pairs) >= 4  # multi-turn episodes
    for a, b in pairs:
        assert b.prompt_ids[:len(a.prompt_ids) + len(a.response_ids)] == a.prompt_ids + a.response_ids
        assert "<|im_start|>user\n" in b.prompt_text and b.prompt_text.endswith("<|im_start|>assistant\n\\boxed{")
    a, b = pairs[0]
    batch = collate([b], tok.pad_token_id)
    start = len(a.prompt_ids)
    assert batch.input_ids[0, start:start + len(a.response_ids)].tolist() == a.response_ids


@real_model
def test_the_continuation_is_the_models_own_chat_template(smollm2):
    """The pieces render what SmolLM2's tokenizer renders for the same conversation."""
    _, tok = smollm2
    fmt = PromptFormat(tok, "chatml", "Be brief.", "")
    first_text, first = fmt.encode("Guess a number.")
    response = tok("7<|im_end|>", add_special_tokens=False)["input_ids"]
    text, ids = fmt.continue_chat(first, response, "Higher.")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Guess a number."},
                {"role": "assistant", "content": "7"}, {"role": "user", "content": "Higher."}]
    assert text == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ids[:len(first) + len(response)] == first + response


@real_model
def test_a_response_cut_by_the_budget_gets_the_end_of_its_turn_once(smollm2):
    _, tok = smollm2
    fmt = PromptFormat(tok, "chatml", None, "")
    _, first = fmt.encode("Go.")
    end = tok("<|im_end|>", add_special_tokens=False)["input_ids"]
    cut = tok("12", add_special_tokens=False)["input_ids"]
    _, ids = fmt.continue_chat(first, cut, "Again.")
    assert ids[len(first) + len(cut):][:len(end)] == end  # closed by the loop
    _, ids = fmt.continue_chat(first, cut + end, "Again.")
    assert ids[len(first) + len(cut) + len(end):][:len(end)] != end  # sampled: not closed twice


@real_model
def test_text_history_scores_other_ids_than_were_sampled(smollm2):
    """The control: a move sampled as a non-canonical split of its text (letter by letter, where the tokenizer
    writes whole words). Chat history keeps the sampled ids; concat_with_action re-tokenizes the text, and the ids the
    learner would score for that move are not the sampled ones."""
    _, tok = smollm2
    canonical = tok("5} thanks", add_special_tokens=False)["input_ids"]
    split = [i for ch in "5} thanks" for i in tok(ch, add_special_tokens=False)["input_ids"]]
    assert split != canonical  # the test needs a split the tokenizer would not write
    fmt = PromptFormat(tok, "chatml", None, "\\boxed{")

    def contains(seq, sub):
        return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))

    for history, kept in (("chat", True), ("concat_with_action", False)):
        env = make_env(GAME, seed=0, history=history)
        obs, _ = env.reset(seed=3)
        _, prompt_ids = fmt.encode(obs)
        turn = Turn(prompt_ids=prompt_ids, response_ids=split, behavior_logprobs=np.zeros(len(split), np.float32),
                    reward=0.0, done=False, truncated=False, well_formed=True, finish_reason="length")
        obs, *_ = env.step(fmt.decode(split))
        _, next_ids = fmt.continue_chat(turn.prompt_ids, turn.response_ids, obs) if history == "chat" \
            else fmt.encode(obs)
        assert contains(next_ids, split) is kept, history
        env.close()


def test_chat_history_needs_a_chat_template():
    from oat_dppo.components import resolve_template

    cfg = TrainConfig(env=GAME, template="raw", env_option=("history=chat",))
    with pytest.raises(ConfigError, match="history=chat needs a chat template"):
        resolve_template(cfg, None)
    assert resolve_template(TrainConfig(env=GAME, template="llama3", env_option=("history=chat",)), None) == "llama3"
    end, turn = chat_turn("llama3", "Higher.")
    assert end == "<|eot_id|>" and turn.startswith("<|start_header_id|>user") and "Higher." in turn
