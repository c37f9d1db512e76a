"""Lazy access to GEM: `import gem` costs about a second (reasoning-gym, matplotlib), so nothing in
`oat_dppo.envs` imports it at module level."""

from __future__ import annotations

import logging
import sys
from typing import Any


def import_gem() -> Any:
    """`import gem`, without keeping the side effect of its `logging.basicConfig(level=INFO)`.

    GEM configures the ROOT logger on import; in a program that has not configured logging, that
    would switch every library's INFO messages on. Undo exactly that and nothing else."""
    if "gem" in sys.modules:
        return sys.modules["gem"]
    root = logging.getLogger()
    handlers_before, level_before = list(root.handlers), root.level
    import gem

    if not handlers_before:
        for handler in [h for h in root.handlers if h not in handlers_before]:
            root.removeHandler(handler)
        root.setLevel(level_before)
    return gem


def gem_registry() -> dict[str, Any]:
    """GEM's id -> EnvSpec table (every `gem.register`ed id)."""
    import_gem()
    from gem.envs.registration import ENV_REGISTRY  # GEM: imported just above

    return ENV_REGISTRY


class FixedPoolReasoningGym:
    """A GEM reasoning-gym env whose question pool never changes under seeded resets.

    GEM 0.1.0's `ReasoningGymEnv.reset(seed)` draws `random.choice(pool)` but also replaces the
    pool after every `size` calls (it counts calls in `idx`). `reset(seed=k)` would then depend on
    how many resets the instance has seen, and instances could no longer share a start state by
    sharing a seed. Resetting the counter before each call keeps the pool fixed; everything else
    is GEM's own env (question, scorer)."""

    def __init__(self, env: Any):
        self.env = env

    def reset(self, seed: int | None = None) -> Any:
        self.env.idx = 0
        return self.env.reset(seed=seed)

    def step(self, action: str) -> Any:
        return self.env.step(action)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)
