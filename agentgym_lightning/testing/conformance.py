"""The conformance kit: run any agent or adapter through a scripted episode and check the contract.

For authors of adapter plugins and agents. :func:`check_agent` runs one episode of ``agent``
(anything :class:`~agentgym_lightning.env.AgentEnv` accepts: a callable, an adapter's wrapper)
against a scripted policy, no model, and checks:

1. **every call is a step**: each LLM call the agent made reached the policy, once, and is
   recorded with its completion;
2. **tool calls round-trip**: a tool call the policy answered with comes back in a later request
   as an OpenAI ``assistant`` message with that ``tool_calls`` id, followed by a ``tool`` message
   with the matching ``tool_call_id`` (when the script made tool calls and the agent called again);
3. **rewards land on the right step**: a probe gives call ``i`` the reward ``i + 1`` (an AIR
   signal); ``env.step`` must return it on the step that answered call ``i``, the final reward on
   the last one, and the returns must add up to ``trajectory.total_reward``;
4. **variables are seen**: every name in ``expect_variables`` was emitted;
5. **nothing is left behind**: no agent thread alive and no new socket open after ``env.close()``
   (once the garbage collector has run: a client the agent dropped without closing it is
   released then; the gateway closes its side of an ended episode's connections itself, so a
   socket still open is one the agent's client holds, e.g. a framework's cached client);
6. **no network**: no connection and no name lookup left 127.0.0.1 / localhost while it ran
   (frameworks' telemetry and tracing exporters included);
7. **the wire**: with ``expect_wire``, every call came on that API (``"chat"``, ``"responses"``,
   ``"completions"``, ``"messages"``: :mod:`agentgym_lightning.gateway.wires`). Every wire is
   read into the same OpenAI-shaped request, so checks 1-6 hold the same way whichever the agent
   speaks (a tool call answered as a Responses ``function_call`` or an Anthropic ``tool_use``
   must come back as the ``assistant`` message and ``tool`` result of check 2).

In a test (the ``agent_conformance`` fixture comes from :mod:`agentgym_lightning.testing.pytest_plugin`)::

    pytest_plugins = ["agentgym_lightning.testing.pytest_plugin"]

    def test_my_adapter(agent_conformance):
        report = agent_conformance(MyFrameworkAgent(my_fn), task="What is 2+3?", expect_variables=["answer"])
        report.assert_ok()
"""

from __future__ import annotations

import gc
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.llm import Completion, ToolCall
from agentgym_lightning.trajectory import Reward, Trajectory

__all__ = ["ConformanceReport", "check_agent", "scripted_policy", "no_network", "PROBE_SOURCE"]

#: The AIR source of the kit's reward probe.
PROBE_SOURCE = "conformance.probe"

Policy = Callable[[Any], Any]


def _sample_argument(schema: Mapping[str, Any]) -> Any:
    kind = schema.get("type")
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object":
        return {}
    return "1 + 1"


def scripted_policy(answer: str = "Answer: 2", tool_arguments: Mapping[str, Any] | None = None) -> Policy:
    """The kit's default policy: when the request offers tools and the conversation does not end
    in a tool result, call the first tool (``tool_arguments``, or a sample value per required
    parameter); otherwise reply ``answer``."""
    counter = iter(range(1_000_000))

    def policy(observation: Any) -> Any:
        request = observation.request
        last = request.messages[-1] if request.messages else {}
        if request.tools and last.get("role") != "tool":
            fn = request.tools[0].get("function") or {}
            params = fn.get("parameters") or {}
            if tool_arguments is not None:
                args = dict(tool_arguments)
            else:
                props = params.get("properties") or {}
                args = {k: _sample_argument(props.get(k) or {}) for k in params.get("required") or list(props)}
            call = ToolCall(id=f"call_conformance_{next(counter)}", name=str(fn.get("name")), arguments=json.dumps(args))
            return Completion(text="", tool_calls=[call], finish_reason="tool_calls")
        return answer

    return policy


