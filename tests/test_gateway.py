"""The gateway over real HTTP: OpenAI compatibility, clear 4xx errors, auth, remote agents."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import httpx
import openai
import pytest

from agentgym_lightning import Completion, Status
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.gateway import Gateway, GatewayError, get_gateway


def openai_agent(task, ctx):
    client = ctx.openai_client()
    a = client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": task["q"]}])
    b = client.chat.completions.create(
        model=ctx.model, messages=[{"role": "user", "content": a.choices[0].message.content}], stream=True
    )
    return "".join(c.choices[0].delta.content or "" for c in b if c.choices)


def test_http_transport_runs_the_openai_sdk_over_a_socket():
    env = AgentEnv(openai_agent, [{"q": "hi"}], lambda t, r: float(r == "done"), transport="http")
    obs, _ = env.reset(seed=0)
    assert env.base_url.startswith("http://127.0.0.1:")
    obs, *_ = env.step("next")
    assert obs.request.stream and obs.request.messages[0]["content"] == "next"
    _, reward, term, _, info = env.step("done")
    assert term and reward == 1.0


def test_malformed_requests_get_a_clear_4xx_never_a_hang():
    started, release = threading.Event(), threading.Event()

    def agent(task, ctx):
        started.set()
        release.wait(10)
        return None

    env = AgentEnv(agent, [{}])
    # The agent makes no LLM call until released; meanwhile we send bad requests for its episode.
    holder: dict = {}
    t = threading.Thread(target=lambda: holder.setdefault("reset", env.reset(seed=0)))
    t.start()
    started.wait(5)
    gw = get_gateway()
    episode_id = env.episode_id
    base = gw.base_url(episode_id)
    with httpx.Client(timeout=5) as http:
        cases = [
            (http.post(f"{base}/chat/completions", content=b"{not json"), 400, "not valid JSON"),
            (http.post(f"{base}/chat/completions", json={"model": "m"}), 400, "'messages'"),
            (http.post(f"{base}/chat/completions", json={"messages": [{"content": "x"}]}), 400, "role"),
            (http.post(f"{base}/chat/completions", json={"messages": "hi"}), 400, "'messages'"),
            (
                http.post(f"{base}/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "n": 3}),
                400,
                "n > 1",
            ),
            (http.post(f"{gw.url}/episodes/nope/v1/chat/completions", json={"messages": []}), 404, "no running episode"),
            (http.post(f"{gw.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}), 404, "episode"),
            (http.get(f"{gw.url}/no/such/route"), 404, "no route"),
            (http.get(f"{base}/chat/completions"), 405, "method"),
            (http.post(f"{gw.url}/episodes/{episode_id}/rewards", json={"source": "x"}), 400, "'value'"),
            (http.post(f"{gw.url}/episodes/{episode_id}/rewards", json={"value": "high"}), 400, "number"),
            (http.post(f"{gw.url}/episodes/{episode_id}/variables", json=[1, 2]), 400, "JSON object"),
        ]
        for response, status, fragment in cases:
            assert response.status_code == status, (response.request.url, response.text)
            error = response.json()["error"]
            assert fragment in error["message"], error
            assert response.headers["x-should-retry"] == "false"
        models = http.get(f"{base}/models").json()
        assert models["data"][0]["id"] == "policy"
        assert http.get(f"{gw.url}/health").json()["ok"] is True
    release.set()
    t.join(5)
    _, info = holder["reset"]
    assert info["episode_over"] and info["status"] == "succeeded"


REMOTE_AGENT = textwrap.dedent(
    """
    import sys, httpx, openai
    base_url, root, episode = sys.argv[1], sys.argv[2], sys.argv[3]
    client = openai.OpenAI(base_url=base_url, api_key="anything", max_retries=0)
    http = httpx.Client()
    http.post(f"{root}/episodes/{episode}/variables", json={"question": "2+2?"}).raise_for_status()
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "2+2?"}])
    answer = reply.choices[0].message.content
    http.post(f"{root}/episodes/{episode}/rewards", json={"value": 1.0 if answer == "4" else 0.0, "source": "judge"}).raise_for_status()
    print(answer)
    """
)


def test_an_agent_in_another_process_takes_part_over_the_base_url():
    """Training-Agent Disaggregation: the agent runs elsewhere; our side only waits for it."""
    gw = get_gateway()

    def agent(task, ctx):
        proc = subprocess.run(
            [sys.executable, "-c", REMOTE_AGENT, ctx.base_url, gw.url, ctx.episode_id],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr)
        return proc.stdout.strip()

    env = AgentEnv(agent, [{}], time_limit=60)
    obs, _ = env.reset(seed=0)
    assert obs.request.messages[0]["content"] == "2+2?"
    assert obs.variables == {"question": "2+2?"}
    _, reward, term, _, info = env.step("4")
    assert term and info["trajectory"].result == "4"
    assert [(r.source, r.value) for r in info["trajectory"].steps[0].rewards] == [("judge", 1.0)]
    assert reward == 1.0


def test_a_gateway_off_loopback_requires_a_bearer_token():
    gw = Gateway(host="0.0.0.0")  # never started here: we only check its policy
    assert gw.token and gw.api_key == gw.token
    with pytest.raises(GatewayError) as err:
        gw.check_auth(None)
    assert err.value.status == 401
    with pytest.raises(GatewayError):
        gw.check_auth("Bearer wrong")
    gw.check_auth(f"Bearer {gw.token}")


def test_one_token_rule_for_every_server():
    from agentgym_lightning.gateway.auth import server_token
    from agentgym_lightning.policies.policy_server import PolicyServer

    assert server_token("127.0.0.1", None) is None and server_token("::1", None) is None
    assert server_token("localhost", "given") == "given" and server_token("10.0.0.5", "given") == "given"
    generated = server_token("10.0.0.5", None)
    assert generated and generated != server_token("10.0.0.5", None)
    # The policy server follows the gateway's rule (it used to refuse a host off loopback without
    # a token, and its callers each made one up); never started here.
    server = PolicyServer(lambda requests: [], host="0.0.0.0")
    assert server.token and Gateway(host="0.0.0.0").token
    assert PolicyServer(lambda requests: [], host="127.0.0.1").token is None


def test_a_token_is_enforced_over_http_and_in_process():
    gw = Gateway(token="s3cret")

    def agent(task, ctx):
        bad = openai.OpenAI(base_url=ctx.base_url, api_key="wrong", max_retries=0)
        try:
            bad.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        except openai.AuthenticationError as exc:
            denied = exc.status_code
        good = ctx.openai_client()  # carries the token
        return denied, good.chat.completions.create(model="m", messages=[{"role": "user", "content": "y"}]).choices[0].message.content

    for transport in ("http", "inproc"):
        env = AgentEnv(agent, [{}], gateway=gw, transport=transport)
        env.reset(seed=0)
        *_, info = env.step("ok")
        assert info["trajectory"].result == (401, "ok"), transport
    gw.close()


def test_refused_calls_after_close_do_not_retry_forever():
    calls = []

    def agent(task, ctx):
        client = openai.OpenAI(base_url=ctx.base_url, api_key="k")  # default retries
        for _ in range(3):
            calls.append(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}]))

    env = AgentEnv(agent, [{}], transport="http")
    env.reset(seed=0)
    env.close()
    assert env.trajectory.status is Status.TRUNCATED
    assert calls == []


def test_completion_body_is_valid_for_the_openai_sdk_with_usage():
    def agent(task, ctx):
        r = ctx.openai_client().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        return r.usage.prompt_tokens, r.usage.completion_tokens, r.model

    env = AgentEnv(agent, [{}])
    env.reset(seed=0)
    *_, info = env.step(Completion(text="t", prompt_token_ids=[1, 2, 3], completion_token_ids=[4, 5], model="smol"))
    assert info["trajectory"].result == (3, 2, "smol")


def test_usage_is_always_an_object_even_without_token_ids():
    # Before: "usage": null, and smolagents crashed reading usage.prompt_tokens.
    def agent(task, ctx):
        r = ctx.openai_client().chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        stream = ctx.openai_client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], stream=True, stream_options={"include_usage": True}
        )
        last = [chunk for chunk in stream][-1]
        return r.usage.prompt_tokens, r.usage.total_tokens, last.usage.completion_tokens

    env = AgentEnv(agent, [{}])
    env.reset(seed=0)
    env.step("no ids")
    *_, info = env.step(Completion(text="t", completion_token_ids=[4, 5]))
    assert info["trajectory"].result == (0, 0, 2)


def _connections(port: int) -> list:
    psutil = pytest.importorskip("psutil", reason="the socket check needs psutil (the dev extra)")
    return [c for c in psutil.Process().net_connections(kind="inet") if c.raddr and port in (c.laddr.port, c.raddr.port)]


def _wait_until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_an_ended_episodes_connections_are_closed_by_the_gateway():
    psutil = pytest.importorskip("psutil", reason="the socket check needs psutil (the dev extra)")
    kept = []

    def agent(task, ctx):
        client = openai.OpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0)
        kept.append(client)  # never closed, never collected: its keep-alive connection stays open
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": task}])
        return r.choices[0].message.content

    gw = Gateway()
    env = AgentEnv(agent, ["hi"], lambda t, r: 0.0, gateway=gw, transport="http")
    try:
        for seed in range(3):
            env.reset(seed=seed)
            assert any(c.laddr.port == gw.port for c in _connections(gw.port))  # the call is open
            *_, terminated, _, info = env.step("ok")
            assert terminated and info["trajectory"].result == "ok"
            # The gateway's side of the agent's connection is closed when the episode ends (not
            # after the keep-alive timeout); the agent's side has seen it and waits for its client.
            def closed_by_the_gateway():
                sockets = _connections(gw.port)
                return not any(c.laddr.port == gw.port for c in sockets) and {c.status for c in sockets} == {psutil.CONN_CLOSE_WAIT}

            assert _wait_until(closed_by_the_gateway), _connections(gw.port)
        assert len(_connections(gw.port)) == 3  # one per episode, each the client's own, closed
    finally:
        env.close()
        gw.close()


def test_a_request_for_an_ended_episode_closes_its_connection():
    # Before: answered 404 on a kept-alive connection, registered again under the ended episode
    # and left open, so an agent that swallows errors and keeps calling held it for ever.
    urls = []

    def agent(task, ctx):
        urls.append(ctx.base_url)
        return ctx.chat_completion([{"role": "user", "content": task}]).text

    gw = Gateway()
    env = AgentEnv(agent, ["hi"], lambda t, r: 0.0, gateway=gw, transport="http")
    client = httpx.Client(timeout=30)
    try:
        env.reset(seed=0)
        *_, terminated, _, _ = env.step("ok")
        assert terminated
        body = {"model": "m", "messages": [{"role": "user", "content": "again"}]}
        for _ in range(2):  # each on a new connection: the last one was closed
            r = client.post(f"{urls[0]}/chat/completions", json=body)
            assert r.status_code == 404 and r.headers["connection"] == "close"
        assert _wait_until(lambda: not any(c.laddr.port == gw.port for c in _connections(gw.port)))
    finally:
        client.close()
        env.close()
        gw.close()


def test_a_connection_shared_across_episodes_stays_open():
    gw = Gateway()
    client = httpx.Client(base_url=gw.url, timeout=30)  # one pool, the header form: shared by every episode

    def agent(task, ctx):
        body = {"model": "m", "messages": [{"role": "user", "content": task}]}
        r = client.post("/v1/chat/completions", json=body, headers={"X-Agentgym-Episode": ctx.episode_id})
        return r.raise_for_status().json()["choices"][0]["message"]["content"]

    env = AgentEnv(agent, ["hi"], lambda t, r: 0.0, gateway=gw, transport="http")
    try:
        ports = []
        for seed in range(2):
            env.reset(seed=seed)
            *_, info = env.step("ok")
            assert info["trajectory"].result == "ok"
            time.sleep(0.2)  # time enough for a close to be seen
            (mine,) = [c for c in _connections(gw.port) if c.raddr.port == gw.port]
            assert mine.status == "ESTABLISHED"
            ports.append(mine.laddr.port)
        assert ports[0] == ports[1]  # the same connection served both episodes
    finally:
        env.close()
        client.close()
        gw.close()


def _own_client_agent(kept: list | None):
    def agent(task, ctx):
        client = openai.OpenAI(base_url=ctx.base_url, api_key=ctx.api_key, max_retries=0)  # never closed
        if kept is not None:
            kept.append(client)  # and held, as a framework's client cache holds it
        return client.chat.completions.create(model="m", messages=[{"role": "user", "content": task}]).choices[0].message.content

    return agent


def test_an_agent_that_drops_its_own_client_unclosed_passes_the_conformance_kit(agent_conformance):
    pytest.importorskip("psutil", reason="the socket check needs psutil (the dev extra)")
    report = agent_conformance(_own_client_agent(None), "hi", expect_tool_round_trip=False)
    report.assert_ok()


def test_the_conformance_kit_names_the_socket_an_agents_client_still_holds(agent_conformance):
    pytest.importorskip("psutil", reason="the socket check needs psutil (the dev extra)")
    kept: list = []
    report = agent_conformance(_own_client_agent(kept), "hi", expect_tool_round_trip=False)
    (problem,) = report.problems
    assert problem.startswith("1 socket(s) left open after close")  # the client's: the gateway closed its own
    assert "1 of them the agent's own HTTP client holds after the gateway closed its side" in problem
    assert "ctx.openai_client()" in problem
    kept[0].close()


def test_every_route_of_the_one_table_answers_the_same_over_http_and_in_process():
    """The HTTP app and the in-process transport serve one route table (gateway/routes.py): each
    route, a wrong method, an unserved path and a missing token answer the same status and body."""
    from agentgym_lightning.gateway.routes import ROUTES

    gw = Gateway(token="s3cret")
    started, release = threading.Event(), threading.Event()

    def agent(task, ctx):
        started.set()
        release.wait(30)
        return "done"

    env = AgentEnv(agent, [{}], lambda t, r: 0.0, gateway=gw, transport="http")
    t = threading.Thread(target=env.reset)
    t.start()
    assert started.wait(10)
    ep = env.episode_id

    def requests():
        for route in ROUTES:
            path = route.path.replace("{episode_id}", ep)
            body = {"value": "x"} if path.endswith("rewards") else {"": 1} if path.endswith("variables") else {}
            if route.method == "GET":
                yield "GET", path, None, {}
            elif path.endswith("traces"):
                yield "POST", path, {}, {"content-type": "text/plain"}
            else:  # an invalid body: a 4xx from the route's own checks, no step recorded
                yield "POST", path, body, {"x-agentgym-episode": ep}
            yield ("POST" if route.method == "GET" else "GET"), path, None, {}  # 405
        yield "POST", f"/episodes/{ep}/v1/embeddings", {}, {}  # 404, OpenAI's shape
        yield "POST", f"/episodes/{ep}/v1/messages/count_tokens", {}, {}  # 404, Anthropic's shape

    try:
        answers = {}
        for transport in ("http", "inproc"):
            root = gw.url if transport == "http" else "http://agentgym.inproc"
            with gw.http_client(transport) as client:
                seen = []
                for method, path, body, headers in requests():
                    r = client.request(method, root + path, json=body, headers={"authorization": "Bearer s3cret", **headers})
                    data = r.json()
                    if path == "/health":
                        data.pop("episodes", None)  # other tests' episodes may come and go
                    seen.append((method, path, r.status_code, data, r.headers.get("x-should-retry")))
                unauthorized = client.post(f"{root}/episodes/{ep}/rewards", json={"value": 1})
                seen.append(("POST", "no token", unauthorized.status_code, unauthorized.json(), None))
            answers[transport] = seen
        assert answers["http"] == answers["inproc"]
        statuses = {(m, p): s for m, p, s, *_ in answers["http"]}
        assert statuses[("GET", "/health")] == 200 and statuses[("GET", f"/episodes/{ep}/v1/models")] == 200
        assert statuses[("GET", f"/episodes/{ep}/v1/chat/completions")] == 405
        assert statuses[("POST", f"/episodes/{ep}/v1/embeddings")] == 404 and statuses[("POST", "no token")] == 401
        assert env.trajectory.steps == [] and env.trajectory.rewards == []
    finally:
        release.set()
        t.join(10)
    gw.close()
