"""Engine-agnostic agent loop: episodes of turns with mu (and top-K), returns, advantages, metrics."""

from oat_dppo.agent.advantages import ADVANTAGE_MODES, assign_advantages, discounted_returns, uncredited_turn_rate
from oat_dppo.agent.loop import PromptFormat, RolloutStats, play_episodes
from oat_dppo.agent.metrics import EVAL_KEYS, SUCCESS_RETURN, combine_eval, episode_metrics
from oat_dppo.agent.types import Episode, Turn

__all__ = ["ADVANTAGE_MODES", "EVAL_KEYS", "Episode", "PromptFormat", "RolloutStats", "SUCCESS_RETURN", "Turn",
           "assign_advantages", "combine_eval", "discounted_returns", "episode_metrics", "play_episodes",
           "uncredited_turn_rate"]