@dataclass
class ConformanceReport:
    """What :func:`check_agent` found: ``problems`` is empty when the agent conforms."""

    trajectory: Trajectory
    #: The reward ``env.step`` returned on each step, in order.
    step_rewards: list[float] = field(default_factory=list)
    #: Hosts or addresses the run tried to reach beyond 127.0.0.1.
    outside_connections: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def wires(self) -> list[str]:
        """The wire each call came on, in order."""
        return [step.request.wire for step in self.trajectory.steps]

    @property
    def ok(self) -> bool:
        return not self.problems

    def assert_ok(self) -> None:
        """Raise :class:`AssertionError` naming every problem found."""
        if self.problems:
            raise AssertionError("the agent does not conform:\n- " + "\n- ".join(self.problems))


class _RewardProbe:
    """An AIR plugin registered for the run: call ``i`` gets reward ``i + 1``."""

    @hookimpl
    def agentgym_intermediate_rewards(self, step: Any, trajectory: Any, weights: Mapping[str, float]) -> Reward | None:
        if PROBE_SOURCE not in weights:
            return None
        return Reward(value=float(step.index + 1), source=PROBE_SOURCE)


def _is_local(host: Any) -> bool:
    if host is None:
        return True
    text = host.decode() if isinstance(host, bytes) else str(host)
    if text in ("localhost", "") or text.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(text.split("%")[0]).is_loopback
    except ValueError:
        return False


