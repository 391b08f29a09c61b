"""The env contract as a new user meets it: TimeLimit, vector envs, missing rewards, template
drift versus rebuilt prompts, answering a call with an error, and per-step cost."""

from __future__ import annotations

import warnings

import gymnasium as gym
import openai
import pytest

import agentgym_lightning  # noqa: F401 - registers the lightning/... ids
from agentgym_lightning import Completion, Status
from agentgym_lightning.env import AgentEnv, NoRewardWarning
from agentgym_lightning.gateway import GatewayError
from agentgym_lightning.trajectory import Step


def chat_agent(task, ctx):
    """Keeps one conversation: each call's messages extend the previous call's and its answer."""
    messages = [{"role": "user", "content": "start"}]
    for _ in range(task["calls"]):
        text = ctx.chat_completion(list(messages)).text  # a copy: the native path keeps the list
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
    return text


def rebuilding_agent(task, ctx):
    """Starts a new conversation for every call (as Spider's checker and rewriter do)."""
    text = ""
    for i in range(task["calls"]):
        text = ctx.chat_completion([{"role": "system", "content": f"role {i}"}, {"role": "user", "content": text}]).text
    return text


def test_gym_make_max_episode_steps_keeps_the_trajectory_and_stops_the_agent():
    env = gym.make("lightning/GuessNumber-v0", max_episode_steps=2)
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step("1")
    assert not terminated and not truncated
    _, _, terminated, truncated, info = env.step("2")
    assert truncated and not terminated
    assert info["status"] == "truncated" and "max_turns=2" in info["error"]
    trajectory = info["trajectory"]
    assert trajectory.status is Status.TRUNCATED and len(trajectory.steps) == 2
    env.close()  # the autouse fixture checks that no agent thread is left


def test_max_episode_steps_never_raises_the_envs_own_max_turns():
    env = gym.make("lightning/GuessNumber-v0", max_turns=3, max_episode_steps=50)
    assert env.unwrapped.max_turns == 3
    env.close()
    env = gym.make("lightning/GuessNumber-v0", max_turns=30, max_episode_steps=5)
    assert env.unwrapped.max_turns == 5
    env.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_make_vec_runs_in_both_modes(mode):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Gymnasium's checker notes about render fps
        venv = gym.make_vec("lightning/GuessNumber-v0", num_envs=2, vectorization_mode=mode)
    try:
        obs, _ = venv.reset(seed=0)
        assert len(obs) == 2 and all(o.request.messages[-1]["role"] == "user" for o in obs)
        for _ in range(12):
            obs, reward, terminated, truncated, info = venv.step(["50", "25"])
            if terminated.any() or truncated.any():
                break
        done = terminated | truncated
        assert done.all()
        assert list(info["status"]) == ["succeeded", "succeeded"]
        assert all(t.status is Status.SUCCEEDED for t in info["trajectory"])
    finally:
        venv.close()


def test_an_observation_too_big_for_shared_memory_says_what_to_do():
    from agentgym_lightning.llm import ChatRequest
    from agentgym_lightning.spaces import Observation, ObservationSpace, _write_observation

    space = ObservationSpace(shared_memory_bytes=1024)
    memory = bytearray(2 * 1024)
    with pytest.raises(ValueError, match="shared_memory.: False"):
        _write_observation(space, 1, Observation(ChatRequest(messages=[{"role": "user", "content": "x" * 2000}])), memory)


def test_no_reward_function_warns_once_per_env_and_leaves_final_reward_none():
    env = AgentEnv(chat_agent, [{"calls": 1}])
    with pytest.warns(NoRewardWarning, match="no reward_fn") as record:
        for _ in range(3):
            env.reset()
            *_, info = env.step("x")
            assert info["status"] == "succeeded" and info["final_reward"] is None
    assert len([w for w in record if issubclass(w.category, NoRewardWarning)]) == 1
    env.close()


def test_template_drift_and_rebuilt_prompts_are_reported_apart():
    def drifting(obs):  # ids never extend the previous call's
        return Completion(text="a", prompt_token_ids=[len(obs.messages), 0], completion_token_ids=[1])

    for agent, drift, rebuilt in ((chat_agent, 2, 0), (rebuilding_agent, 0, 2)):
        env = AgentEnv(agent, [{"calls": 3}], lambda task, result: 1.0)
        obs, _ = env.reset()
        while True:
            obs, _, terminated, truncated, info = env.step(drifting(obs))
            if terminated or truncated:
                break
        trajectory = info["trajectory"]
        assert [s.prompt_extends_previous for s in trajectory.steps] == [None, False, False]
        assert (trajectory.template_mismatches, trajectory.prompt_rebuilds) == (drift, rebuilt), agent.__name__
        env.close()


def test_a_call_answered_with_an_error_reaches_the_agent_as_an_openai_error():
    def agent(task, ctx):
        client = ctx.openai_client()
        try:
            client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "bad"}])
        except openai.BadRequestError as exc:
            first = f"rejected: {exc.status_code}"
        reply = client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "good"}])
        return first, reply.choices[0].message.content

    env = AgentEnv(agent, [{}], lambda task, result: 1.0)
    env.reset()
    env.step(GatewayError(400, "the policy backend rejected this request: top_p is NaN"))
    *_, info = env.step("fine")
    trajectory = info["trajectory"]
    assert info["status"] == "succeeded" and trajectory.result == ("rejected: 400", "fine")
    rejected, answered = trajectory.steps
    assert rejected.completion is None and not rejected.trainable and "top_p is NaN" in rejected.error
    assert answered.completion.text == "fine" and answered.error is None
    env.close()


def test_step_wait_with_a_timeout_only_looks():
    import threading

    release = threading.Event()

    def slow(task, ctx):
        release.wait(5)
        return ctx.chat_completion([{"role": "user", "content": "hi"}]).text

    env = AgentEnv(slow, [{}], lambda task, result: 1.0)
    env.reset_async()
    with pytest.raises(TimeoutError):
        env.reset_wait(timeout=0)
    release.set()
    obs, _ = env.reset_wait(timeout=5)
    assert obs.messages[0]["content"] == "hi"
    env.close()


def test_a_step_costs_the_same_however_long_the_episode(monkeypatch):
    """Before: each step searched the episode's steps (``steps.index``: dataclass ``__eq__``
    against every earlier step), so a step cost grew with the episode."""
    compared = []
    real_eq = Step.__eq__
    monkeypatch.setattr(Step, "__eq__", lambda self, other: compared.append(1) or real_eq(self, other))
    env = AgentEnv(chat_agent, [{"calls": 300}], lambda task, result: 1.0, time_limit=None)
    env.reset()
    for i in range(300):
        *_, info = env.step(Completion(text="a", prompt_token_ids=[1, 2, 3], completion_token_ids=[4]))
    assert info["status"] == "succeeded"
    assert compared == []
    env.close()
