"""The standalone gateway (``serve``) under bad requests: each gets a 4xx, the driver lives on."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest

from agentgym_lightning.rollouts.http_agents import StandaloneGateway
from agentgym_lightning.llm import Completion
from agentgym_lightning.reward_bounds import RewardRefusedWarning, reward_refused
from agentgym_lightning.trajectory import Status, load_trajectories


def scripted(requests):
    return [Completion(text="42", prompt_token_ids=[1], completion_token_ids=[2]) for _ in requests]


def open_and_finish(client, reward=1.0):
    opened = client.post("/episodes", json={"task": "t"})
    assert opened.status_code == 200, opened.text
    done = client.post(f"/episodes/{opened.json()['episode_id']}/done", json={"result": "r", "reward": reward})
    return opened.json(), done


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, "7", True])
def test_a_bad_seed_is_a_400_and_the_driver_goes_on(seed):
    with StandaloneGateway(scripted) as server:
        client = httpx.Client(base_url=server.url, timeout=30)
        running, _ = client.post("/episodes", json={"task": "before"}).json(), None
        bad = client.post("/episodes", json={"seed": seed})
        assert bad.status_code == 400 and "'seed' must be an integer in [0, 2**63)" in bad.json()["error"]["message"]
        # Before: seed -1 killed the driver: the running episode vanished and every later open got 503.
        _, done = open_and_finish(client)
        assert done.status_code == 200 and done.json()["status"] == "succeeded"
        assert client.post(f"/episodes/{running['episode_id']}/done", json={}).json()["status"] == "succeeded"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[" * 5000 + b"]" * 5000, "nested deeper than"),
        (b'{"task": "\xff\xfe"}', "not valid JSON"),
        (b'{"task": NaN}', "not valid JSON"),
        (b'{"task": 1e999}', "overflows to infinity"),
        (b"[1, 2]", "must be a JSON object"),
    ],
)
def test_every_route_parses_with_the_strict_parser(body, message):
    with StandaloneGateway(scripted) as server:
        client = httpx.Client(base_url=server.url, timeout=30)
        opened = client.post("/episodes", json={}).json()
        for path in ("/episodes", f"/episodes/{opened['episode_id']}/done"):
            # Before: deep nesting and bad UTF-8 were 500s (json.loads' RecursionError, UnicodeDecodeError).
            r = client.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400 and message in r.json()["error"]["message"], (path, r.text)
        assert client.post(f"/episodes/{opened['episode_id']}/done", json={}).json()["status"] == "succeeded"


def test_a_reward_beyond_the_bound_in_done_is_refused_and_the_episode_excluded():
    with StandaloneGateway(scripted) as server:
        client = httpx.Client(base_url=server.url, timeout=30)
        with pytest.warns(RewardRefusedWarning, match="a remote agent's done"):
            opened, done = open_and_finish(client, reward=1e300)
        assert done.status_code == 400 and "reward refused" in done.json()["error"]["message"]
        (trajectory,) = server.take(1, timeout=10)
        assert trajectory.episode_id == opened["episode_id"] and reward_refused(trajectory) and not trajectory.trainable
        assert client.post("/episodes", json={}).status_code == 200  # the server goes on


def test_finished_results_are_bounded_by_bytes():
    with StandaloneGateway(scripted, keep_bytes=6_000) as server:
        client = httpx.Client(base_url=server.url, timeout=30)
        ids = []
        for _ in range(3):
            opened = client.post("/episodes", json={"task": "x" * 2_500}).json()
            assert client.post(f"/episodes/{opened['episode_id']}/done", json={"result": "y" * 1_000}).status_code == 200
            ids.append(opened["episode_id"])
        # Each is ~3.7 kB of JSON: only the newest fits in 6 kB (before: 10,000 kept whatever their size).
        assert [client.get(f"/episodes/{i}/trajectory").status_code for i in ids] == [404, 404, 200]
        assert server._finished_bytes <= 6_000  # noqa: SLF001


def test_serve_without_a_base_url_says_which_flag_is_missing(capsys, monkeypatch):
    from agentgym_lightning.cli import main

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    # Before: "... OpenAIPolicy(model, base_url='http://host:port/v1') ...": the Python API, not the CLI's flags.
    assert main(["serve", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--base-url" in err and "--backend hf" in err and "OpenAIPolicy(" not in err


#: ``serve`` with a stand-in policy; ``kill_me`` runs on a thread of its own: a line on stdin
#: makes that thread send SIGTERM to itself.
SERVE = (
    "import signal, sys, threading; from agentgym_lightning import policies\n"
    "from agentgym_lightning.llm import Completion\n"
    "policies.make_policy = lambda *a, **k: type('P', (), {'generate': lambda s, rs: [Completion(text='1') for _ in rs],"
    " 'close': lambda s: None})()\n"
    "def kill_me():\n"
    "    if sys.stdin.readline():\n"
    "        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)\n"
    "threading.Thread(target=kill_me, daemon=True).start()\n"
    "from agentgym_lightning.cli import main; sys.exit(main(sys.argv[1:]))\n"
)


def serve_one_open_episode_then_sigterm(out, send_sigterm):
    proc = subprocess.Popen([sys.executable, "-c", SERVE, "serve", "--backend", "hf", "--port", "0", "--output", str(out)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().split("listening on ")[-1].strip()
        assert url.startswith("http://127.0.0.1:"), url
        opened = httpx.post(f"{url}/episodes", json={"task": "open"}, timeout=30).json()
        send_sigterm(proc)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Before: SIGTERM killed the server at once and the open episode was never written.
    assert proc.returncode == 0, err
    (trajectory,) = load_trajectories(out)
    assert trajectory.episode_id == opened["episode_id"] and trajectory.status is Status.TRUNCATED
    assert "served 1 episodes" in err


def test_sigterm_writes_open_episodes_as_truncated(tmp_path):
    serve_one_open_episode_then_sigterm(tmp_path / "served.jsonl", lambda proc: proc.send_signal(signal.SIGTERM))


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="POSIX threads' signals")
def test_sigterm_taken_by_another_thread_than_the_main_one_stops_serve(tmp_path):
    def from_a_side_thread(proc):
        proc.stdin.write("stop\n")
        proc.stdin.flush()

    # The kernel may hand a process's SIGTERM to any of its threads. Before: the main thread slept
    # on in time.sleep(3600) with the handler tripped but never run (serve did not exit).
    serve_one_open_episode_then_sigterm(tmp_path / "served.jsonl", from_a_side_thread)


def test_health_says_when_the_driver_has_stopped():
    with StandaloneGateway(scripted) as server:
        assert httpx.get(f"{server.url}/health").json()["ok"] is True
        server._error = RuntimeError("the driver died")  # noqa: SLF001 - what _drive records when it dies
        # Before: {"ok": true} while every open got 503.
        r = httpx.get(f"{server.url}/health")
        assert r.status_code == 503 and r.json() == {"ok": False, "error": "the gateway stopped driving episodes: RuntimeError('the driver died')"}


def test_a_posted_reward_beyond_the_bound_is_a_400_and_excludes_the_episode():
    with StandaloneGateway(scripted) as server:
        client = httpx.Client(base_url=server.url, timeout=30)
        opened = client.post("/episodes", json={}).json()
        with pytest.warns(RewardRefusedWarning, match="emit_reward"):
            r = client.post(f"/episodes/{opened['episode_id']}/rewards", json={"value": 1e300, "source": "remote-judge"})
        assert r.status_code == 400 and "reward refused" in r.json()["error"]["message"]
        done = client.post(f"/episodes/{opened['episode_id']}/done", json={"reward": 1.0}).json()
        assert done["status"] == "infra_failed" and done["error"].startswith("reward refused")
