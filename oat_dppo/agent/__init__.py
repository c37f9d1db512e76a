"""Engine-agnostic agent loop: episodes of turns with mu (and top-K), returns and advantages."""

from oat_dppo.agent.advantages import ADVANTAGE_MODES, assign_advantages, discounted_returns
from oat_dppo.agent.loop import PromptFormat, RolloutStats, play_episodes
from oat_dppo.agent.types import Episode, Turn

__all__ = ["ADVANTAGE_MODES", "Episode", "PromptFormat", "RolloutStats", "Turn", "assign_advantages",
           "discounted_returns", "play_episodes"]
