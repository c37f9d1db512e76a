"""Import-boundary fake of ``vllm`` (the real one needs CUDA; it is never installed on CPU machines).

It exists only so that Oat 0.2.4 modules import here (``oat.actors.base`` does ``import vllm`` and
``from vllm.lora.request import LoRARequest`` at module level) and so that tests can build
vLLM-shaped outputs (``vllm.outputs``, ``vllm.sequence.Logprob``). It has no engine: ``LLM(...)``
raises. Names and field layouts follow vLLM 0.8.4, the version Oat 0.2.4 pins.
"""

from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.sequence import Logprob

__version__ = "0.8.4"  # oat.actors.base asserts vllm >= 0.8.3
__oat_dppo_fake__ = True


class LLM:
    """No engine here. Note: ``ActorBase.init`` retries ``vllm.LLM(...)`` 10 times with growing sleeps
    (about 2 minutes in all) before giving up, so a test that calls it must replace ``vllm.LLM`` first."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("fake vllm (tests/oat_fakes): there is no inference engine on this machine")


__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob", "__version__"]
