"""Resources: named, versioned texts an agent reads from its episode, recorded on its trajectory."""

from __future__ import annotations

import json

import pytest

from agentgym_lightning import read_resource
from agentgym_lightning.cli import build_parser
from agentgym_lightning.commands.train import build_config
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.resources import Resource, as_resources, content_version, parse_resource_arg
from agentgym_lightning.trajectory import Trajectory

DEFAULT = "You are the default."


def reading_agent(task, ctx):
    """Reads its system prompt through the episode, with its constant as the default, and asks once."""
    system = ctx.resource("system_prompt", default=DEFAULT)
    reply = ctx.chat_completion([{"role": "system", "content": system}, {"role": "user", "content": str(task)}])
    return reply.text


def one_episode(env: AgentEnv, **options):
    obs, _ = env.reset(seed=0, options=options or None)
    system = obs.request.messages[0]["content"]
    *_, info = env.step("done")
    return system, info["trajectory"]


def test_a_resource_is_versioned_by_its_text_unless_given_a_version():
    assert Resource("p", "abc").version == content_version("abc") == Resource("q", "abc").version
    assert Resource("p", "abc").version.startswith("sha256:") and len(Resource("p", "abc").version) == 19
    assert Resource("p", "abd").version != Resource("p", "abc").version
    assert Resource("p", "abc", "v2").version == "v2"
    assert as_resources({"a": "x", "b": {"text": "y", "version": "7"}, "c": Resource("c", "z")}) == {
        "a": Resource("a", "x"), "b": Resource("b", "y", "7"), "c": Resource("c", "z")
    }


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        ("text", TypeError, "must be a mapping"),
        ({"a": 3}, TypeError, r"resources\['a'\] must be a text"),
        ({"a": {"txt": "x"}}, ValueError, "with 'text'"),
        ({"a": Resource("b", "x")}, ValueError, "resource named 'b'"),
        ({"": "x"}, ValueError, "non-empty string"),
    ],
)
def test_bad_resources_say_which_entry_is_wrong(spec, error, match):
    with pytest.raises(error, match=match):
        as_resources(spec)


def test_resource_arguments_read_a_file_without_its_trailing_newline(tmp_path):
    path = tmp_path / "best.txt"
    path.write_text("line one\nline two\n\n", encoding="utf-8")
    assert parse_resource_arg(f"system_prompt=@{path}") == Resource("system_prompt", "line one\nline two")
    assert parse_resource_arg("system_prompt=Be brief.") == Resource("system_prompt", "Be brief.")
    with pytest.raises(ValueError, match="no such file"):
        parse_resource_arg(f"system_prompt=@{tmp_path / 'absent.txt'}")
    with pytest.raises(ValueError, match="NAME=@FILE or NAME=TEXT"):
        parse_resource_arg("system_prompt")


def test_without_resources_the_agent_runs_on_its_constant_and_nothing_is_recorded():
    env = AgentEnv(reading_agent, ["t"], lambda task, result: 1.0)
    try:
        system, trajectory = one_episode(env)
        assert system == DEFAULT
        assert trajectory.resources == {}
        assert "resources" not in trajectory.to_dict()  # files of agents without resources stay as they were
        assert env.resources_read == {"system_prompt": DEFAULT}
    finally:
        env.close()


def test_the_env_resource_replaces_the_constant_and_its_version_is_recorded():
    env = AgentEnv(reading_agent, ["t"], lambda task, result: 1.0, resources={"system_prompt": {"text": "Be exact.", "version": "v2"}})
    try:
        system, trajectory = one_episode(env)
        assert system == "Be exact."
        assert trajectory.resources == {"system_prompt": "v2"}
        again = Trajectory.from_dict(json.loads(trajectory.to_json(compact=True)))
        assert again.resources == {"system_prompt": "v2"}
        # An episode may replace it; the env's own comes back on the next one.
        system, trajectory = one_episode(env, resources={"system_prompt": "Per episode."})
        assert system == "Per episode."
        assert trajectory.resources == {"system_prompt": content_version("Per episode.")}
        system, _ = one_episode(env)
        assert system == "Be exact."
        env.resources = {"system_prompt": "Set later."}
        assert one_episode(env)[0] == "Set later."
        with pytest.raises(TypeError, match="must be a text"):
            env.resources = {"system_prompt": 1}
    finally:
        env.close()


def test_a_resource_without_a_default_or_a_value_fails_the_episode_saying_so():
    def strict_agent(task, ctx):
        return ctx.resource("rubric")

    env = AgentEnv(strict_agent, ["t"], lambda task, result: 1.0, resources={"system_prompt": "x"})
    try:
        _, info = env.reset(seed=0)
        assert info["episode_over"]
        assert "no resource 'rubric' (given: system_prompt)" in info["error"]
    finally:
        env.close()


def test_read_resource_outside_an_episode_is_the_default():
    assert read_resource("system_prompt", "fallback") == "fallback"
    with pytest.raises(KeyError, match="give a default"):
        read_resource("system_prompt")


def test_the_math_agent_reads_its_system_prompt_through_the_episode():
    from agentgym_lightning.envs.math.agent import COMPACT_TOOL_PROMPT, SYSTEM_PROMPT
    from agentgym_lightning.envs.math.env import make_arithmetic_env

    plain = make_arithmetic_env(difficulty=1, split="test")
    given = make_arithmetic_env(difficulty=1, split="test", resources={"system_prompt": "Think, then answer."})
    try:
        obs, _ = plain.reset(seed=0, options={"task_index": 0})
        assert obs.request.messages[0]["content"] == f"{SYSTEM_PROMPT}\n{COMPACT_TOOL_PROMPT}"  # unchanged by default
        obs_given, _ = given.reset(seed=0, options={"task_index": 0})
        assert obs_given.request.messages[0]["content"] == f"Think, then answer.\n{COMPACT_TOOL_PROMPT}"
        assert obs_given.request.messages[1:] == obs.request.messages[1:]
        assert given.trajectory.resources == {"system_prompt": content_version("Think, then answer.")}
    finally:
        plain.close()
        given.close()


def test_the_solver_verifier_reads_the_solvers_system_prompt():
    from agentgym_lightning.envs.math.env import make_arithmetic_env

    env = make_arithmetic_env(difficulty=1, split="test", agent="solver-verifier", resources={"system_prompt": "Solve it."})
    try:
        obs, _ = env.reset(seed=0, options={"task_index": 0})
        assert obs.request.messages[0]["content"].startswith("Solve it.\n")
    finally:
        env.close()


def test_train_resource_flag_puts_the_file_into_the_env_kwargs(tmp_path):
    path = tmp_path / "system_prompt.txt"
    path.write_text("Evolved prompt.\n", encoding="utf-8")
    args = build_parser("train").parse_args([
        "train", "--env", "lightning/Arithmetic-v0", "--env-kwarg", "difficulty=3",
        "--resource", f"system_prompt=@{path}", "--eval-env-kwarg", "split=test",
    ])
    config = build_config(args)
    assert config.env_kwargs == {
        "difficulty": 3, "resources": {"system_prompt": {"text": "Evolved prompt.", "version": content_version("Evolved prompt.")}}
    }
    assert config.eval_env_kwargs == {"split": "test"}  # merged over env_kwargs: the held-out eval reads it too
    bad = build_parser("train").parse_args(["train", "--resource", f"system_prompt=@{tmp_path / 'none.txt'}"])
    with pytest.raises(ValueError, match="no such file"):
        build_config(bad)
