"""TRL 1.16's GRPO loss and the project's pg_is give the same gradient on one batch (issue 39, part 3).

What of TRL runs: a real `trl.GRPOTrainer` is built around a tiny Qwen3 (from a config, no hub), and its
own `compute_loss(model, inputs)` -> `_compute_loss` is called on a hand-made batch in the layout its
`_generate_and_score_completions` hands over (left-padded `prompt_ids`, right-padded `completion_ids`,
their masks, one advantage per sequence, `num_items_in_batch`). That path is TRL's: its fused-LM-head
forward for per-token log-probs, `old_per_token_logps` absent (one step per generation: TRL then uses the
detached log-probs, importance weights exactly 1), the ratio clip (inactive at weight 1), beta 0 (no
reference model, no KL), and its default `loss_type="dapo"`: the sum of token losses over the active
completion tokens of the whole generation batch. The project's side is `trust_region_loss` with
`pg_is` (mu = the policy's own log-probs, so r = 1) and `token_mean` over the same tokens, the
aggregation that matches dapo: one normalizer, the batch's completion-token count, for every token.

Advantages are given, the same on both sides: how each computes them differs by design and is not what
this compares (TRL: (r - group mean) / (unbiased group std + 1e-4); the project's `group_norm`: the
population std + 1e-6; docs/benchmarks_peers.md).

Skipped where TRL is not installed (`make setup-peers` installs it). CI's `make test` installs it in .venv
and sets OAT_DPPO_REQUIRE_PEERS=1 there, which turns the skip into a failure. (.venv-oat, Python 3.10,
cannot hold TRL 1.16: the test skips there.)
"""

from __future__ import annotations

import copy
import importlib.util
import os

import pytest
import torch

if importlib.util.find_spec("trl") is None:
    if os.environ.get("OAT_DPPO_REQUIRE_PEERS") == "1":  # set by `make test` in CI, after `make setup-peers`
        raise RuntimeError("CI must run the TRL loss check, but trl is not installed: `make setup-peers`")
    pytest.skip("TRL is not installed; `make setup-peers` enables this test", allow_module_level=True)

from oat_dppo.learner.batch import Sample, collate  # noqa: E402
from oat_dppo.learner.logprobs import policy_logprobs  # noqa: E402
from oat_dppo.learner.step import trust_region_loss  # noqa: E402
from oat_dppo.models.tiny import tiny_model, tiny_tokenizer  # noqa: E402
from oat_dppo.trust_region import make_trust_region  # noqa: E402

# Prompt and completion lengths that differ per row, so padding on both sides and the normalizer matter.
PROMPT_LENGTHS = [5, 9, 7, 12, 6, 8]
COMPLETION_LENGTHS = [4, 1, 6, 3, 6, 2]
ADVANTAGES = [1.2, -0.7, 0.3, -1.5, 0.0, 0.9]


def _rows(tok, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    low = 10  # byte ids above the tokenizer's specials
    prompts = [torch.randint(low, len(tok), (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    completions = [torch.randint(low, len(tok), (n,), generator=g).tolist() for n in COMPLETION_LENGTHS]
    return prompts, completions


def _trl_trainer(model, tok, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=len(ADVANTAGES), num_generations=2,
        gradient_accumulation_steps=1, max_completion_length=max(COMPLETION_LENGTHS), beta=0.0, use_cpu=True,
        bf16=False, report_to="none", logging_strategy="no", save_strategy="no",
    )
    assert args.loss_type == "dapo", "TRL's default loss_type changed: pick the matching --aggregation again"
    return GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                       train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}), processing_class=tok)


def _trl_inputs(prompts, completions, pad_id: int) -> dict[str, torch.Tensor]:
    """The batch as TRL's `_generate_and_score_completions` returns it: prompts left-padded [B, P],
    completions right-padded [B, C], their int masks, advantages [B], completion tokens of the batch."""
    B, P, C = len(prompts), max(map(len, prompts)), max(map(len, completions))
    prompt_ids = torch.full((B, P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    completion_ids = torch.full((B, C), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((B, C), dtype=torch.long)
    for b, (p, c) in enumerate(zip(prompts, completions)):
        prompt_ids[b, P - len(p):] = torch.tensor(p)
        prompt_mask[b, P - len(p):] = 1
        completion_ids[b, :len(c)] = torch.tensor(c)
        completion_mask[b, :len(c)] = 1
    return dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                completion_mask=completion_mask, advantages=torch.tensor(ADVANTAGES),
                num_items_in_batch=completion_mask.sum())


def _project_batch(model, prompts, completions, pad_id: int):
    """The same rows packed by the project's `collate`, mu = the policy's own log-probs (r = 1)."""
    samples = [Sample(prompt_ids=p, response_ids=c, behavior_logprobs=torch.zeros(len(c)).numpy(), advantage=a)
               for p, c, a in zip(prompts, completions, ADVANTAGES)]
    batch = collate(samples, pad_id)
    with torch.no_grad():
        pol = policy_logprobs(model, batch, with_entropy=False)
    batch.behavior_logp = pol.logp.detach().float() * batch.response_mask  # [B, T], 0 off the response
    return batch


def test_trl_grpo_and_pg_is_token_mean_give_the_same_gradient(tmp_path):
    torch.manual_seed(0)
    tok = tiny_tokenizer("qwen3")
    base = tiny_model(tok, seed=0, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128)
    ours, theirs = copy.deepcopy(base), copy.deepcopy(base)
    prompts, completions = _rows(tok)

    trainer = _trl_trainer(theirs, tok, tmp_path)
    trainer.model.train()
    # Set by TRL's training loop before the first compute_loss; 1: this batch is the whole step.
    trainer.current_gradient_accumulation_steps = 1
    trl_loss = trainer.compute_loss(trainer.model, _trl_inputs(prompts, completions, tok.pad_token_id))
    trl_loss.backward()

    ours.train()
    batch = _project_batch(ours, prompts, completions, tok.pad_token_id)
    our_loss, _ = trust_region_loss(ours, batch, make_trust_region("pg_is"), aggregation="token_mean")
    our_loss.backward()

    # The loss values agree too here (both are -sum(r * A) / N with r = 1 and the same N).
    torch.testing.assert_close(our_loss.detach(), trl_loss.detach(), rtol=1e-5, atol=1e-6)
    named = dict(theirs.named_parameters())
    checked = 0
    for name, p in ours.named_parameters():
        q = named[name]
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is None:
            continue
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
        checked += 1
    assert checked > 0
    # A real gradient, not two zeros that agree.
    assert max(float(p.grad.abs().max()) for p in ours.parameters() if p.grad is not None) > 1e-4


def test_trl_seq_mean_loss_type_matches_seq_mean_token_mean(tmp_path):
    """TRL's `loss_type="grpo"` (each sequence's token mean, then the mean over sequences) is the
    project's `seq_mean_token_mean`: the other pairing a user switching between the two would pick."""
    tok = tiny_tokenizer("qwen3")
    base = tiny_model(tok, seed=1, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128)
    ours, theirs = copy.deepcopy(base), copy.deepcopy(base)
    prompts, completions = _rows(tok, seed=1)
    trainer = _trl_trainer(theirs, tok, tmp_path)
    trainer.loss_type = "grpo"
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    trainer.compute_loss(trainer.model, _trl_inputs(prompts, completions, tok.pad_token_id)).backward()
    ours.train()
    batch = _project_batch(ours, prompts, completions, tok.pad_token_id)
    loss, _ = trust_region_loss(ours, batch, make_trust_region("pg_is"), aggregation="seq_mean_token_mean")
    loss.backward()
    named = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(p.grad, named[name].grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
