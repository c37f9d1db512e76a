"""``RequestOutput`` / ``CompletionOutput`` with vLLM 0.8.4's fields (those a consumer reads)."""

from dataclasses import dataclass
from typing import Any, List, Optional

from vllm.sequence import PromptLogprobs, SampleLogprobs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[SampleLogprobs]  # one dict[token_id, Logprob] per generated token
    finish_reason: Optional[str] = None  # "stop" | "length" | None
    stop_reason: Any = None
    lora_request: Any = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: Optional[List[int]]
    prompt_logprobs: Optional[PromptLogprobs]
    outputs: List[CompletionOutput]
    finished: bool
    metrics: Any = None
    lora_request: Any = None
    encoder_prompt: Optional[str] = None
    encoder_prompt_token_ids: Optional[List[int]] = None
    num_cached_tokens: Optional[int] = None
