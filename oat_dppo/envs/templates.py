r"""Prompt templates: turn an observation (already the complete text for the turn, instructions
included) into the model's input text, per model family.

The hand-written chat markups spell the special tokens out as text (`<|im_start|>`,
`<|begin_of_text|>`, ...). Tokenize the result with `add_special_tokens=False` so that a tokenizer
that adds BOS by itself (Llama 3) does not add a second one.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

_DEFAULT_RAW_PREAMBLE = (
    "A conversation between User and Assistant. The User gives a task, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process and then gives the final answer "
    "within \\boxed{}."
)


def _chatml(obs: str, system: str | None, generation_prefix: str = "") -> str:
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{head}<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n{generation_prefix}"


def _qwen3(obs: str, tokenizer: Any, system: str | None) -> str:
    # Qwen3's template has no default system prompt, so it is plain ChatML with thinking left on.
    return _chatml(obs, system)


def _qwen3_nothink(obs: str, tokenizer: Any, system: str | None) -> str:
    # What Qwen3's own template renders with enable_thinking=False: an empty think block.
    return _chatml(obs, system, "<think>\n\n</think>\n\n")


def _chatml_template(obs: str, tokenizer: Any, system: str | None) -> str:
    return _chatml(obs, system)


def _llama3(obs: str, tokenizer: Any, system: str | None) -> str:
    def turn(role: str, content: str) -> str:
        return f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"

    head = turn("system", system) if system else ""
    return (
        f"<|begin_of_text|>{head}{turn('user', obs)}"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


@functools.lru_cache(maxsize=8)  # once per tokenizer, not once per prompt
def _own_bos(tokenizer: Any) -> str:
    """The BOS text `tokenizer` puts before every encoding by itself (Llama 3, OctoThinker), else "".

    Prompts are tokenized with `add_special_tokens=False`, so a template without markup must write
    the BOS such a model was trained with; tokenizers that add none (Qwen, SmolLM2) get none."""
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos_id is None or not callable(tokenizer):
        return ""
    ids = tokenizer("", add_special_tokens=True)["input_ids"]
    return tokenizer.bos_token if ids[:1] == [bos_id] else ""


def _raw(obs: str, tokenizer: Any, system: str | None) -> str:
    # Base models have no chat markup: a User/Assistant transcript that the model continues
    # (the framing GEM's examples use for base models such as OctoThinker).
    return f"{_own_bos(tokenizer)}{system or _DEFAULT_RAW_PREAMBLE}\nUser: {obs}\nAssistant:"


def _none(obs: str, tokenizer: Any, system: str | None) -> str:
    return f"{system}\n\n{obs}" if system else obs


def _tokenizer(obs: str, tokenizer: Any, system: str | None) -> str:
    if tokenizer is None or not hasattr(tokenizer, "apply_chat_template"):
        raise ValueError(
            "template 'tokenizer' needs a tokenizer with apply_chat_template "
            "(a transformers tokenizer that has a chat_template)"
        )
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": obs}
    ]
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except ValueError as e:  # transformers raises ValueError when no chat_template is set
        raise ValueError(
            f"the tokenizer could not render a chat prompt ({e}); pick a template by name "
            f"instead: {', '.join(n for n in TEMPLATES if n != 'tokenizer')}"
        ) from e


_RENDERERS: dict[str, Callable[[str, Any, "str | None"], str]] = {
    "qwen3": _qwen3,
    "qwen3_nothink": _qwen3_nothink,
    "llama3": _llama3,
    "chatml": _chatml_template,
    "raw": _raw,
    "tokenizer": _tokenizer,
    "none": _none,
}

TEMPLATES: tuple[str, ...] = tuple(_RENDERERS)

# Text that ends the assistant's turn in each markup, for engines whose tokenizer's EOS differs
# (a base model's tokenizer ends with <|endoftext|>, not <|im_end|>).
_STOP_STRINGS: dict[str, tuple[str, ...]] = {
    "qwen3": ("<|im_end|>",),
    "qwen3_nothink": ("<|im_end|>",),
    "chatml": ("<|im_end|>",),
    "llama3": ("<|eot_id|>",),
    "raw": ("\nUser:",),
    "tokenizer": (),
    "none": (),
}


# history=chat: how an episode goes on after the assistant's turn, per markup: the text that ends that turn, and
# the environment's reply as the next user turn followed by the assistant's opening ({reply} marks the reply).
# The learner then scores the conversation's tokens as they were sampled: nothing earlier is re-tokenized.
_CHAT_TURNS: dict[str, tuple[str, str]] = {
    "chatml": ("<|im_end|>", "\n<|im_start|>user\n{reply}<|im_end|>\n<|im_start|>assistant\n"),
    "qwen3": ("<|im_end|>", "\n<|im_start|>user\n{reply}<|im_end|>\n<|im_start|>assistant\n"),
    "qwen3_nothink": ("<|im_end|>",
                      "\n<|im_start|>user\n{reply}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    "llama3": ("<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\n{reply}<|eot_id|>"
                             "<|start_header_id|>assistant<|end_header_id|>\n\n"),
}
CHAT_TEMPLATES: tuple[str, ...] = tuple(_CHAT_TURNS)


def chat_turn(template: str, reply: str) -> tuple[str, str]:
    """(the text that closes the assistant's turn, the reply as the next user turn up to the assistant's
    opening) under `template`, for `history=chat`; a template without chat turns is a ValueError."""
    _check(template)
    if template not in _CHAT_TURNS:
        raise ValueError(f"history=chat needs a chat template ({', '.join(CHAT_TEMPLATES)}); --template {template} "
                         "has no turns to continue")
    end, turn = _CHAT_TURNS[template]
    return end, turn.format(reply=reply)


def _check(template: str) -> None:
    if template not in _RENDERERS:
        raise ValueError(f"unknown prompt template {template!r}; choose from: {', '.join(TEMPLATES)}")


def render_prompt(template: str, obs: str, tokenizer: Any = None, system: str | None = None) -> str:
    """Model input text for `obs` under `template` (one of `TEMPLATES`).

    `tokenizer` is only used by the `tokenizer` template (its `apply_chat_template`)."""
    _check(template)
    return _RENDERERS[template](obs, tokenizer, system)


def stop_strings(template: str) -> tuple[str, ...]:
    """Strings that end the assistant turn under `template` (empty: rely on the tokenizer's EOS)."""
    _check(template)
    return _STOP_STRINGS[template]
