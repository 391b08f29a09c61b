"""``agent_match``: which calls are trainable, by agent name, role or semantic variable."""

from __future__ import annotations

import pytest

from agentgym_lightning.agent_match import AgentMatch, as_agent_match
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.llm import ChatRequest
from agentgym_lightning.trajectory import Step


def step(agent=None, role=None, **variables):
    return Step(index=0, request=ChatRequest(messages=[{"role": "user", "content": "x"}]), agent=agent, role=role,
                variables=variables)


def test_a_string_matches_agent_name_or_role_in_full():
    match = as_agent_match("writer|rewriter")
    assert match(step(agent="writer")) and match(step(role="rewriter"))
    assert not match(step(agent="checker")) and not match(step(agent="writer2")) and not match(step())


def test_fields_combine():
    match = as_agent_match({"role": "solver", "variables": {"phase": "final"}})
    assert match(step(role="solver", phase="final"))
    assert not match(step(role="solver", phase="draft")) and not match(step(role="solver"))
    assert AgentMatch(agent="a.*")(step(agent="alice")) and not AgentMatch(agent="a.*")(step(role="alice"))


def test_bad_specs_say_what_is_wrong():
    with pytest.raises(ValueError, match="not a valid regular expression"):
        as_agent_match("writer(")
    with pytest.raises(ValueError, match="unknown keys"):
        as_agent_match({"node": "writer"})
    with pytest.raises(ValueError, match="at least one"):
        AgentMatch()
    with pytest.raises(TypeError, match="agent_match must be"):
        as_agent_match(3)
    assert as_agent_match(None) is None
    fn = lambda s: True  # noqa: E731
    assert as_agent_match(fn) is fn


def two_agents(task, ctx):
    """A plain agent with two parts, naming them in the request metadata as the adapters do."""
    client = ctx.openai_client()
    for name in ("planner", "executor", "planner"):
        ctx.emit_variable("phase", name)
        client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": name}],
                                       metadata={"agent": name})
    return "done"


@pytest.mark.parametrize(
    ("spec", "trainable"),
    [
        (None, [True, True, True]),
        ("executor", [False, True, False]),
        ({"variables": {"phase": "planner"}}, [True, False, True]),
        (lambda s: s.index == 0, [True, False, False]),
    ],
)
def test_env_marks_unmatched_calls_untrainable_but_answers_them(spec, trainable):
    env = AgentEnv(two_agents, ["t"], lambda t, r: 1.0, agent_match=spec)
    try:
        env.reset(seed=0)
        done, answered = False, 0
        while not done:
            _, _, terminated, truncated, info = env.step("ok")
            answered += 1
            done = terminated or truncated
    finally:
        env.close()
    trajectory = info["trajectory"]
    assert answered == 3 and info["status"] == "succeeded"
    assert [s.agent for s in trajectory.steps] == ["planner", "executor", "planner"]
    assert [s.trainable for s in trajectory.steps] == trainable
    assert all(s.completion is not None and s.completion.text == "ok" for s in trajectory.steps)
    assert [s["agent"] for s in trajectory.to_dict()["steps"]] == ["planner", "executor", "planner"]
