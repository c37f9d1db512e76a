"""The simulator's knobs, in one dataclass (every field is recorded next to the results)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class SimConfig:
    # policy (benchmarks.lab.policy)
    vocab: int = 2048  # V: long-tailed vocabulary
    seq_len: int = 16  # T: response tokens per rollout
    n_problems: int = 64  # the training set: prompts, each with one hidden answer
    embed_dim: int = 64
    hidden_dim: int = 128
    zipf_exponent: float = 1.1  # base logits -s*log(rank): the long tail every state shares
    state_logit_scale: float = 2.0  # std of the state-dependent part of the initial logits
    # task (benchmarks.lab.task)
    max_target_rank: int = 64  # answer tokens are the initial policy's rank-k token, k log-uniform in [1, this]
    # mismatch (benchmarks.lab.mismatch)
    mismatch: str = "round"  # "round": engine rounds weights/activations/logits; "noise": adds logit noise; "none"
    mantissa_bits: int = 8  # significant bits kept by "round" (8 = bfloat16)
    noise_std: float = 0.05  # std of the logit noise of "noise"
    # trainer (benchmarks.lab.trainer)
    iterations: int = 150
    prompts_per_batch: int = 8  # paper: 64
    group_size: int = 8  # G rollouts per prompt (paper: 8)
    grad_steps: int = 4  # gradient steps per rollout batch (paper: 4)
    minibatch: bool = True  # True: the batch is split into grad_steps mini-batches (verl); False: full-batch epochs
    lr: float = 1e-3  # Adam
    grad_clip: float = 1.0  # global grad-norm clip (verl's default); 0 disables
    aggregation: str = "token_mean"

    def replace(self, **kw) -> "SimConfig":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return asdict(self)
