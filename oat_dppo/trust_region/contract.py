"""What a strategy asks of the rollout and the learner: the declared half of the trust-region contract.

A strategy is any callable `(TrustRegionInputs) -> TrustRegionOutput`. Before it runs, two parts of
the system must know what it needs, and it says so with two attributes:

    topk: int              K of mu's top-K log-probs the rollout records per token (0: the sampled
                           token's log-prob only); the learner then passes `topk_*` inputs
    needs_old_logp: bool   the learner recomputes log pi_old (the policy before this update, one
                           no-grad forward) and passes it as `old_logp`
    trajectory_sequences: bool
                           the strategy decides per sequence and a sequence is a whole episode: the
                           learner keeps an episode's turns in one micro-batch and passes
                           `sequence_ids` (one id per episode); False: a turn is a sequence

`MaskedPolicyGradient`, the base of every built-in strategy, declares them. A user strategy that is a
plain function declares neither and needs neither. Read them only through `requirements(strategy)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Requirements:
    topk: int = 0
    needs_old_logp: bool = False
    trajectory_sequences: bool = False


def requirements(strategy: Any) -> Requirements:
    """The `Requirements` a strategy declares (defaults where it declares nothing); a declaration of
    the wrong type is a `ValueError` naming the strategy."""
    topk = getattr(strategy, "topk", 0)
    needs_old_logp = getattr(strategy, "needs_old_logp", False)
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 0:
        raise ValueError(f"{strategy!r} declares topk={topk!r}; it must be an int >= 0 (0: no top-K inputs)")
    if not isinstance(needs_old_logp, bool):
        raise ValueError(f"{strategy!r} declares needs_old_logp={needs_old_logp!r}; it must be True or False")
    trajectory_sequences = getattr(strategy, "trajectory_sequences", False)
    if not isinstance(trajectory_sequences, bool):
        raise ValueError(f"{strategy!r} declares trajectory_sequences={trajectory_sequences!r}; it must be True or False")
    return Requirements(topk=topk, needs_old_logp=needs_old_logp, trajectory_sequences=trajectory_sequences)
