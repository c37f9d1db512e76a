"""Engine-agnostic generation types: what every engine (HF here, vLLM in the Oat backend) returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

__all__ = ["Generation", "Engine", "PromptTooLongError", "as_id_list", "pad_token_id", "stop_token_ids", "token_budgets"]


@dataclass
class Generation:
    """One sampled response and the behavior policy mu that produced it."""

    response_ids: list[int]  # sampled tokens, EOS included when the model emitted it
    logprobs: np.ndarray  # [L] float32, log mu(a_t | s_t) of the distribution sampled from
    topk_ids: np.ndarray | None  # [L, K+1] int64: mu's top-K ids (descending) + the sampled id in
    #   slot K when it is outside the top-K, else -1
    topk_logprobs: np.ndarray | None  # [L, K+1] float32: log mu on those ids, -inf on unused slots
    finish_reason: str  # "stop" (EOS) or "length"


class Engine(Protocol):
    def generate(
        self, prompt_ids: list[list[int]], max_new_tokens: int, topk: int = 0, *, seed: int | None = None,
        temperature: float | None = None,
    ) -> list[Generation]:
        """`temperature`: None samples as the engine was built to (1 for training: mu is the sampling
        distribution); evaluations may ask for another, 0 being greedy."""


def as_id_list(x: Any) -> list[int]:
    """None, an int, a tensor or a sequence of ids -> a list of ints."""
    if x is None:
        return []
    if isinstance(x, int):
        return [x]
    if hasattr(x, "flatten") and hasattr(x, "tolist"):  # a torch tensor or numpy array
        return [int(v) for v in x.flatten().tolist()]
    return [int(v) for v in x]


def stop_token_ids(tokenizer: Any, generation_config: Any = None, extra: Sequence[int] = ()) -> list[int]:
    """The ids every engine stops at (deduplicated, in order): the tokenizer's EOS, the model
    generation config's EOS ids, the pad token (a sampled pad ends the document too), and `extra`,
    e.g. the prompt template's end-of-turn token when it is not the tokenizer's EOS (a base model's
    tokenizer ends documents with <|endoftext|>, the chat markup ends turns with <|im_end|>)."""
    eos = as_id_list(getattr(tokenizer, "eos_token_id", None))
    ids = eos + as_id_list(getattr(generation_config, "eos_token_id", None))
    pad = pad_token_id(tokenizer)
    ids += [pad] + as_id_list(list(extra))
    return list(dict.fromkeys(ids))


def pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its (first) EOS id."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        eos = as_id_list(getattr(tokenizer, "eos_token_id", None))
        pad = eos[0] if eos else None
    if pad is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token")
    return int(pad)


class PromptTooLongError(ValueError):
    """Some prompts leave no room for even one new token within the model's context.

    Raised before any generation work. `indices` are positions in the `prompt_ids` batch, so a
    caller can end (truncate) those episodes and call `generate` again with the others.
    """

    def __init__(self, indices: Sequence[int], lengths: Sequence[int], max_context: int):
        self.indices = list(indices)
        self.lengths = list(lengths)
        self.max_context = max_context
        shown = ", ".join(f"#{i}: {n} tokens" for i, n in zip(self.indices[:5], self.lengths[:5]))
        more = f" and {len(self.indices) - 5} more" if len(self.indices) > 5 else ""
        super().__init__(
            f"{len(self.indices)} prompt(s) do not fit the model's context of {max_context} tokens "
            f"(a prompt needs at most {max_context - 1} tokens to generate one): {shown}{more}. "
            "Shorten the prompt (fewer turns of history, a compact observation) or end those episodes."
        )


def token_budgets(prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, topk: int,
                  max_context: int | None) -> list[int]:
    """Check one generate request and return each prompt's response budget.

    The budget is `max_new_tokens`, cut so that prompt + response fits `max_context`. A prompt that
    leaves no room for a single token raises `PromptTooLongError` (with its index) before any work,
    so the agent loop can end that episode and generate for the others.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if topk < 0:
        raise ValueError(f"topk must be >= 0, got {topk}")
    lengths = [len(p) for p in prompt_ids]
    if lengths and min(lengths) == 0:
        raise ValueError(f"empty prompt at index {lengths.index(0)}; every prompt needs at least one token")
    if max_context is None:
        return [max_new_tokens] * len(lengths)
    too_long = [i for i, n in enumerate(lengths) if n >= max_context]
    if too_long:
        raise PromptTooLongError(too_long, [lengths[i] for i in too_long], max_context)
    return [min(max_new_tokens, max_context - n) for n in lengths]
