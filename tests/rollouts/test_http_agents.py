"""The standalone gateway (``agentgym-lightning serve``): its HTTP API driven by a remote agent
in another process, a silent agent truncated alone, and the token off loopback."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from agentgym_lightning.rollouts.http_agents import StandaloneGateway
from agentgym_lightning.llm import Completion
from agentgym_lightning.trajectory import Status, load_trajectories

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "remote_agent.py"


def scripted(requests):
    """Answers '42' to the last message, with made-up token ids and logprobs."""
    out = []
    for r in requests:
        prompt = [len(m.get("content") or "") for m in r.messages]
        out.append(Completion(text="42", prompt_token_ids=prompt, completion_token_ids=[52, 50], logprobs=[-0.1, -0.2]))
    return out


def test_a_remote_agent_process_runs_an_episode_through_the_http_api(tmp_path):
    out = tmp_path / "remote.jsonl"
    with StandaloneGateway(scripted, token="s3cret", output=out, agent_time_limit=60) as server:
        proc = subprocess.run(
            [sys.executable, str(EXAMPLE), server.url, "s3cret"], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "succeeded"
        (trajectory,) = server.take(1, timeout=10)
        read = httpx.get(
            f"{server.url}/episodes/{trajectory.episode_id}/trajectory", headers={"Authorization": "Bearer s3cret"}
        ).json()
    assert trajectory.status is Status.SUCCEEDED and trajectory.final_reward == 1.0
    assert [s.completion.completion_token_ids for s in trajectory.steps] == [[52, 50], [52, 50]]
    assert trajectory.steps[1].request.messages[-1]["content"] == "Only the number, please."
    assert trajectory.steps[1].rewards[0].value == 0.1 and trajectory.variables == {"answer": "42"}
    assert trajectory.total_reward == pytest.approx(1.1)
    # What GET returns is the trajectory, token ids included, and the file has it too.
    assert read["episode_id"] == trajectory.episode_id
    assert read["steps"][0]["completion"]["completion_token_ids"] == [52, 50]
    assert [t.episode_id for t in load_trajectories(out)] == [trajectory.episode_id]


def test_a_silent_agent_is_truncated_alone_and_errors_are_reported():
    with StandaloneGateway(scripted, agent_time_limit=0.5) as server:
        client = httpx.Client(base_url=server.url, timeout=30)
        silent = client.post("/episodes", json={"task": "silent"}).json()
        failing = client.post("/episodes", json={"task": "failing", "group_id": "g", "seed": 3}).json()
        # While the silent one waits to be truncated, another agent calls and finishes at once.
        started = time.monotonic()
        busy = client.post("/episodes", json={"task": "busy"}).json()
        llm = httpx.post(f"{busy['base_url']}/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert llm.json()["choices"][0]["message"]["content"] == "42"
        assert client.post(f"/episodes/{busy['episode_id']}/done", json={"result": "ok"}).json()["status"] == "succeeded"
        assert time.monotonic() - started < 0.5  # nobody waited for the silent agent
        assert client.get(f"/episodes/{silent['episode_id']}/trajectory").status_code == 409  # still running
        err = client.post(f"/episodes/{failing['episode_id']}/done", json={"error": "tool crashed"}).json()
        by_task = {t.task: t for t in server.take(3, timeout=10)}
        assert client.post(f"/episodes/{silent['episode_id']}/done", json={}).status_code == 409  # already over
        assert client.get("/episodes/nope/trajectory").status_code == 404
    assert by_task["silent"].status is Status.TRUNCATED and "time limit" in by_task["silent"].error
    assert err["status"] == "task_failed" and "tool crashed" in err["error"] and err["final_reward"] == 0.0
    assert by_task["failing"].group_id == "g"
    assert by_task["busy"].final_reward is None  # no reward given: only posted rewards count


def test_the_token_is_checked_and_required_off_loopback():
    with StandaloneGateway(scripted, token="t0k") as server:
        assert httpx.post(f"{server.url}/episodes", json={}).status_code == 401
        opened = httpx.post(f"{server.url}/episodes", json={}, headers={"Authorization": "Bearer t0k"})
        assert opened.status_code == 200 and opened.json()["api_key"] == "t0k"
    off_loopback = StandaloneGateway(scripted, host="0.0.0.0")  # never started: nothing is bound
    assert off_loopback.token  # one was generated
    off_loopback.close()


def test_close_ends_running_episodes_and_records_them():
    server = StandaloneGateway(scripted, agent_time_limit=None).start()
    episode = httpx.post(f"{server.url}/episodes", json={"task": 1}).json()
    got: list = []
    thread = threading.Thread(target=lambda: got.extend(server.take(1, timeout=10)))
    thread.start()
    server.close()
    thread.join()
    assert got[0].episode_id == episode["episode_id"] and got[0].status is Status.TRUNCATED


def test_serve_command_rejects_bad_arguments_with_exit_2(capsys):
    from agentgym_lightning.cli import main

    assert main(["serve", "--backend", "hf", "--base-url", "http://127.0.0.1:1/v1"]) == 2
    assert "--base-url is for the openai backend" in capsys.readouterr().err


def test_a_remote_anthropic_client_takes_part_at_the_anthropic_base_url():
    with StandaloneGateway(scripted, token="t0k") as server:
        episode = httpx.post(f"{server.url}/episodes", json={"task": "t"}, headers={"Authorization": "Bearer t0k"}).json()
        assert episode["anthropic_base_url"] == episode["base_url"].removesuffix("/v1")
        reply = httpx.post(
            f"{episode['anthropic_base_url']}/v1/messages",
            headers={"x-api-key": episode["api_key"], "anthropic-version": "2023-06-01"},
            json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        ).json()
        assert reply["type"] == "message" and reply["content"] == [{"type": "text", "text": "42"}]
        httpx.post(f"{server.url}/episodes/{episode['episode_id']}/done", json={}, headers={"Authorization": "Bearer t0k"})
        (trajectory,) = server.take(1, timeout=10)
    assert [s.request.wire for s in trajectory.steps] == ["messages"]
