"""Exceptions raised by the environment adapter.

The agent loop relies on the split: `EnvError` subclasses mean "this one episode is lost, drop it
and count it", while `ValueError` subclasses are configuration mistakes that should stop a run
before it starts.
"""

from __future__ import annotations


class UnknownEnvError(ValueError):
    """An environment id that is neither known (GEM, `math`, `math:procedural`) nor importable."""


class DatasetUnavailableError(ValueError):
    """A dataset-backed environment whose data cannot be loaded (offline machine, missing file)."""


class EnvOptionError(ValueError):
    """An option a GEM environment's constructor does not name (its `**_` would swallow it silently)."""


class EnvError(RuntimeError):
    """The wrapped environment failed while playing an episode. The episode is unusable."""

    def __init__(self, message: str, *, env_id: str, turn: int):
        super().__init__(message)
        self.env_id = env_id
        self.turn = turn


class EnvResetError(EnvError):
    """`reset()` of the wrapped environment raised or returned something that is not text."""


class EnvStepError(EnvError):
    """`step()` of the wrapped environment raised or broke the (obs, reward, ...) contract."""
