"""`model_pair_scorer`, both backends' reply-effect scorer: log p(move | prompt) by hand, and at the cost of one
forward over the distinct prompts (their shared prefixes once) and one over the moves, packed per prompt."""

from __future__ import annotations

import pytest
import torch

from oat_dppo.agent.reply_effect import model_pair_scorer
from oat_dppo.models import load_policy


@torch.no_grad()
def by_hand(model, prompt: list[int], move: list[int]) -> float:
    """The whole sequence through the model, no cache: sum_k log softmax(logits at P + k - 1)[move_k]."""
    logits = model(input_ids=torch.tensor([prompt + move])).logits[0].double()  # [P + L, V]
    logp = logits.log_softmax(-1)
    return float(sum(logp[len(prompt) + k - 1, t] for k, t in enumerate(move)))


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_scores_equal_a_whole_forward_by_hand(batch_size):
    """Moves of 1 to 6 tokens, some sharing leading tokens (one a prefix of another), after distinct prompts and
    prompts sharing 20 tokens (a scored turn's real and changed prompt), packed per prompt as a trie: each score
    equals the uncached log-probability within 1e-5."""
    model, _ = load_policy("tiny-qwen3", seed=4)
    model = model.float().eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (7, 23, 40)]
    head = torch.randint(3, 200, (20,), generator=g).tolist()
    prompts += [head + torch.randint(3, 200, (n,), generator=g).tolist() for n in (4, 9)]
    moves = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (1, 2, 5, 3, 1)]
    moves += [moves[2][:3] + [7], moves[2][:2], moves[2][:4] + [8, 9]]  # sharing leading tokens: one trie
    pairs = [(p, m) for p in prompts for m in moves] + [(prompts[1], moves[2])]  # a repeated pair too
    scores = model_pair_scorer(model, batch_size=batch_size)(pairs)
    assert len(scores) == len(pairs)
    for (p, m), s in zip(pairs, scores):
        assert s == pytest.approx(by_hand(model, p, m), abs=1e-5)


def test_prompts_run_once_and_moves_in_one_packed_row():
    """10 moves of 2 tokens after each of 2 prompts (57 and 37 tokens, the shorter a prefix of the longer): their
    shared 36 tokens once, the two rests, then the 10 moves' first tokens as one packed row per prompt; the LM
    head sees each prompt's last position and the moves' positions, never a whole prompt."""
    model, _ = load_policy("tiny-qwen3", seed=4)
    calls, head_rows = [], []
    handle = model.get_decoder().register_forward_pre_hook(
        lambda mod, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    head = model.get_output_embeddings().register_forward_pre_hook(lambda mod, args: head_rows.append(args[0].shape))
    try:
        pairs = [(list(range(3, 60)), [5 + j, 9]) for j in range(10)] + [(list(range(3, 40)), [5 + j, 9]) for j in range(10)]
        model_pair_scorer(model, batch_size=8)(pairs)
    finally:
        handle.remove()
        head.remove()
    assert calls == [(1, 36), (2, 21), (2, 10)]  # the shared prefix, the rests (57 - 36), the packed moves
    calls.clear()
    handle = model.get_decoder().register_forward_pre_hook(
        lambda mod, args, kwargs: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:  # Sudoku's moves "r c d}": 4 x 4 x 4 of them share their rows and columns: 4 + 16 + 64 trie nodes, not 192
        model_pair_scorer(model)([(list(range(3, 30)), [r, 10 + c, 20 + d, 40]) for r in range(4) for c in range(4)
                                  for d in range(4)])
    finally:
        handle.remove()
    assert calls == [(1, 27), (1, 4 + 16 + 64)]
    assert [s[0] for s in head_rows] == [2, 10, 10]  # rows of [positions, H]: 2 prompts' last, then each packed row


def test_a_sliding_window_the_pairs_outgrow_scores_each_pair_whole():
    """A window of 8 tokens under prompts of 12-30: the trie's 4D mask would let a move see the whole prompt, so the
    scorer runs each pair's own forward, where the model applies its window; equal to the by-hand forward."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=128, use_sliding_window=True,
                      sliding_window=8, max_window_layers=0, layer_types=["sliding_attention"] * 2)
    cfg._attn_implementation = "eager"  # (transformers 4.51's SDPA path ignores Qwen3's window)
    model = Qwen3ForCausalLM(cfg).float().eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (12, 30)]
    moves = [[5, 9], [5, 10, 11], [7]]
    pairs = [(p, m) for p in prompts for m in moves]
    windowed = [by_hand(model, p, m) for p, m in pairs]
    cfg_full = Qwen3Config(**{**cfg.to_dict(), "use_sliding_window": False, "sliding_window": None, "layer_types": ["full_attention"] * 2})
    full = Qwen3ForCausalLM(cfg_full).float().eval()
    full.load_state_dict(model.state_dict())
    assert max(abs(a - by_hand(full, p, m)) for a, (p, m) in zip(windowed, pairs)) > 1e-3  # the window matters here
    scores = model_pair_scorer(model, batch_size=8)(pairs)
    assert scores == pytest.approx(windowed, abs=1e-5)
