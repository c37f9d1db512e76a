"""Generation engines: prompts (token ids) in, sampled responses with behavior log-probs mu out.

`Generation`, `Engine` and `PromptTooLongError` are engine-agnostic (numpy only); `HFEngine`
(transformers `generate`) is imported on first use so that `from oat_dppo.engine import Generation`
stays light.
"""

from .base import Engine, Generation, PromptTooLongError

__all__ = ["Engine", "Generation", "PromptTooLongError", "HFEngine"]


def __getattr__(name):
    if name == "HFEngine":
        from .hf import HFEngine

        return HFEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
