"""What a batch of episodes reports (`oat_dppo.agent.metrics`): the repeat rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oat_dppo.agent import Episode, Turn, episode_metrics
from oat_dppo.agent.metrics import repeat_rate


def said(*responses: list[int], error: str | None = None) -> Episode:
    """An episode of one turn per response (token ids)."""
    turns = [Turn(prompt_ids=[0], response_ids=ids, behavior_logprobs=np.zeros(len(ids), dtype=np.float32),
                  reward=0.0, done=i == len(responses) - 1, truncated=False, well_formed=True, finish_reason="stop")
             for i, ids in enumerate(responses)]
    return Episode(env_index=0, seed=0, turns=turns, error=error)


def test_repeat_rate_counts_turns_that_say_what_the_turn_before_said():
    """Turns 2.. of each episode compared with the turn before, token for token; an episode of one
    turn has nothing to compare; an env error's episode is left out of the batch metrics."""
    batch = [said([5], [5], [5, 1]), said([7], [7]), said([3]), said([9], [9], error="boom")]
    assert repeat_rate(batch[:3]) == pytest.approx(2 / 3)  # 5->5 yes, 5->5,1 no, 7->7 yes
    assert episode_metrics(batch)["repeat_rate"] == pytest.approx(2 / 3)


def test_single_turn_batches_report_no_repeat_rate():
    assert math.isnan(repeat_rate([said([1]), said([1])]))
    assert "repeat_rate" not in episode_metrics([said([1]), said([1])])
