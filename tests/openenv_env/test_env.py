"""--env openenv:URL: an OpenEnv environment server (tests/openenv_env/word_game_server.py, started
on 127.0.0.1) played by our chat agent: the observation becomes messages, the completion an action
(a tool call on the server's action schema, or text for a one-field action), the env's reward and
done end it; the agent is replaceable; a server that is down or crashes fails only its episode."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("openenv") is None, reason="needs the openenv extra (make setup installs it)")

SERVER = Path(__file__).with_name("word_game_server.py")
CUSTOM_AGENT = """
from agentgym_lightning.envs.openenv_env.agent import OpenEnvChatAgent

class InstructionOnly(OpenEnvChatAgent):
    system_prompt = "Say what you are told."

    def render_observation(self, observation):
        return observation["instruction"]
"""


def _serve(*flags: str):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([sys.executable, str(SERVER), str(port), *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return process, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("the OpenEnv test server did not start within 120 s")


@pytest.fixture(scope="module")
def server():
    process, url = _serve()
    yield url
    process.terminate()
    process.wait(10)


def make(env: str, **kwargs):
    from agentgym_lightning.registration import make_env_factory, resolve_env_id

    return make_env_factory(resolve_env_id(env), kwargs)()


def word_in(obs) -> str:
    return re.search(r"Say the word (\w+)", obs.request.messages[-1]["content"]).group(1)


def play(env, policy, task_index=0):
    obs, _ = env.reset(seed=0, options={"task_index": task_index})
    seen = [obs]
    while True:
        obs, _, terminated, truncated, info = env.step(policy(seen[-1], len(seen)))
        if terminated or truncated:
            return seen, info
        seen.append(obs)


def test_the_chat_agent_plays_the_servers_environment_its_reward_the_envs(server):
    env = make(f"openenv:{server}")
    try:
        seen, info = play(env, lambda obs, turn: "banana" if turn == 1 else word_in(obs))
    finally:
        env.close()
    first = seen[0].request
    assert json.loads(first.messages[-1]["content"])["instruction"].startswith("Say the word ")
    [tool] = first.tools
    assert tool["function"]["name"] == "act" and tool["function"]["parameters"]["required"] == ["message"]
    assert "metadata" not in tool["function"]["parameters"]["properties"]
    trajectory = info["trajectory"]
    assert info["status"] == "succeeded" and trajectory.env_id == f"openenv:{server}"
    assert [s.outcome["openenv_reward"] for s in trajectory.steps] == [pytest.approx(-0.1), 1.0]
    assert info["final_reward"] == pytest.approx(0.9) and trajectory.result == {"return": pytest.approx(0.9), "done": True, "steps": 2}


def test_a_tool_call_is_an_action_and_an_invalid_one_is_shown_to_the_model(server):
    from agentgym_lightning.llm import Completion, ToolCall

    def policy(obs, turn):
        if turn == 1:
            return Completion(tool_calls=[ToolCall(id="a1", name="act", arguments={"words": "apple"})])
        return Completion(tool_calls=[ToolCall(id=f"a{turn}", name="act", arguments={"message": word_in_any(obs)})])

    def word_in_any(obs):
        return re.search(r"Say the word (\w+)", obs.request.messages[1]["content"]).group(1)

    env = make(f"openenv:{server}")
    try:
        seen, info = play(env, policy)
    finally:
        env.close()
    refusal = seen[1].request.messages[-1]
    assert refusal["role"] == "tool" and refusal["tool_call_id"] == "a1" and refusal["content"].startswith("That action is invalid:")
    steps = info["trajectory"].steps
    assert [s.outcome["invalid_action"] for s in steps] == [True, False]
    assert info["final_reward"] == 1.0 and info["trajectory"].result["steps"] == 1


def test_the_agent_is_replaceable_by_the_users_own(server, tmp_path):
    (tmp_path / "my_player.py").write_text(CUSTOM_AGENT)
    env = make(f"openenv:{server}", agent=f"{tmp_path / 'my_player.py'}:InstructionOnly", num_tasks=2, first_seed=7)
    try:
        assert env.tasks == [{"seed": 7}, {"seed": 8}]
        seen, info = play(env, lambda obs, turn: word_in(obs))
    finally:
        env.close()
    assert seen[0].request.messages[0] == {"role": "system", "content": "Say what you are told."}
    assert re.fullmatch(r"Say the word \w+\.", seen[0].request.messages[1]["content"])
    assert info["final_reward"] == 1.0


def test_a_server_that_is_down_or_crashes_fails_only_its_episode(server):
    down = make("openenv:http://127.0.0.1:9")
    try:
        _, info = play(down, lambda obs, turn: "apple")
    finally:
        down.close()
    assert info["status"] == "infra_failed"
    assert "OpenEnv server http://127.0.0.1:9 failed while reading its /schema" in info["error"] and "curl" in info["error"]
    process, crashing = _serve("--crash")
    try:
        env = make(f"openenv:{crashing}")
        try:
            _, info = play(env, lambda obs, turn: "apple")
        finally:
            env.close()
    finally:
        process.terminate()
        process.wait(10)
    assert info["status"] == "infra_failed" and f"OpenEnv server {crashing} failed while step" in info["error"]
    assert "the game engine crashed" in info["error"]


def test_a_module_names_the_environments_app_served_in_this_process(monkeypatch):
    monkeypatch.syspath_prepend(str(SERVER.parent))
    env = make("openenv:word_game_server")
    try:
        assert env.agent.url.startswith("http://127.0.0.1:")
        _, info = play(env, lambda obs, turn: word_in(obs))
    finally:
        env.close()
    assert info["status"] == "succeeded" and info["final_reward"] == 1.0
    assert info["trajectory"].env_id == "openenv:word_game_server"
    with pytest.raises(ValueError, match=r"cannot import 'my_missing_env.server.app' \(No module named 'my_missing_env'\)"):
        make("openenv:my_missing_env.server.app")
    with pytest.raises(ValueError, match="word_game_server has no app 'application'"):
        make("openenv:word_game_server:application")


def test_train_one_step_on_an_openenv_server_from_the_cli(server, train_one_step):
    episodes = train_one_step(f"openenv:{server}", "--env-kwarg", "num_tasks=4", "--env-kwarg", "max_turns=2",
                              "--env-kwarg", "max_tokens=12")
    assert len(episodes) == 4
    for episode in episodes:
        assert episode["status"] == "succeeded", episode["error"]
        rewards = [s["outcome"]["openenv_reward"] for s in episode["steps"] if "openenv_reward" in s["outcome"]]
        assert episode["final_reward"] == pytest.approx(sum(rewards))  # the env's own rewards
        for step in episode["steps"]:
            assert step["completion"]["prompt_token_ids"] and step["completion"]["completion_token_ids"]
