"""One forward per episode (`history=chat`): an episode whose turns extend each other's prompts is one row, every
turn's response trained where it stands (`learner.batch.chains`, `collate(rows=...)`). Exactness against one row
per turn: per-token log pi, the loss and its gradient within 1e-5 in float32, for every trust region (the
trajectory-level ones included) and every aggregation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oat_dppo.agent.types import Turn
from oat_dppo.learner import Learner, LearnerConfig, collate, policy_logprobs, trust_region_loss
from oat_dppo.learner.batch import chains
from oat_dppo.trust_region import AGGREGATION_MODES, available, make_trust_region, requirements
from test_learner import policy  # noqa: F401  (the module's tiny-qwen3 fixture)

K = 4
TOLERANCE = 1e-5


def chat_episodes(policy, sizes=(3, 1, 2), seed=0) -> tuple[list[Turn], list[int]]:
    """Episodes of chat turns: turn k+1's prompt = turn k's prompt + its response (sampled by the HF engine, with
    mu and mu's top-K) + a reply's ids. Per-turn advantages differ."""
    from oat_dppo.engine.hf import HFEngine

    model, tok = policy
    engine = HFEngine(model, tok)
    rng = np.random.default_rng(seed)
    turns, episode_ids = [], []
    for e, n in enumerate(sizes):
        prompt = tok(f"episode {e} starts " + "x" * int(rng.integers(1, 9)), add_special_tokens=False)["input_ids"]
        for k in range(n):
            [g] = engine.generate([prompt], 5, K, seed=seed * 100 + e * 10 + k)
            turns.append(Turn(prompt_ids=list(prompt), response_ids=list(g.response_ids), behavior_logprobs=g.logprobs
                              + rng.normal(0, 0.05, len(g.logprobs)).astype(np.float32),  # a mismatch to mask
                              reward=0.0, done=k == n - 1, truncated=False, well_formed=True,
                              finish_reason=g.finish_reason, topk_ids=g.topk_ids, topk_logprobs=g.topk_logprobs,
                              advantage=float(rng.normal())))
            episode_ids.append(e)
            reply = tok(f" reply {k}" + "y" * int(rng.integers(0, 4)), add_special_tokens=False)["input_ids"]
            prompt = prompt + list(g.response_ids) + reply
    return turns, episode_ids


def _loss_and_grads(model, batch, tr, aggregation, n_tok, n_seq):
    model.zero_grad(set_to_none=True)
    loss, _ = trust_region_loss(model, batch, tr, aggregation=aggregation, constant_length=8, num_tokens=n_tok,
                                num_sequences=n_seq)
    loss.backward()
    return float(loss), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_chains_join_an_episodes_chat_turns_only(policy):
    turns, episode_ids = chat_episodes(policy)
    assert chains(turns, episode_ids) == [[0, 1, 2], [3], [4, 5]]
    broken = list(turns)
    broken[1] = Turn(**{**vars(turns[1]), "prompt_ids": [7] + turns[1].prompt_ids[1:]})  # not an extension
    assert chains(broken, episode_ids) == [[0], [1], [2], [3], [4, 5]]  # turn 2 extends the real turn 1


def test_one_row_per_episode_scores_every_token_as_one_row_per_turn(policy):
    model, tok = policy
    turns, episode_ids = chat_episodes(policy)
    rows = chains(turns, episode_ids)
    per_turn, packed = collate(turns, 0, K), collate(turns, 0, K, rows=rows)
    assert packed.num_rows == 3 and per_turn.num_rows == 6
    assert packed.num_tokens == per_turn.num_tokens and packed.num_turns(range(3)) == 6
    lp_turn = policy_logprobs(model.eval(), per_turn, with_topk=True).logp
    lp_packed = policy_logprobs(model, packed, with_topk=True).logp
    for b, row in enumerate(rows):
        for t in row:
            p, r = len(turns[t].prompt_ids), len(turns[t].response_ids)
            assert torch.allclose(lp_packed[b, p:p + r], lp_turn[t, p:p + r], atol=TOLERANCE)
    computed = int(packed.attention_mask.sum()) / int(per_turn.attention_mask.sum())
    assert computed < 0.6  # the shared prefixes are computed once


@pytest.mark.parametrize("aggregation", AGGREGATION_MODES)
@pytest.mark.parametrize("name", [*available(), "tis:sequence", "mis:geometric", "trm:turn"])
def test_loss_and_gradient_equal_the_per_turn_path(policy, name, aggregation):
    model, _ = policy
    model.train()
    base, _, level = name.partition(":")
    params = {"sequence": level} if base == "trm" and level else {"level": level} if level else {}
    tr = make_trust_region(base, **({"topk": K} if requirements(make_trust_region(base)).topk else {}), **params)
    topk = requirements(tr).topk
    turns, episode_ids = chat_episodes(policy)
    rows = chains(turns, episode_ids)
    per_turn, packed = collate(turns, 0, topk), collate(turns, 0, topk, rows=rows)
    if requirements(tr).trajectory_sequences:  # an episode is one sequence on both paths
        per_turn.sequence_ids = torch.tensor(episode_ids)
        packed.sequence_ids = torch.tensor([episode_ids[r[0]] for r in rows])
    n_tok, n_seq = float(per_turn.num_tokens), float(len(turns))
    loss_t, grads_t = _loss_and_grads(model, per_turn, tr, aggregation, n_tok, n_seq)
    loss_p, grads_p = _loss_and_grads(model, packed, tr, aggregation, n_tok, n_seq)
    assert loss_p == pytest.approx(loss_t, abs=TOLERANCE)
    assert grads_t.keys() == grads_p.keys()
    assert max(float((grads_t[n] - grads_p[n]).abs().max()) for n in grads_t) < TOLERANCE


def test_the_learner_packs_chat_episodes_and_takes_the_same_step(policy):
    """The local learner's whole update, packed (episode ids given) against one row per turn (none given)."""
    import copy
    import random

    model, tok = policy
    turns, episode_ids = chat_episodes(policy, sizes=(3, 2))
    # AdamW moves every weight by about lr (gradients near 0 by up to 2 lr): lr 1e-4 keeps that under the tolerance
    cfg = LearnerConfig(learning_rate=1e-4, mini_batch_size=64, micro_batch_size=8, aggregation="seq_mean_token_mean")
    after = []
    for ids in (episode_ids, None):
        m = copy.deepcopy(model)
        Learner(m, make_trust_region("dppo_binary_tv"), cfg, pad_id=0).update(turns, random.Random(0), ids)
        after.append(dict(m.named_parameters()))
    assert max(float((after[0][n] - after[1][n]).abs().max()) for n in after[0]) < TOLERANCE
