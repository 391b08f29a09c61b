"""Non-finite or absurd rewards are refused where they enter; their episodes never reach the update."""

from __future__ import annotations

import math
import re
import warnings

import pytest

from agentgym_lightning import Status
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.reward_bounds import MAX_ABS_REWARD, RewardRefused, RewardRefusedWarning, reward_refused
from agentgym_lightning.training.samples import build_samples


def one_call_agent(reward=None, source="judge"):
    def agent(task, ctx):
        ctx.chat_completion([{"role": "user", "content": "q"}])
        if reward is not None:
            ctx.emit_reward(reward, source=source)
        ctx.emit_variable("invalid_guess", True)
        return "done"

    return agent


def finish(env, seed=0):
    env.reset(seed=seed)
    return env.step("a")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1e308])
def test_a_reward_fn_giving_a_non_finite_or_huge_reward_excludes_the_episode(bad):
    # Before: NaN ended the episode "succeeded" with final_reward=nan (then NaN advantages).
    env = AgentEnv(one_call_agent(), [{}], lambda task, result: bad, env_id=f"bad/Reward-{bad}")
    with pytest.warns(RewardRefusedWarning, match=re.escape(f"the reward_fn of bad/Reward-{bad}")):
        _, reward, terminated, truncated, info = finish(env)
    t = info["trajectory"]
    assert t.status is Status.INFRA_FAILED and not t.trainable and reward_refused(t)
    assert t.final_reward is None and math.isfinite(reward) and truncated and not terminated
    assert "rewards must be finite numbers within" in info["error"]


def test_the_warning_is_given_once_per_source():
    env = AgentEnv(one_call_agent(), [{}], lambda task, result: math.nan, env_id="bad/Once-v0")
    with pytest.warns(RewardRefusedWarning):
        finish(env)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RewardRefusedWarning)
        *_, info = finish(env, seed=1)
    assert reward_refused(info["trajectory"])


def test_emit_reward_beyond_the_bound_is_refused_to_the_agent_and_excludes_the_episode():
    # Before: 1e308 was accepted and build_samples raised OverflowError, killing the run.
    seen = []

    def agent(task, ctx):
        ctx.chat_completion([{"role": "user", "content": "q"}])
        try:
            ctx.emit_reward(1e308, source="huge-judge")
        except RewardRefused as exc:
            seen.append(exc)
        return "done"

    env = AgentEnv(agent, [{}], lambda task, result: 1.0)
    with pytest.warns(RewardRefusedWarning, match=r"emit_reward\(source='huge-judge'\)"):
        *_, info = finish(env)
    assert len(seen) == 1 and isinstance(seen[0], ValueError)
    assert reward_refused(info["trajectory"]) and info["trajectory"].steps[0].rewards == []


def test_an_air_reward_beyond_the_bound_is_refused():
    env = AgentEnv(one_call_agent(), [{}], lambda task, result: 1.0, air_weights={"invalid_guess": 1e300}, env_id="bad/Air-v0")
    with pytest.warns(RewardRefusedWarning, match="AIR source 'invalid_guess' of bad/Air-v0"):
        *_, info = finish(env)
    assert reward_refused(info["trajectory"]) and info["trajectory"].steps[0].rewards == []


def test_a_refused_episode_never_reaches_the_samples_and_is_counted():
    good = AgentEnv(one_call_agent(reward=0.5, source="ok"), [{}], lambda task, result: 1.0)
    bad = AgentEnv(one_call_agent(reward=MAX_ABS_REWARD * 2, source="too-big"), [{}], lambda task, result: 1.0)
    with pytest.warns(RewardRefusedWarning):
        trajectories = [finish(env, seed=i)[-1]["trajectory"] for i, env in enumerate([good, good, bad])]
    for i, t in enumerate(trajectories):
        t.group_id = "g"
        t.steps[0].completion.prompt_token_ids, t.steps[0].completion.completion_token_ids = [1], [2]
    trajectories[1].final_reward = 0.0  # a group with variance, so rows are built
    batch = build_samples(trajectories)
    assert {s.episode_id for s in batch.samples} == {trajectories[0].episode_id, trajectories[1].episode_id}
    assert batch.stats["episodes/reward_refused"] == 1 and batch.stats["episodes/infra_failed"] == 1
    assert all(math.isfinite(a) for s in batch.samples for a in s.advantages)
