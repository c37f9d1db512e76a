"""``vllm.sequence.Logprob`` with vLLM 0.8.4's fields and defaults; the per-position log-prob maps
of a completion are ``dict[token_id, Logprob]`` (``SampleLogprobs``)."""

from dataclasses import dataclass
from typing import Dict, List, Optional


@dataclass
class Logprob:
    logprob: float  # log-prob of this token under the sampler's (raw-logit, V1) distribution
    rank: Optional[int] = None  # vocab rank of this token, 1 = most likely
    decoded_token: Optional[str] = None


PromptLogprobs = List[Optional[Dict[int, Logprob]]]
SampleLogprobs = List[Dict[int, Logprob]]
