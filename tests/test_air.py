"""AIR: the hooks' signals weighed into a step's rewards, refused ones kept out (agentgym_lightning.air)."""

from __future__ import annotations

import math

import pytest

from agentgym_lightning.air import AirRewards, air_rewards, weigh_signals
from agentgym_lightning.episode import Episode
from agentgym_lightning.llm import ChatRequest, Completion
from agentgym_lightning.reward_bounds import RewardRefusedWarning
from agentgym_lightning.trajectory import Reward


def test_signals_are_weighed_by_source_and_unweighted_ones_dropped():
    signals = [Reward(1.0, "tool_error"), [Reward(2.0, "sql_ok"), Reward(5.0, "unweighted")], None, []]
    air = weigh_signals(signals, {"tool_error": -0.1, "sql_ok": 0.5}, "my/Env-v0")
    assert [(r.source, r.value, r.raw) for r in air.rewards] == [("tool_error", pytest.approx(-0.1), 1.0), ("sql_ok", 1.0, 2.0)]
    assert air.refused == []
    assert weigh_signals(signals, {}, "my/Env-v0") == AirRewards()


def test_a_refused_air_reward_is_left_out_and_reported():
    with pytest.warns(RewardRefusedWarning, match="AIR source 'boom' of air/Test-v0"):
        air = weigh_signals([[Reward(math.inf, "boom"), Reward(1.0, "ok")]], {"boom": 1.0, "ok": 2.0}, "air/Test-v0")
    assert [r.source for r in air.rewards] == ["ok"]
    (message,) = air.refused
    assert message.startswith("reward refused: AIR source 'boom' of air/Test-v0")


def test_air_rewards_asks_the_hook_and_the_episode_adds_them():
    class Hook:
        def agentgym_intermediate_rewards(self, step, trajectory, weights):
            self.seen = (step, trajectory, dict(weights))
            return [Reward(1.0, "tool_error"), Reward(math.nan, "bad")]

    episode = Episode(task=None)
    episode.answer(episode.submit(ChatRequest(messages=[{"role": "user", "content": "hi"}])), Completion(text="ok"))
    (step,) = episode.trajectory.steps
    hook, weights = Hook(), {"tool_error": -0.5, "bad": 1.0}
    with pytest.warns(RewardRefusedWarning):
        air = air_rewards(hook, step, episode.trajectory, weights, "air/Hook-v0")
    assert hook.seen == (step, episode.trajectory, weights)
    episode.add_air(step, air)
    assert [(r.source, r.value) for r in step.rewards] == [("tool_error", -0.5)]
    assert episode.refused_reward is not None and "AIR source 'bad'" in episode.refused_reward
