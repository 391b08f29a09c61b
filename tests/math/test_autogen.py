"""``agent="autogen"`` on the math envs: the calculator agent as an AutoGen AssistantAgent, with a
scripted policy; same prompts, signals and rewards as the from-scratch agent's ``tools`` protocol."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("autogen_agentchat", reason="needs the [autogen] extra")

from agentgym_lightning import Status  # noqa: E402
from agentgym_lightning.envs.math.data import MathDataWarning  # noqa: E402
from agentgym_lightning.envs.math.env import calculator_policy, make_arithmetic_env, make_gsm8k_env  # noqa: E402

AIR = {"math.calc_ok": 0.1, "math.calc_error": -0.1, "math.no_tool": -0.05}


def play(env, policy):
    obs, info = env.reset(seed=0, options={"task_index": 0})
    task, requests, rewards, done = info["task"], [], [], False
    while not done:
        requests.append(obs.request)
        obs, reward, terminated, truncated, info = env.step(policy(obs, task))
        rewards.append(reward)
        done = terminated or truncated
    return info["trajectory"], requests, rewards


def test_autogen_agent_matches_the_from_scratch_tools_agent():
    runs = {}
    for agent in ("scratch", "autogen"):
        env = make_arithmetic_env(difficulty=2, split="test", agent=agent, protocol="tools", air_weights=AIR, temperature=0,
                                  max_tokens=48)
        try:
            runs[agent] = play(env, calculator_policy)
        finally:
            env.close()
    (scratch, q_scratch, r_scratch), (ag, q_ag, r_ag) = runs["scratch"], runs["autogen"]
    assert ag.status is Status.SUCCEEDED, ag.error
    assert ag.final_reward == scratch.final_reward == 1.0
    assert r_ag == pytest.approx(r_scratch)  # calc_ok lands on the call that asked for it, then the answer
    assert [s.agent for s in ag.steps] == ["solver", "solver"]
    assert ag.variables["metrics"] == scratch.variables["metrics"]
    for name in ("answer", "answer_status", "calculator_calls"):
        assert ag.variables[name] == scratch.variables[name]
    assert ag.steps[0].outcome["calculator"] == scratch.steps[0].outcome["calculator"]
    # The same conversation in OpenAI format: instructions, the worked examples, the question, the tool round.
    for a, b in zip(q_scratch, q_ag, strict=True):
        assert [m["role"] for m in a.messages] == [m["role"] for m in b.messages]
        assert [m.get("content") for m in a.messages if m["role"] in ("system", "user", "tool")] == \
               [m.get("content") for m in b.messages if m["role"] in ("system", "user", "tool")]
        assert b.tools[0]["function"]["name"] == "calculator"
        # ...asked for the same way (AutoGen once sent no temperature: "greedy" evals sampled)
        assert (b.sampling.temperature, b.sampling.max_tokens) == (a.sampling.temperature, a.sampling.max_tokens) == (0, 48)


def test_autogen_runs_gsm8k_and_refuses_the_text_protocol():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MathDataWarning)
        env = make_gsm8k_env(agent="autogen", limit=2)
    try:
        trajectory, _, _ = play(env, calculator_policy)
    finally:
        env.close()
    assert trajectory.status is Status.SUCCEEDED and trajectory.final_reward == 1.0
    with pytest.raises(ValueError, match="protocol must be 'tools'"):
        make_arithmetic_env(agent="autogen", protocol="text")
    with pytest.raises(ValueError, match="choose one of scratch, autogen"):
        make_arithmetic_env(agent="crewai")


def test_with_the_compact_tool_prompt_autogen_sends_the_model_the_text_protocols_prompt():
    # SmolLM2's template has no tools: the policy describes them in the system prompt. With
    # tool_prompt="compact" the AutoGen agent's conversation reaches the model exactly as the
    # from-scratch text protocol's does (the prompt the embedded model was measured to follow).
    from agentgym_lightning.policies.chat import prepare_messages

    firsts = {}
    for agent, protocol in (("scratch", "text"), ("autogen", "tools")):
        env = make_arithmetic_env(difficulty=2, split="test", agent=agent, protocol=protocol, examples=3)
        try:
            _, requests, _ = play(env, calculator_policy)
        finally:
            env.close()
        firsts[agent] = requests
    text, tools = firsts["scratch"], firsts["autogen"]
    assert tools[0].tools and not text[0].tools
    for a, b in zip(text, tools, strict=True):
        assert prepare_messages(b, native_tools=False, tool_prompt="compact") == prepare_messages(a, native_tools=False)
    assert prepare_messages(tools[0], native_tools=False)[0] != prepare_messages(text[0], native_tools=False)[0]  # "full" differs


def test_autogen_agent_reads_its_system_prompt_from_the_episode_as_the_scratch_agent_does():
    firsts = {}
    for agent in ("scratch", "autogen"):
        env = make_arithmetic_env(difficulty=2, split="test", agent=agent, protocol="tools",
                                  resources={"system_prompt": "Compute with the tool."})
        try:
            obs, _ = env.reset(seed=0, options={"task_index": 0})
            firsts[agent] = obs.request.messages[0]["content"]
            assert env.trajectory.resources["system_prompt"].startswith("sha256:")
        finally:
            env.close()
    # The adapter hands AutoGen only its model client: it reads the resource from the running episode.
    assert firsts["autogen"] == firsts["scratch"] == "Compute with the tool."
