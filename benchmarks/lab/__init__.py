"""The trust-region lab: a CPU-scale replica of the DPPO paper's stability and efficiency mechanisms.

A tiny autoregressive policy over a long-tailed vocabulary, an "inference engine" that computes the
same policy with reduced-precision rounding (the training-inference mismatch), a task with a hidden
answer and a sequence-level reward, and a GRPO-style trainer that plugs in any trust region from
`oat_dppo.trust_region` through its public API. See docs/lab.md.

    python -m benchmarks.lab fig3 --seeds 3
"""

from benchmarks.lab.config import SimConfig
from benchmarks.lab.trainer import run_simulation

__all__ = ["EXPERIMENTS", "SimConfig", "StrategySpec", "run_simulation"]