@contextmanager
def no_network(record: list[str] | None = None) -> Iterator[list[str]]:
    """Refuse, and record, every connection or name lookup beyond 127.0.0.1 in this process
    while the block runs (``OSError`` for the caller, as when offline). Yields the record."""
    seen = record if record is not None else []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def check(address: Any) -> None:
        if isinstance(address, tuple) and address and not _is_local(address[0]):
            seen.append(str(address[0]))
            raise OSError(f"conformance: network access to {address[0]} refused")

    def connect(self: socket.socket, address: Any) -> Any:
        check(address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> Any:
        check(address)
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_local(host):
            seen.append(str(host))
            raise socket.gaierror(f"conformance: name lookup of {host} refused")
        return real_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect, socket.socket.connect_ex = connect, connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = getaddrinfo
    try:
        yield seen
    finally:
        socket.socket.connect, socket.socket.connect_ex = real_connect, real_connect_ex  # type: ignore[method-assign]
        socket.getaddrinfo = real_getaddrinfo


def _open_sockets() -> set[tuple[Any, ...]]:
    try:
        import psutil
    except ImportError:  # the check needs psutil (the `dev` extra); without it, skip it
        return set()
    return {
        (c.fd, c.laddr, c.raddr)
        for c in psutil.Process().net_connections(kind="inet")
        if c.raddr and c.status != psutil.CONN_LISTEN
    }


def _closed_by_peer(sockets: set[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    """Those of ``sockets`` whose other end has closed (``CLOSE_WAIT``): a client's, held open by it."""
    import psutil

    waiting = {(c.fd, c.laddr, c.raddr) for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_CLOSE_WAIT}
    return sockets & waiting


def _agent_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("agent-") and t.is_alive()]


def check_agent(
    agent: Any,
    task: Any = "What is 1 + 1?",
    *,
    policy: Policy | None = None,
    reward_fn: Callable[[Any, Any], float] | None = None,
    expect_variables: Iterable[str] = (),
    expect_tool_round_trip: bool = True,
    expect_wire: str | None = None,
    transport: str = "http",
    max_turns: int = 16,
    time_limit: float = 60.0,
) -> ConformanceReport:
    """Run one scripted episode of ``agent`` and check the contract (see the module docstring).

    Args:
        agent: Anything ``AgentEnv`` accepts (an adapter's wrapper, an ``agents.Agent``...).
        task: The task given to the agent.
        policy: ``fn(observation) -> action`` (default :func:`scripted_policy`).
        reward_fn: The final reward (default: 1.0 for any result).
        expect_variables: Semantic variables the agent must emit.
        expect_tool_round_trip: Require that the script's tool calls came back with their results
            (set False for an agent that never calls again after a tool).
        expect_wire: The API every call must come on (``None``: any).
        transport: ``"http"`` (default: real sockets, so the socket check means something) or
            ``"inproc"``.
        max_turns: Calls after which the episode is cut (a looping agent fails the check).
        time_limit: Seconds the agent may run.
    """
    run = _run_episode(
        agent, task, policy or scripted_policy(), reward_fn or (lambda task, result: 1.0), transport, max_turns, time_limit
    )
    trajectory = run.trajectory
    report = ConformanceReport(trajectory=trajectory, step_rewards=run.step_rewards, outside_connections=run.outside)
    problems = report.problems
    problems.extend(_call_problems(trajectory, run.answered))  # 1. every call is a step
    if expect_tool_round_trip:
        problems.extend(_tool_round_trip_problems(trajectory))  # 2. tool calls round-trip
    problems.extend(_reward_problems(trajectory, run.step_rewards))  # 3. rewards land on the right step
    # 4. variables are seen
    missing = [name for name in expect_variables if name not in trajectory.variables]
    if missing:
        problems.append(f"variables never emitted: {missing} (emitted: {sorted(trajectory.variables)})")
    problems.extend(_leftover_problems(run.threads_before, run.sockets_before))  # 5. nothing is left behind
    # 6. no network
    if run.outside:
        problems.append(f"the run tried to reach beyond 127.0.0.1: {sorted(set(run.outside))}")
    # 7. the wire
    if expect_wire is not None:
        problems.extend(
            f"call {i} came on the {wire!r} wire, expected {expect_wire!r}" for i, wire in enumerate(report.wires) if wire != expect_wire
        )
    return report


@dataclass
class _EpisodeRun:
    """One scripted episode as :func:`check_agent` ran it, and what it saw around it."""

    trajectory: Trajectory
    #: The policy's answer to each call, and the reward each ``env.step`` returned.
    answered: list[Any]
    step_rewards: list[float]
    #: Addresses beyond 127.0.0.1 the run tried to reach.
    outside: list[str]
    #: The agent threads and open sockets from before the episode (what is new is the run's).
    threads_before: set[threading.Thread]
    sockets_before: set[tuple[Any, ...]]


def _run_episode(
    agent: Any,
    task: Any,
    policy: Policy,
    reward_fn: Callable[[Any, Any], float],
    transport: str,
    max_turns: int,
    time_limit: float,
) -> _EpisodeRun:
    """One episode of ``agent`` on ``task`` answered by ``policy``, with the reward probe
    registered (a step reward of ``i + 1`` on call ``i``) and no connection beyond 127.0.0.1."""
    from agentgym_lightning.env import AgentEnv
    from agentgym_lightning.plugin_manager import get_plugin_manager

    pm = get_plugin_manager()
    probe = _RewardProbe()
    pm.register(probe, name=f"conformance-probe-{id(probe)}")
    threads_before = set(_agent_threads())
    outside: list[str] = []
    answered: list[Any] = []
    step_rewards: list[float] = []
    env = None
    try:
        with no_network(outside):
            env = AgentEnv(agent, [task], reward_fn, air_weights={PROBE_SOURCE: 1.0}, transport=transport,  # type: ignore[arg-type]
                           max_turns=max_turns, time_limit=time_limit)
            sockets_before = _open_sockets()
            obs, info = env.reset(seed=0)
            done = bool(info.get("episode_over"))
            result: tuple[Any, ...] = ()
            while True:
                if not done:
                    action = policy(obs)
                    answered.append(action)
                result = env.step(action if not done else "")
                step_rewards.append(float(result[1]))
                if result[2] or result[3]:
                    break
                obs = result[0]
            info = result[4]
    finally:
        pm.unregister(probe)
        if env is not None:
            env.close()
    return _EpisodeRun(info["trajectory"], answered, step_rewards, outside, threads_before, sockets_before)


def _call_problems(trajectory: Trajectory, answered: list[Any]) -> list[str]:
    """Every call is a step: the episode succeeded, with one step, completed, per call answered."""
    problems = []
    if trajectory.status.value != "succeeded":
        problems.append(f"the episode ended {trajectory.status.value}: {(trajectory.error or '')[-600:]}")
    if len(trajectory.steps) != len(answered):
        problems.append(f"the policy answered {len(answered)} calls but {len(trajectory.steps)} steps were recorded")
    if any(s.completion is None for s in trajectory.steps):
        problems.append("a recorded step has no completion")
    if not trajectory.steps:
        problems.append("the agent made no LLM call through the episode's client")
    return problems


def _reward_problems(trajectory: Trajectory, step_rewards: list[float]) -> list[str]:
    """Rewards land on the right step: ``env.step`` #i returns the probe's ``i + 1`` with the
    call's own rewards (the last one also the final and the episode's rewards), and they sum to
    the trajectory's total."""
    problems = []
    final = trajectory.final_reward or 0.0
    for i, got in enumerate(step_rewards):
        step = trajectory.steps[i] if i < len(trajectory.steps) else None
        want = float(i + 1) if step is not None else 0.0
        want += sum(r.value for r in step.rewards if r.source != PROBE_SOURCE) if step is not None else 0.0
        if i == len(step_rewards) - 1:
            want += final + sum(r.value for r in trajectory.rewards)
        if abs(got - want) > 1e-9:
            problems.append(f"env.step #{i} returned reward {got}, expected {want} (the probe's {i + 1} for call {i})")
    if abs(sum(step_rewards) - trajectory.total_reward) > 1e-9:
        problems.append(f"step rewards sum to {sum(step_rewards)} but trajectory.total_reward is {trajectory.total_reward}")
    return problems


def _leftover_problems(threads_before: set[threading.Thread], sockets_before: set[tuple[Any, ...]]) -> list[str]:
    """Nothing is left behind: no agent thread (after up to 5 s) and no socket (after
    :func:`_wait_for_sockets`'s grace) of the run is still open."""
    problems = []
    deadline = time.monotonic() + 5.0
    while _agent_threads_left(threads_before) and time.monotonic() < deadline:
        time.sleep(0.02)
    if _agent_threads_left(threads_before):
        problems.append(f"agent threads still running after close: {[t.name for t in _agent_threads_left(threads_before)]}")
    leaked = _wait_for_sockets(sockets_before)
    if leaked:
        problems.append(
            f"{len(leaked)} socket(s) left open after close: {sorted(str(s[2]) for s in leaked)}; "
            f"{len(_closed_by_peer(leaked))} of them the agent's own HTTP client holds after the gateway closed its side "
            "(close the client when the agent returns, or use ctx.openai_client() / the adapter's client: in-process, "
            "no socket)"
        )
    return problems


def _agent_threads_left(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in _agent_threads() if t not in before]


def _wait_for_sockets(before: set[tuple[Any, ...]], grace: float = 2.0) -> set[tuple[Any, ...]]:
    """Sockets opened during the run still open after ``grace`` seconds and a garbage collection
    (a client nobody refers to any more closes its sockets when it is collected; the gateway
    closes its own side of an ended episode's connections)."""
    gc.collect()
    deadline = time.monotonic() + grace
    while True:
        leaked = _open_sockets() - before
        if not leaked or time.monotonic() >= deadline:
            return leaked
        time.sleep(0.05)


def _tool_round_trip_problems(trajectory: Trajectory) -> list[str]:
    problems = []
    steps = trajectory.steps
    for i, step in enumerate(steps):
        calls = step.completion.tool_calls if step.completion is not None else []
        if not calls or i + 1 >= len(steps):
            continue
        later = steps[i + 1].request.messages
        ids = {c.id for c in calls}
        echoed = [m for m in later if m.get("role") == "assistant" and {tc.get("id") for tc in m.get("tool_calls") or []} & ids]
        results = {m.get("tool_call_id") for m in later if m.get("role") == "tool"}
        if not echoed:
            problems.append(f"call {i}'s tool calls {sorted(ids)} are not in call {i + 1}'s messages as an assistant message")
        missing = ids - results
        if missing:
            problems.append(f"call {i + 1} has no tool message for tool_call_id {sorted(missing)}")
    return problems
