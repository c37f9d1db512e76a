r"""How much the environment's reply moves the policy: a feedback measure a blind policy cannot pass.

`hint_direction_agreement` (the share of guesses that moved the way the last hint said) cannot tell
reading from a blind habit: an ascending sweep 0, 1, 2, ... never meets a "lower" and scores 1.0.
This measure asks the counterfactual instead. For a turn t that followed a reply r carrying
information ("5: higher."), the env declares the changed reply r' (the same reply saying the other
thing, "5: lower.") and the moves M it scores (the digits); the prompt x_t is rebuilt with r' in
place of r, everything else equal (x'_t). With p(m | x) the policy's probability that its response
starts with move m, renormalised over M, and F ⊆ M the moves r favours (those that follow it):

    effect_t = sum_{m in F} p(m | x_t) - sum_{m in F} p(m | x'_t)          in [-1, 1]
    reply_effect = mean_t effect_t

A policy that ignores the replies sees nothing it uses change: p(. | x_t) = p(. | x'_t), 0 exactly
(a blind sweep, a constant answer). One that always moves the way the reply says puts all of its mass
in F under r and, the changed reply favouring the other side, none under r': 1. Negative: it moves
against what the reply says.

Games declare how their replies change as they declare feedback-follow: `changed_reply(observation)
-> str | None` and `reply_moves() -> moves` on the env (HiddenDigit, HigherLower), or `changed` /
`moves(env)` on the preset's feedback probe (GEM's GuessTheNumber); the adapter puts the result in a
step's info and the agent loop on the next `Turn.counterfactual`. Evaluations score it with the
learner's model on both backends (`ModelMovePolicy`: teacher-forced log-probs, the prefix the 2 prompts of a
scored turn share computed once, and its |M| moves as one packed trie on each prompt's KV cache); on Oat the actors play the episodes and the
learner, whose weights the actors' vLLM holds after every sync, scores their cases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from oat_dppo.agent.types import Episode


class MovePolicy(Protocol):
    def move_probs(self, prompts: Sequence[str], moves: Sequence[str]) -> np.ndarray:
        """[P, M] non-negative weights of each move after each prompt (renormalised over M here)."""


@dataclass(frozen=True)
class Case:
    """One turn that followed a reply with information: its prompt under the real and the changed reply."""

    prompt: str
    changed_prompt: str
    moves: tuple[str, ...]
    favoured: tuple[bool, ...]  # [M] the moves the real reply favours


def reply_effect(policy: MovePolicy, cases: Sequence[Case]) -> float:
    """mean_t (p(F | real reply) - p(F | changed reply)), see the module docstring; NaN without cases."""
    effects = []
    for moves, group in _by_moves(cases).items():
        prompts = [c.prompt for c in group] + [c.changed_prompt for c in group]
        w = np.asarray(policy.move_probs(prompts, list(moves)), dtype=np.float64)  # [2C, M]
        total = w.sum(axis=1, keepdims=True)
        p = np.divide(w, total, out=np.zeros_like(w), where=total > 0)  # [2C, M], rows sum to 1 (or 0)
        favoured = np.array([c.favoured for c in group], dtype=np.float64)  # [C, M]
        real, changed = p[: len(group)], p[len(group):]  # [C, M] each
        effects.extend(((real - changed) * favoured).sum(axis=1))
    return float(np.mean(effects)) if effects else math.nan


def _by_moves(cases: Sequence[Case]) -> dict[tuple[str, ...], list[Case]]:
    groups: dict[tuple[str, ...], list[Case]] = {}
    for c in cases:
        groups.setdefault(c.moves, []).append(c)
    return groups


def cases_from_episodes(episodes: Sequence[Episode]) -> list[Case]:
    """The `Case`s of the turns that carry a counterfactual. The changed prompt is the one the agent loop built
    beside the real one, the same way (`play_episodes`): under `history=chat` the whole conversation so far with
    only the newest reply changed, not a one-turn prompt of that reply, which a blind policy could tell apart."""
    out = []
    for e in episodes:
        if e.error is not None:
            continue
        for t in e.turns:
            cf = t.counterfactual
            if cf and cf.get("moves"):
                out.append(Case(t.prompt_text, cf["changed_prompt"], tuple(cf["moves"]),
                                tuple(bool(f) for f in cf["favoured"])))
    return out


def held_out_metrics(episodes: Sequence[Episode], move_policy: Callable[[], "MovePolicy"], *,
                     max_turns: int = 0) -> dict[str, float]:
    """An evaluation's metrics, on both backends: `episode_metrics`, and the reply effect (with the turns it
    scored) where the env declares how its replies change; `move_policy()` builds the scorer only then."""
    from oat_dppo.agent.metrics import episode_metrics  # noqa: PLC0415 (metrics imports nothing of this)

    cases = cases_from_episodes(episodes)
    return {**episode_metrics(episodes), **scored(cases, move_policy, max_turns=max_turns)}


def scored(cases: Sequence[Case], move_policy: Callable[[], "MovePolicy"], *, max_turns: int = 0) -> dict[str, float]:
    """`reply_effect` and `reply_effect_turns` (the turns scored) of `cases`, or of the first `max_turns` of them
    where it is > 0 (`--reply-effect-turns`: cases come in episode order, so these are the first episodes' turns);
    nothing without cases (no scorer is built)."""
    cases = cases[:max_turns] if max_turns > 0 else cases
    return {"reply_effect": reply_effect(move_policy(), cases), "reply_effect_turns": float(len(cases))} if cases else {}


PairScorer = Callable[[Sequence[tuple[list[int], list[int]]]], Sequence[float]]


class ScoredMovePolicy:
    """p(m | x) by teacher forcing: exp of the summed log-probs of the move's tokens after the prompt,
    from `score_pairs([(prompt ids, move ids), ...]) -> [sum of log p(move tokens | prompt), ...]`. A move
    is the action text the env reads: a response prefix pre-filled in the prompt is taken off its front
    (a move that does not start with it gets weight 0). The scorer of both backends is the learner's
    model (`model_pair_scorer`); any other (an engine's prompt log-probs) plugs in the same way."""

    def __init__(self, score_pairs: PairScorer, tokenizer, response_prefix: str = ""):
        self.score_pairs, self.tokenizer, self.response_prefix = score_pairs, tokenizer, response_prefix

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def move_probs(self, prompts: Sequence[str], moves: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(prompts), len(moves)))  # [P, M]
        where, pairs = [], []
        prompt_ids = [self._ids(p) for p in prompts]
        for j, m in enumerate(moves):
            if not m.startswith(self.response_prefix) or len(m) == len(self.response_prefix):
                continue
            move_ids = self._ids(m[len(self.response_prefix):])
            for i in range(len(prompts)):
                where.append((i, j))
                pairs.append((prompt_ids[i], move_ids))
        for (i, j), logp in zip(where, self.score_pairs(pairs)):
            out[i, j] = math.exp(float(logp))
        return out


class _MoveTrie:
    """The moves' tokens but their last, as a trie: one node per distinct prefix m[:d + 1], parents first. Node j
    holds token `tokens[j]` at depth `depths[j]` (its position after the prompt); `paths[i]`: the nodes of move i,
    whose hidden states predict m[1:]. A node attends to the prompt and to its ancestors (`ancestry`)."""

    def __init__(self, moves: Sequence[Sequence[int]]):
        self.tokens: list[int] = []
        self.depths: list[int] = []
        self.parents: list[int] = []
        self.paths: list[list[int]] = []
        index: dict[tuple[int, ...], int] = {}
        for m in moves:
            path = []
            for d in range(len(m) - 1):
                key = tuple(m[: d + 1])
                if key not in index:
                    index[key] = len(self.tokens)
                    self.tokens.append(int(m[d]))
                    self.depths.append(d)
                    self.parents.append(path[-1] if path else -1)
                path.append(index[key])
            self.paths.append(path)

    def ancestry(self, device) -> "torch.Tensor":
        """[q, q] bool: node j may attend node k (k is j or an ancestor of j)."""
        import torch

        q = len(self.tokens)
        out = torch.eye(q, dtype=torch.bool)
        for j, parent in enumerate(self.parents):  # parents come first: their rows are complete
            if parent >= 0:
                out[j] |= out[parent]
        return out.to(device)


def model_pair_scorer(model, batch_size: int = 8) -> PairScorer:
    """Summed log-probs of each pair's move tokens after its prompt from a causal LM, at about the cost of one
    forward over the distinct prompts and one over the moves' tokens:

    * the distinct prompts run `batch_size` at a time, each prefix a cluster of them shares once
      (`models.prefix`: a scored turn's real and changed prompt share everything before the reply, and every
      prompt of a game its instructions); the LM head sees each prompt's last position only, whose log-softmax
      scores every move's first token;
    * a prompt's moves then run as one packed row on its keys and values: their tokens as a trie (moves sharing
      leading tokens, "1 2 3}" and "1 2 4}", share those positions), each node attending to the prompt and to its
      ancestors (a 4D mask, positions continuing the prompt's), so the prompt's cache is never copied per move;
      the head runs at the trie's nodes only.

    Equal to a whole forward per pair within 1e-5 in float32 (tests/test_pair_scorer.py). A model whose sliding
    window a prompt and its move could outgrow scores each pair by a whole forward of its own, unpacked: a window
    counts cache slots, and the trie's 4D mask would stand in for the model's windowed one."""

    def score(pairs):
        import torch

        from oat_dppo.models.prefix import MIN_SHARED, plan_prefixes, prefix_forward

        device = next(model.parameters()).device
        decoder, head = model.get_decoder(), model.get_output_embeddings()
        softcap = getattr(model.config, "final_logit_softcapping", None)
        window = getattr(model.config, "sliding_window", None)
        out = [0.0] * len(pairs)
        by_prompt: dict[tuple[int, ...], list[int]] = {}
        for k, (p, _) in enumerate(pairs):
            by_prompt.setdefault(tuple(p), []).append(k)
        prompts = sorted(by_prompt)  # prompts sharing a prefix (a turn's real and changed one) in one pass
        longest = max((len(p) + len(m) for p, m in pairs), default=0)
        if window and longest > window:
            return [_whole_forward_logp(model, p, m) for p, m in pairs]

        def logp_of(hidden):  # [n, H] -> [n, V] log-softmax of the LM head
            return _log_softmax(head(hidden), softcap)

        with torch.inference_mode():
            for start in range(0, len(prompts), batch_size):
                chunk = [list(p) for p in prompts[start: start + batch_size]]
                n, lengths = len(chunk), torch.tensor([len(p) for p in chunk], device=device)  # [n]
                ids = torch.zeros((n, int(lengths.max())), dtype=torch.long, device=device)  # [n, T] right-padded
                mask = torch.zeros_like(ids)
                for i, p in enumerate(chunk):
                    ids[i, : len(p)] = torch.tensor(p, device=device)
                    mask[i, : len(p)] = 1
                plan = plan_prefixes(chunk, [len(p) - 1 for p in chunk], MIN_SHARED)
                run = prefix_forward(decoder, ids, mask, plan)
                first = logp_of(run.hidden[torch.arange(n, device=device), lengths - 1 - run.offsets])  # [n, V]
                moves = [[list(pairs[k][1]) for k in by_prompt[tuple(p)]] for p in chunk]
                for i, (p, ms) in enumerate(zip(chunk, moves)):
                    for k, m in zip(by_prompt[tuple(p)], ms):
                        out[k] = float(first[i, m[0]])
                # the moves' tokens but their last (each predicts the next), as a trie packed in one row per prompt
                tries = [_MoveTrie(ms) for ms in moves]
                Q = max(len(t.tokens) for t in tries)
                if Q == 0:
                    continue
                tokens = torch.zeros((n, Q), dtype=torch.long, device=device)  # [n, Q]
                positions = torch.zeros((n, Q), dtype=torch.long, device=device)  # [n, Q] padding: never read
                tree = torch.eye(Q, dtype=torch.bool, device=device).repeat(n, 1, 1)  # [n, Q, Q] padding: itself
                for i, t in enumerate(tries):
                    q = len(t.tokens)
                    tokens[i, :q] = torch.tensor(t.tokens, device=device)
                    positions[i, :q] = len(chunk[i]) + torch.tensor(t.depths, device=device)
                    tree[i, :q, :q] = t.ancestry(device)
                allowed = torch.cat([run.mask.bool()[:, None, :].expand(n, Q, -1), tree], dim=-1)  # [n, Q, KV + Q]
                dtype = next(decoder.parameters()).dtype
                bias = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
                    ~allowed, torch.finfo(dtype).min)[:, None]  # [n, 1, Q, KV + Q] additive
                hidden = decoder(input_ids=tokens, attention_mask=bias, position_ids=positions,
                                 past_key_values=run.cache, use_cache=True).last_hidden_state  # [n, Q, H]
                for i, (t, ms) in enumerate(zip(tries, moves)):
                    lp = logp_of(hidden[i, : len(t.tokens)])  # [q, V] each node's next-token log-probs
                    for k, m, nodes in zip(by_prompt[tuple(chunk[i])], ms, t.paths):
                        if nodes:
                            out[k] += float(lp[torch.tensor(nodes, device=device), torch.tensor(m[1:], device=device)].sum())
        return out

    return score


def _log_softmax(logits, softcap: float | None):
    """[n, V] logits -> [n, V] float32 log-probabilities, after the model's final soft cap if it has one (Gemma)."""
    import torch

    logits = logits.float()
    return (torch.tanh(logits / softcap) * softcap if softcap else logits).log_softmax(-1)


def _whole_forward_logp(model, prompt: Sequence[int], move: Sequence[int]) -> float:
    """log p(move | prompt) from one uncached forward of the pair: sum_k log softmax(logits at P + k - 1)[move_k]."""
    import torch

    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([list(prompt) + list(move)], device=device), use_cache=False).logits[0]
        logp = _log_softmax(logits, getattr(model.config, "final_logit_softcapping", None))  # [P+L, V]
        rows = torch.arange(len(prompt) - 1, len(prompt) + len(move) - 1, device=device)  # [L]
        return float(logp[rows, torch.tensor(list(move), device=device)].sum())


def ModelMovePolicy(model, tokenizer, response_prefix: str = "", batch_size: int = 8) -> ScoredMovePolicy:
    """The learner's model as the scored policy (the local backend's evaluations)."""
    return ScoredMovePolicy(model_pair_scorer(model, batch_size), tokenizer, response_prefix)
