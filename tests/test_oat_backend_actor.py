"""The Oat backend's actor side on CPU: `VLLMEngine`'s extraction of mu and mu's top-K from
vLLM-shaped outputs (the fake's `vllm.outputs` / `vllm.sequence.Logprob`, vLLM 0.8.4's layout), and
`DPPOActor` playing real GEM episodes through the shared agent loop over a stand-in for `vllm.LLM`
whose outputs are sampled from a real tiny HF model. The real `vllm.LLM` is never constructed
(Oat's `ActorBase.init` retries it for about two minutes); `vllm.LLM` is replaced by the stand-in.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import pickle
from unittest import mock

import numpy as np
import pytest
import torch

if importlib.util.find_spec("oat") is None:
    pytest.skip("oat-llm is not installed; `make setup-oat` (docs/dev_oat_cpu.md)", allow_module_level=True)

import oat_harness as H  # noqa: E402
import vllm  # noqa: E402  (the fake where vLLM is missing)
from helpers.fake_vllm import StandInLLM, completion  # noqa: E402
from oat.args import default_args_validation  # noqa: E402
from vllm.outputs import RequestOutput  # noqa: E402
from vllm.sequence import Logprob  # noqa: E402

from oat_dppo.agent import (  # noqa: E402
    PromptFormat,
    combine_eval,  # noqa: E402
    play_episodes,
)
from oat_dppo.agent.reply_effect import Case, ModelMovePolicy, ScoredMovePolicy, reply_effect  # noqa: E402
from oat_dppo.backends.oat.actor import DPPOActor  # noqa: E402
from oat_dppo.backends.oat.args import DPPOArgs, finalize  # noqa: E402
from oat_dppo.backends.oat.data import DPPOEpisodeData, DPPOTransitionData  # noqa: E402
from oat_dppo.backends.oat.learner import DPPOLearner  # noqa: E402
from oat_dppo.engine.base import PromptTooLongError  # noqa: E402
from oat_dppo.engine.vllm import VLLMEngine, generation_from_completion  # noqa: E402
from oat_dppo.envs import make_env  # noqa: E402

NINF = float("-inf")


# ---------------------------------------------------------------------------------------------
# Extraction from vLLM-shaped outputs
# ---------------------------------------------------------------------------------------------


def test_sampled_token_inside_and_outside_the_topk():
    K = 3
    maps = [
        # position 0: sampled 11 is the top-2 token: K entries
        {10: Logprob(-0.5, 1), 11: Logprob(-1.0, 2), 12: Logprob(-2.0, 3)},
        # position 1: sampled 99 has rank 7: K + 1 entries (vLLM adds it)
        {20: Logprob(-0.1, 1), 21: Logprob(-3.0, 2), 22: Logprob(-4.0, 3), 99: Logprob(-6.5, 7)},
    ]
    g = generation_from_completion(completion([11, 99], maps), topk=K)
    assert g.response_ids == [11, 99]
    assert g.logprobs.dtype == np.float32 and g.logprobs.tolist() == [-1.0, -6.5]
    assert g.topk_ids.shape == (2, K + 1) and g.topk_ids.dtype == np.int64
    assert g.topk_ids.tolist() == [[10, 11, 12, -1], [20, 21, 22, 99]]
    assert g.topk_logprobs[0, :K].tolist() == [-0.5, -1.0, -2.0] and g.topk_logprobs[0, K] == NINF
    assert g.topk_logprobs[1].tolist() == pytest.approx([-0.1, -3.0, -4.0, -6.5])
    assert g.finish_reason == "stop"


def test_topk_order_is_by_logprob_and_inf_entries_are_kept_as_vllm_gives_them():
    K = 4
    # Dict order is arbitrary; a -inf entry (a masked vocabulary slot that made the top-K) stays a
    # real slot with mu = 0, as the HF engine records it; a short map leaves unused slots.
    maps = [{7: Logprob(NINF, 3), 5: Logprob(-0.2, 1), 6: Logprob(-1.9, 2)}]
    g = generation_from_completion(completion([5], maps, finish="length"), topk=K)
    assert g.topk_ids.tolist() == [[5, 6, 7, -1, -1]]
    assert g.topk_logprobs[0, :2].tolist() == pytest.approx([-0.2, -1.9])
    assert np.isneginf(g.topk_logprobs[0, 2:]).all()
    assert g.finish_reason == "length"


def test_tied_rank_at_the_boundary_counts_by_entries():
    # vLLM ranks the sampled token by "how many are strictly better": a tie can give it rank <= K
    # although it is not among the K returned ids. K + 1 entries means it is outside.
    K = 2
    maps = [{1: Logprob(-0.5, 1), 2: Logprob(-1.0, 2), 3: Logprob(-1.0, 2)}]
    g = generation_from_completion(completion([3], maps), topk=K)
    assert g.topk_ids.tolist() == [[1, 2, 3]]


def test_binary_strategies_get_only_the_sampled_logprob():
    maps = [{4: Logprob(-0.7, 2), 9: Logprob(-0.2, 1)}]  # logprobs=1: top-1 + sampled
    g = generation_from_completion(completion([4], maps), topk=0)
    assert g.logprobs.tolist() == pytest.approx([-0.7]) and g.topk_ids is None and g.topk_logprobs is None


@pytest.mark.parametrize("maps", [None, [{}], [{1: Logprob(-1.0, 1)}, {2: Logprob(-1.0, 1)}]])
def test_missing_or_misaligned_logprobs_raise(maps):
    with pytest.raises(RuntimeError, match="log-prob"):
        generation_from_completion(completion([3], maps), topk=0)


def test_engine_builds_one_request_per_prompt_and_checks_the_context():
    seen = {}

    def generate_fn(prompts, params):
        seen["prompts"], seen["params"] = prompts, params
        return [RequestOutput(str(i), None, p["prompt_token_ids"], None,
                              [completion([1], [{1: Logprob(-0.1, 1)}])], True) for i, p in enumerate(prompts)]

    eng = VLLMEngine(generate_fn, vllm.SamplingParams, max_context=10, stop_token_ids=[2, 0, 2])
    gens = eng.generate([[5, 6, 7], [5] * 8], max_new_tokens=4, topk=3, seed=100)
    assert len(gens) == 2
    p0, p1 = seen["params"]
    assert (p0.max_tokens, p1.max_tokens) == (4, 2)  # cut to the context
    assert (p0.temperature, p0.top_p, p0.top_k, p0.n) == (1.0, 1.0, -1, 1)
    assert p0.logprobs == 3 and p0.stop_token_ids == [2, 0]
    assert (p0.seed, p1.seed) == (100, 101)  # group members share a prompt, not a sample
    assert seen["prompts"][0] == {"prompt_token_ids": [5, 6, 7]}
    with pytest.raises(PromptTooLongError) as e:
        eng.generate([[1] * 3, [1] * 10], max_new_tokens=4)
    assert e.value.indices == [1]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: one intra-op thread


@pytest.fixture(scope="module")
def tok():
    return H.byte_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return H.tiny_policy(tok, "qwen3", seed=3).eval()


def dppo_args(**overrides) -> DPPOArgs:
    kw = {**H.CPU_ARGS, **H.SMALL_ARGS, "env": "game:GuessTheNumber-v0-easy", "template": "qwen3",
          "response_prefix": "\\boxed{7} ",
          "generate_max_length": 6, "max_model_len": 4096, "max_turns": 3, **overrides}
    args = DPPOArgs(**kw)
    finalize(args, world_size=1)
    return default_args_validation(args)


def make_actor(args, model, tok) -> DPPOActor:
    """Oat's own constructor and `init` (ours, then ActorBase's), with vllm.LLM replaced."""
    import oat.actors.base

    def no_retry(seconds):  # ActorBase.init retries a failing vllm.LLM(...) for ~2 min: fail now
        raise AssertionError("vllm.LLM(...) raised inside ActorBase.init (see the printed error)")

    actor = DPPOActor(ipc_server=None, vllm_args={"model": "tiny"}, args=args)
    with mock.patch.object(vllm, "LLM", lambda **kw: StandInLLM(hf_model=model, hf_tokenizer=tok, **kw)), \
            mock.patch.object(oat.actors.base.time, "sleep", no_retry):
        actor.init(0, "/nonexistent")
    return actor


@torch.no_grad()
def teacher_forced(model, prompt_ids, response_ids):
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    return model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float().log_softmax(-1)  # [L, V]


def test_play_episodes_with_vllm_engine_on_a_real_multi_turn_env(tok, model):
    """The shared agent loop over VLLMEngine: mu and mu's top-K are the model's distribution at the
    recorded positions, across turns of a real GEM game; a sampled token outside the top-K lands in
    slot K."""
    K = 2  # a near-uniform random model samples outside its top-2 almost always
    llm = StandInLLM(hf_model=model, hf_tokenizer=tok, max_logprobs=20)
    engine = VLLMEngine(lambda p, s: llm.generate(p, s), vllm.SamplingParams, max_context=4096,
                        stop_token_ids=[tok.eos_token_id])
    envs = [make_env("game:GuessTheNumber-v0-easy", seed=i, max_turns=3) for i in range(3)]
    # A pre-filled guess keeps the game going (a random model writes no well-formed action).
    prompt = PromptFormat(tok, "qwen3", response_prefix="\\boxed{7} ")
    episodes, stats = play_episodes(engine, envs, [11, 12, 13], prompt, max_new_tokens=5, topk=K, generation_seed=7)
    turns = [t for e in episodes for t in e.turns]
    assert stats.env_errors == 0 and len(turns) >= 4 and max(len(e.turns) for e in episodes) > 1  # multi-turn
    outside = 0
    for t in turns:
        lp = teacher_forced(model, t.prompt_ids, t.response_ids)  # [L, V]
        resp = torch.tensor(t.response_ids)
        assert np.allclose(t.behavior_logprobs, lp.gather(1, resp[:, None])[:, 0].numpy(), atol=1e-5)
        top_lp, top_ids = lp.topk(K)
        assert (t.topk_ids[:, :K] == top_ids.numpy()).all()
        assert np.allclose(t.topk_logprobs[:, :K], top_lp.numpy(), atol=1e-5)
        inside = (top_ids == resp[:, None]).any(-1).numpy()
        assert (t.topk_ids[:, K] == np.where(inside, -1, resp.numpy())).all()
        outside += int((~inside).sum())
    assert outside > 0
    for e in envs:
        e.close()


@pytest.mark.parametrize("template, marker", [("chatml", "<|im_end|>"), ("llama3", "<|eot_id|>"), ("raw", None)])
def test_actor_stops_at_the_templates_end_of_turn_token(template, marker):
    """As the local engines: EOS, pad and the template's end-of-turn token. tiny-llama ends documents
    with <|eot_id|>; under chatml a turn ends at <|im_end|>, which must stop vLLM too."""
    from oat_dppo.models import load_policy

    llama, llama_tok = load_policy("tiny-llama", seed=0)
    actor = make_actor(dppo_args(template=template), llama, llama_tok)
    stops = actor.engine.stop_token_ids
    assert llama_tok.eos_token_id in stops and llama_tok.pad_token_id in stops
    if marker is not None:
        assert llama_tok.convert_tokens_to_ids(marker) in stops
    assert (llama_tok.convert_tokens_to_ids("<|im_end|>") in stops) == (template == "chatml")
    assert actor.eval_engine.stop_token_ids == stops


def test_actor_init_sets_max_logprobs_before_vllm_is_built(tok, model):
    args = dppo_args(trust_region="dppo_topk_kl", topk=32, vllm_max_logprobs=None)
    assert args.vllm_max_logprobs == 32
    actor = make_actor(args, model, tok)
    assert actor.llm.vllm_args["max_logprobs"] == 32
    assert "worker_extension_cls" in actor.llm.vllm_args  # Oat's ActorBase.init ran
    assert actor.topk == 32 and actor.oracle is None


@pytest.mark.parametrize("group_size", [1, 2])
def test_actor_rollout_sends_every_turn_of_exact_counts_of_episodes(tok, model, group_size):
    """Oat's collector splits the actor's list evenly between learners: the count is of episodes
    (slots x group size), and every turn those episodes played travels in them (none sampled away)."""
    K = 3
    args = dppo_args(trust_region="dppo_topk_tv", topk=K, num_samples=group_size,
                     advantage="group" if group_size > 1 else "batch_norm")
    actor = make_actor(args, model, tok)
    episodes, info = actor.rollout(n_slots=3)
    assert len(episodes) == 3 * group_size  # what Oat's collector splits between learners
    assert all(isinstance(e, DPPOEpisodeData) for e in episodes)
    assert {tuple(sorted(e.info)) for e in episodes} == {tuple(sorted(info))}  # one structure: averaged by Oat
    assert all(isinstance(v, float) for v in info.values())
    turns = [t for e in episodes for t in e.turns]
    assert len(turns) == info["actor/turns_trained"] == pytest.approx(info["actor/turns_mean"] * len(episodes))
    assert len(turns) > len(episodes)  # a multi-turn game: more turns than episodes, all of them sent
    uncredited = sum(t.advantage == 0.0 for t in turns) / len(turns)  # what a group baseline left without credit
    assert info["actor/uncredited_turn_rate"] == pytest.approx(uncredited)
    for e in episodes:
        assert e.response_ids == [i for t in e.turns for i in t.response_ids]  # Oat's collector metrics read these
        assert len(e.rewards) == len(e.turns) and e.turns[0].prompt_ids == e.prompt_ids
    for t in turns:
        assert isinstance(t, DPPOTransitionData)
        L = len(t.response_ids)
        assert len(t.response_logprobs) == L and len(t.rewards) == L
        assert t.topk_ids.shape == (L, K + 1) and t.topk_ids.dtype == np.int32
        assert t.topk_logprobs.dtype == np.float32
        assert t.advantage is not None and math.isfinite(t.advantage)
        lp = teacher_forced(model, t.prompt_ids, t.response_ids)
        assert np.allclose(t.response_logprobs, lp.gather(1, torch.tensor(t.response_ids)[:, None])[:, 0], atol=1e-5)
    # Through Oat's plasma store the list is pickled: classes by reference, arrays intact.
    back = pickle.loads(pickle.dumps(episodes))
    assert type(back[0]) is DPPOEpisodeData and type(back[0].turns[0]) is DPPOTransitionData
    assert (back[0].turns[0].topk_ids == episodes[0].turns[0].topk_ids).all()


def test_chat_history_sends_each_turn_as_the_conversation_so_far(tok, model):
    """`--env-option history=chat` on Oat's actor: every turn's prompt is the turn before, its prompt and the
    ids vLLM sampled, continued by the reply (token in, token out: no earlier move re-tokenized)."""
    actor = make_actor(dppo_args(env_option=("history=chat",)), model, tok)
    episodes, _ = actor.rollout(n_slots=2)
    pairs = [(a, b) for e in episodes for a, b in zip(e.turns, e.turns[1:])]
    assert pairs
    for a, b in pairs:
        assert list(b.prompt_ids[:len(a.prompt_ids) + len(a.response_ids)]) == list(a.prompt_ids) + list(a.response_ids)
    # Oat's learner scores each episode in one row (one forward), every turn trained where it was sampled
    from oat_dppo.backends.oat.data import to_token_batch

    learner = H.make_stock_learner(args=dppo_args(env_option=("history=chat",)), learner_cls=DPPOLearner,
                                   model=copy.deepcopy(model), tokenizer=tok)
    batch, trained, rows = to_token_batch(H.collate(learner, episodes), 0, tok.pad_token_id)
    assert len(rows) == len([e for e in episodes if e.turns]) < sum(len(e.turns) for e in episodes)
    assert int((batch.response_mask & trained).sum()) == sum(len(t.response_ids) for e in episodes for t in e.turns)


def test_single_turn_env_sends_every_episode_as_one_turn(tok, model):
    args = dppo_args(env="rg:arc_1d", num_samples=2, advantage="group", max_turns=None)
    actor = make_actor(args, model, tok)
    episodes, info = actor.rollout(n_slots=2)
    assert len(episodes) == 4 and all(len(e.turns) == 1 for e in episodes)
    assert info["actor/rollout_rounds"] == 1.0 and info["actor/turns_trained"] == 4.0
    assert info["actor/turns_mean"] == 1.0
    # Group baseline: the two episodes of a start seed have advantages that sum to zero.
    advs = [e.turns[0].advantage for e in episodes]
    assert advs[0] + advs[1] == pytest.approx(0.0) and advs[2] + advs[3] == pytest.approx(0.0)


def test_actor_step_serializes_through_oats_ipc_client(tok, model):
    args = dppo_args()
    actor = make_actor(args, model, tok)
    store = {}

    class Ipc:  # stands in for Oat's plasma client (launchpad's courier node is not available here)
        def serialize_ipc(self, data):
            store["blob"] = pickle.dumps(data)
            return b"handle"

    actor.ipc_client = Ipc()
    assert actor.step(["", ""], ["", ""]) == b"handle"
    assert len(pickle.loads(store["blob"])) == 2 * args.num_samples


def test_actor_episodes_train_the_learner_end_to_end(tok, model):
    """Actor episodes (multi-turn, top-K) -> the learner's dataset (every turn, with its episode) -> learning_step."""
    K = 3
    args = dppo_args(trust_region="dppo_topk_kl", topk=K)
    actor = make_actor(args, model, tok)
    episodes, info = actor.rollout(n_slots=8 // args.num_samples)
    policy = copy.deepcopy(model)  # the module-scoped model stays the actor's
    learner = H.make_stock_learner(args=args, learner_cls=DPPOLearner, model=policy, tokenizer=tok)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    batch = H.collate(learner, episodes)
    assert len(batch) == info["actor/turns_trained"] > len(episodes)
    assert batch == [(i, t) for i, e in enumerate(episodes) for t in e.turns]
    info, _ = H.run_learning_step(learner, batch)
    assert float(info["mismatch_mean"]) < 1e-4  # mu from the stand-in "vLLM" == the learner's pi (first step)
    assert float(info["kept_frac"]) == 1.0
    assert any(float((p.detach() - before[n]).abs().max()) > 0 for n, p in policy.named_parameters())


@pytest.mark.parametrize("reply_effect_turns", [0, 2])
def test_actor_evaluation_hands_the_learner_the_reply_effect_cases_it_scores(tok, model, reply_effect_turns):
    """The Oat actor plays the held-out episodes and returns their reply-effect cases; the learner scores them
    with its own model (the weights the actor's vLLM holds after a sync), as the local backend does: the same
    number, where vLLM's prompt log-probs would have cost a whole prompt's forward per scored move."""
    args = dppo_args(env="smoke:hidden_digit", env_option=["guess=any_char"], response_prefix="", max_turns=4)
    actor = make_actor(args, model, tok)
    r, cases = actor.evaluate_episodes(list(range(6)))
    assert cases and all(isinstance(c, Case) for c in cases) and math.isnan(r["reply_effect"])
    assert r["episodes"] == 6.0 and pickle.loads(pickle.dumps(cases)) == cases  # they travel through Oat's courier

    class Actor:  # Oat's actor handle: `futures.evaluate_episodes` and the eval notifications
        class futures:  # noqa: N801
            evaluate_episodes = staticmethod(lambda seeds, split: mock.Mock(result=lambda: (r, cases)))
            notify_eval_start = notify_eval_done = staticmethod(lambda *a: mock.Mock(result=lambda: None))

    learner = H.make_stock_learner(args=dppo_args(env="smoke:hidden_digit", env_option=["guess=any_char"],
                                                  response_prefix="", max_turns=4, eval_episodes=6,
                                                  reply_effect_turns=reply_effect_turns),
                                   learner_cls=DPPOLearner, model=copy.deepcopy(model), tokenizer=tok)
    learner.actors, learner._same_actor_group = [Actor()], None
    learner.strategy.args.learner_gpus_per_group, learner.pi_beta_lags_behind = 1, False  # set by Oat's program
    with H.single_process_group():
        out = learner.evaluate(None, 0)
    kept = cases[:reply_effect_turns] if reply_effect_turns else cases  # --reply-effect-turns: the first N
    assert len(cases) > 2 and out["eval/reply_effect_turns"] == len(kept) and out["eval/episodes"] == 6.0
    assert out["eval/reply_effect"] == pytest.approx(reply_effect(ModelMovePolicy(model, tok), kept), abs=1e-6)
    # the actor's vLLM gives the learner's log-probs (here the stand-in's, from the same tiny model)
    c = cases[0]
    actor.llm.collective_rpc = lambda *a, **k: ["digest"]  # the stand-in's worker holds no named parameters
    vllm_policy = ScoredMovePolicy(lambda pairs: [sum(actor.sync_probe(p, m)[0]) for p, m in pairs], tok)
    assert np.allclose(vllm_policy.move_probs([c.prompt], c.moves), ModelMovePolicy(model, tok).move_probs(
        [c.prompt], c.moves), rtol=1e-4, atol=1e-9)


def test_with_lora_sync_only_every_vllm_call_names_the_synced_adapter(tok, model):
    """--lora-sync-only: the learner syncs a LoRA adapter, and vLLM applies it only to requests that name it.
    Sampling and --check-sync's probe both name it (the probe once named none, and checked the base model)."""
    args = dppo_args(env="smoke:hidden_digit", env_option=["guess=any_char"], response_prefix="", max_turns=4)
    actor = make_actor(args, model, tok)
    actor.use_lora_req, actor.lora_path = True, "/runs/x/lora_adapter"
    actor.llm.lora_requests.clear()
    actor.evaluate_episodes(list(range(4)))
    actor.llm.collective_rpc = lambda *a, **k: ["digest"]  # the stand-in's worker holds no named parameters
    actor.sync_probe([1, 2, 3], [4, 5])
    names = {getattr(req, "lora_name", None) for req in actor.llm.lora_requests}
    assert len(actor.llm.lora_requests) >= 2 and names == {"lora_adapter"}


def test_actor_evaluation_and_combination(tok, model):
    actor = make_actor(dppo_args(eval_temperature=1.0), model, tok)
    r, _ = actor.evaluate_episodes([1, 2, 3])
    assert r["episodes"] == 3.0 and 0.0 <= r["success_rate"] <= 1.0
    t, _ = actor.evaluate_episodes([1, 2], "test")  # the run's end: the test split's tasks, its own envs
    assert t["episodes"] == 2.0 and {e.split for e in actor._env_pools["test"]} == {"test"}
    assert {e.split for e in actor._env_pools["validation"]} == {"validation"}
    both = combine_eval([r, {"episodes": 1.0, **{k: 1.0 for k in r if k != "episodes"}}])
    assert both["episodes"] == 4.0
    assert both["success_rate"] == pytest.approx((3 * r["success_rate"] + 1.0) / 4)


def test_actor_math_envs_step_from_a_thread():
    """Oat calls the actor's `step` from a courier thread; GEM's math grader times out with SIGALRM
    in-process, which only the main thread may set. The actor's envs grade in a subprocess instead
    (every episode of `math:procedural` on `--backend oat` failed before)."""
    import threading
    from types import SimpleNamespace

    from oat_dppo.components import build_envs
    from oat_dppo.config import TrainConfig

    cfg = TrainConfig(env="math:procedural", env_option=("tasks=basic_arithmetic", "max_digits=1", "answer=number"))
    env = build_envs(DPPOActor._env_config(SimpleNamespace(cfg=cfg)), 1, split="train")[0]
    try:
        env.reset(seed=0)
        out: dict = {}

        def step():
            try:
                out["reward"] = env.step("\\boxed{1}")[1]
            except Exception as e:  # the assertion below names it
                out["error"] = repr(e)

        t = threading.Thread(target=step)
        t.start()
        t.join()
        assert "error" not in out, out
        assert out["reward"] in (0.0, 1.0)
    finally:
        env.close()
    # a user's own choice stays
    mine = TrainConfig(env="math:procedural", env_option=("use_mp=false",))
    assert DPPOActor._env_config(SimpleNamespace(cfg=mine)).env_option == ("use_mp=false",)
