"""One episode's record: the agent's intercepted calls, its variables, rewards and end.

Every LLM call the agent makes arrives here (through the gateway) as a :class:`PendingCall`, is
recorded as a :class:`~agentgym_lightning.trajectory.Step` and announced on
:attr:`Episode.events`; whoever drives the episode (``AgentEnv``, the batched driver) answers or
refuses it here. The agent runs in its worker (:mod:`agentgym_lightning.worker`) and reaches the
gateway through its endpoint (:mod:`agentgym_lightning.gateway.endpoint`); this module only
records and hands over. The Gymnasium semantics (rewards, truncation, statuses) live in
:mod:`agentgym_lightning.env`.

Every write to a step is made here, by the episode's methods: the call (:meth:`Episode.submit`),
its answer or error and whether its prompt extends the previous call's (:meth:`~Episode.answer`,
:meth:`~Episode.refuse`), what the agent emits after it (:meth:`~Episode.emit_variable`,
:meth:`~Episode.emit_reward`), what the agent's traces say about it (:meth:`~Episode.record_spans`:
the join in :mod:`agentgym_lightning.tracing.join` finds, the episode writes), its AIR
(:meth:`~Episode.add_air`, weighed by :mod:`agentgym_lightning.air`), when it was closed
(:meth:`~Episode.close_step`), and whether it trains (:meth:`~Episode.judge`, with the one rule
:func:`untrainable_reason` that the trainer's samples and the viewer read it by).
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym_lightning.air import AirRewards
from agentgym_lightning.llm import ChatRequest, Completion, GatewayError, ids_extend, new_call_id
from agentgym_lightning.resources import Resource, resource_versions
from agentgym_lightning.reward_bounds import RewardRefused, checked_reward
from agentgym_lightning.tracing.join import SpanFindings, SpanJoin
from agentgym_lightning.tracing.spans import SpanRecord
from agentgym_lightning.trajectory import Reward, Status, Step, StepTimings, Trajectory

__all__ = [
    "Episode", "PendingCall", "CallEvent", "DoneEvent", "EpisodeEvent",
    "untrainable_reason", "NOT_TRAINABLE", "AGENT_MATCH_EXCLUDED",
]  # fmt: skip

_WAIT_SLICE = 0.1

#: Why a call is not trained on, as far as the record says (the ``samples/calls/<reason>``
#: counts and the viewer's badges): its episode judged it not trainable...
NOT_TRAINABLE = "not_trainable"
#: ...or an ``agent_match`` applied to the recorded episode (the trainer's) leaves it out.
AGENT_MATCH_EXCLUDED = "agent_match_excluded"


def untrainable_reason(step: Step, agent_match: Callable[[Step], bool] | None = None) -> str | None:
    """Why the call ``step`` records is not trained on, or ``None`` when it may be.

    :data:`NOT_TRAINABLE` when its episode judged it so (``step.trainable``: the agent marked it
    ``metadata={"trainable": "false"}``, it was answered with an error, or the env's
    ``agent_match`` rejected it; see :meth:`Episode.judge`); :data:`AGENT_MATCH_EXCLUDED` when
    ``agent_match`` rejects it. The episode judges its calls by this rule (with the env's
    ``agent_match``), the trainer's samples and the viewer read recorded ones by it (with the
    trainer's)."""
    if not step.trainable:
        return NOT_TRAINABLE
    if agent_match is not None and not agent_match(step):
        return AGENT_MATCH_EXCLUDED
    return None



class PendingCall:
    """An intercepted LLM call waiting for its completion.

    The caller waits on it from whatever it runs on (an agent thread, the gateway's event loop,
    an agent's own loop); the driver resolves it from its thread.
    """

    __slots__ = ("episode", "step", "call_id", "completion", "error", "_done", "_gate", "_lock", "_waiters")

    def __init__(self, episode: Episode, step: Step) -> None:
        self.episode = episode
        self.step = step
        self.call_id = new_call_id()
        self.completion: Completion | None = None
        self.error: GatewayError | None = None
        self._done = False
        # A bare lock held until the answer comes: cheaper to release than an Event's condition.
        self._gate = threading.Lock()
        self._gate.acquire()
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def request(self) -> ChatRequest:
        return self.step.request

    @property
    def done(self) -> bool:
        return self._done

    def resolve(self, completion: Completion | None = None, error: GatewayError | None = None) -> bool:
        """Hand the answer (or the error) to the waiting caller; False if it was already resolved."""
        with self._lock:
            if self._done:
                return False
            self.completion, self.error = completion, error
            self._done = True
            self._gate.release()
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_set_done, fut)
            except RuntimeError:  # the waiter's loop is closed: nobody is listening any more
                pass
        return True

    def _result(self) -> Completion:
        if self.error is not None:
            raise self.error
        assert self.completion is not None
        return self.completion

    def wait(self, timeout: float | None = None) -> Completion:
        """Block until answered; raises :class:`GatewayError` when the call was refused."""
        # Wait in slices: a thread blocked in one long C-level wait could not be interrupted
        # by the AgentCancelled that AgentWorker.stop() raises in it.
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done:
            wait = _WAIT_SLICE if deadline is None else min(_WAIT_SLICE, deadline - time.monotonic())
            if wait <= 0:
                raise GatewayError(504, f"no completion within {timeout} s", code="timeout")
            if self._gate.acquire(timeout=wait):
                self._gate.release()  # let any other waiter through too
        return self._result()

    async def wait_async(self) -> Completion:
        """Await the answer from any event loop."""
        if not self._done:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            with self._lock:
                if not self._done:
                    self._waiters.append((loop, fut))
                else:
                    fut.set_result(None)
            await fut
        return self._result()


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


@dataclass(slots=True)
class CallEvent:
    """The agent made an LLM call; answer ``pending``."""

    episode: Episode
    pending: PendingCall


@dataclass(slots=True)
class DoneEvent:
    """The agent returned ``result``, or raised ``error``."""

    episode: Episode
    result: Any = None
    error: BaseException | None = None


EpisodeEvent = CallEvent | DoneEvent


class Episode:
    """The record of one episode of one agent: its calls, variables, rewards and end.

    Thread-safe: the gateway calls :meth:`submit`, the agent :meth:`emit_variable` /
    :meth:`emit_reward`, its worker :meth:`finish`, and the driver :meth:`answer` /
    :meth:`refuse` / :meth:`drop_step` / :meth:`judge` / :meth:`close_step` / :meth:`add_air` /
    :meth:`end`, each from its own thread.

    ``agent_match`` (the env's, see :mod:`agentgym_lightning.agent_match`): which calls are
    trainable besides those the agent marked untrainable (``None``: all of them).
    """

    def __init__(
        self,
        *,
        task: Any,
        model_name: str = "policy",
        env_id: str | None = None,
        seed: int | None = None,
        group_id: str | None = None,
        events: queue.SimpleQueue[EpisodeEvent] | None = None,
        max_variables: int | None = None,
        max_variable_bytes: int | None = None,
        max_spans: int = 1000,
        agent_match: Callable[[Step], bool] | None = None,
        resources: Mapping[str, Resource] | None = None,
    ) -> None:
        self.model_name = model_name
        #: What the agent reads instead of constants (``ctx.resource(name)``); their versions are
        #: recorded on the trajectory.
        self.resources: dict[str, Resource] = dict(resources or {})
        #: The text the agent read of each resource it asked for (given or its default):
        #: what ``optimize-prompt`` starts from when told no seed.
        self.resources_read: dict[str, str] = {}
        self.agent_match = agent_match
        #: Bounds on :meth:`emit_variable` (the gateway's ``GatewayLimits``; ``None``: none).
        self.max_variables = max_variables
        self.max_variable_bytes = max_variable_bytes
        self.episode_id = uuid.uuid4().hex
        self.trajectory = Trajectory(
            episode_id=self.episode_id, task=task, env_id=env_id, group_id=group_id, seed=seed, started_at=time.time(),
            resources=resource_versions(self.resources),
        )
        #: The agent's own traces joined to its calls (``max_spans``: the gateway's
        #: ``GatewayLimits.max_episode_spans``).
        self.spans = SpanJoin(self.trajectory, max_spans)
        #: Where calls and the agent's end are announced (shared by a batch of episodes).
        self.events: queue.SimpleQueue[EpisodeEvent] = events if events is not None else queue.SimpleQueue()
        #: Set once the episode is being torn down; the agent may poll ``ctx.cancelled``.
        self.cancelled = threading.Event()
        #: Called at each call the agent makes, before it is recorded; the agent's worker sets it
        #: to raise ``AgentCancelled`` in an agent it has given up waiting for.
        self.call_guard: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._variables: dict[str, Any] = {}
        self._pending: dict[str, PendingCall] = {}
        self._last_answered: Step | None = None
        self._finished = threading.Event()
        self._reason = ""
        self._closed = False
        #: Why a reward of this episode was refused (it must not be trained on), if one was.
        self.refused_reward: str | None = None
        #: What the gateway's wires keep for this episode's agent, by wire (the Responses API's
        #: stored responses, the exact text of tool calls answered as Anthropic ``tool_use``
        #: blocks): see :mod:`agentgym_lightning.gateway.wires`.
        self.wire_state: dict[str, Any] = {}

    # ------------------------------------------------------------------ the agent's end

    def finish(self, result: Any, error: BaseException | None) -> None:
        """The agent returned ``result`` or raised ``error``: announce it (once) with a :class:`DoneEvent`."""
        if self._finished.is_set():
            return
        self._finished.set()
        if not self._closed:
            # Once closed, nobody reads the event: queued, it would keep the agent's last
            # frames (and every socket they hold) alive for as long as the queue lives.
            self.events.put(DoneEvent(self, result, error))

    @property
    def finished(self) -> bool:
        """The agent has returned or raised."""
        return self._finished.is_set()

    def wait_finished(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the agent to return or raise; True if it did."""
        return self._finished.wait(timeout)

    @property
    def cancel_reason(self) -> str:
        """Why the episode was cancelled (empty while it runs)."""
        return self._reason

    def cancel(self, reason: str) -> None:
        """Refuse every pending and future call so the agent unwinds; does not wait."""
        with self._lock:
            if self.cancelled.is_set():
                return
            self._reason = reason
            self.cancelled.set()
            pending = list(self._pending.values())
            self._pending.clear()
        for call in pending:
            call.resolve(error=GatewayError(409, f"episode {self.episode_id} is over: {reason}", code="episode_closed"))

    def close(self) -> None:
        """Nobody drives the episode any more: its calls are refused (:meth:`cancel`) and the
        agent's end is no longer announced."""
        self._closed = True
        self.cancel(self._reason or "stopped")

    def end(self, status: Status, error: str | None, final_reward: float | None) -> None:
        """Record how the episode ended (the driver's verdict). With an ``agent_match``, every
        call is judged again first (:meth:`judge`): the agent's traces may have named a call
        after it arrived (an exporter in another process sends an agent's span when it ends)."""
        trajectory = self.trajectory
        if self.agent_match is not None:
            for step in trajectory.steps:
                self.judge(step)
        trajectory.status, trajectory.error, trajectory.final_reward = status, error, final_reward
        trajectory.ended_at = time.time()

    def note_error(self, note: str) -> None:
        """Add ``note`` to the trajectory's ``error`` (what went wrong after the verdict: a worker
        that would not stop)."""
        error = self.trajectory.error
        self.trajectory.error = f"{error}\n{note}" if error else note

    def raise_if_stopped(self, *_: Any) -> None:
        """Run the :attr:`call_guard` (the gateway calls this before it checks a request)."""
        if self.call_guard is not None:
            self.call_guard()

    # ------------------------------------------------------------------ from the gateway

    def submit(self, request: ChatRequest, parent_span_id: str | None = None) -> PendingCall:
        """Record a new LLM call of the agent and announce it; the caller then waits on it.
        ``parent_span_id``: the span the agent made it inside (its trace context), if known."""
        self.raise_if_stopped()
        with self._lock:
            if self.cancelled.is_set():
                raise GatewayError(409, f"episode {self.episode_id} is over: {self._reason}", code="episode_closed")
            if request.sampling.n not in (None, 1):
                raise GatewayError(400, "n > 1 is not supported: make n separate calls (each is one step)")
            index = len(self.trajectory.steps)
            agent = request.metadata.get("agent")
            traced = self.spans.on_call(index, parent_span_id)  # the agent span it was made in
            step = Step(
                index=index,
                request=request,
                variables=dict(self._variables),
                role=request.metadata.get("role"),
                agent=traced if agent is None else agent,
                timings=StepTimings(requested_at=time.time()),
            )
            # As the agent marked it; the env's agent_match is applied when the driver takes it.
            self.judge(step, match=False)
            self.trajectory.steps.append(step)
            call = PendingCall(self, step)
            self._pending[call.call_id] = call
        self.events.put(CallEvent(self, call))
        return call

    # ------------------------------------------------------------------ from the driver

    def answer(self, call: PendingCall, completion: Completion) -> None:
        """Record ``completion`` on the call's step (and whether its prompt extends the previous
        call's: :func:`_mark_continuity`) and wake the agent."""
        with self._lock:
            if self._pending.pop(call.call_id, None) is None:
                raise RuntimeError(f"call {call.call_id} of episode {self.episode_id} is not pending")
            step = call.step
            _mark_continuity(self.trajectory.steps, step, completion)
            step.completion = completion
            step.policy_version = completion.policy_version
            step.timings.answered_at = time.time()
            self._last_answered = step
        call.resolve(completion)

    def refuse(self, call: PendingCall, error: GatewayError) -> None:
        """Answer the call with an OpenAI error instead of a completion: the step is kept,
        untrainable (nothing to learn from), with ``step.error`` set."""
        with self._lock:
            self._pending.pop(call.call_id, None)
            step = call.step
            step.error = f"{error.status} {error.code}: {error.message}"
            self.judge(step, match=False)
            step.timings.answered_at = time.time()
        call.resolve(error=error)

    def judge(self, step: Step, *, match: bool = True) -> None:
        """Decide whether ``step`` trains, the one place that does: not when the agent marked the
        call ``metadata={"trainable": "false"}`` or it was answered with an error; otherwise as
        the env's ``agent_match`` says (:func:`untrainable_reason`; ``match=False``: not asked).

        The episode judges a call as it records it and as it refuses it; the driver has it
        judged with the ``agent_match`` when it takes the call (the observation), and
        :meth:`end` judges every call again once all the agent's spans are in. Calls it rejects
        are answered and recorded as always; the trainer leaves them out."""
        step.trainable = step.error is None and step.request.trainable
        if match and step.trainable:
            step.trainable = untrainable_reason(step, self.agent_match) is None

    def close_step(self, step: Step, ended_at: float) -> None:
        """The step is complete (the agent called again, or ended) at ``ended_at``."""
        step.timings.ended_at = ended_at

    def add_air(self, step: Step, air: AirRewards) -> None:
        """Add ``step``'s AIR rewards (:mod:`agentgym_lightning.air`); a refused one excludes
        the episode (:meth:`refuse_reward`)."""
        for message in air.refused:
            self.refuse_reward(message)
        with self._lock:
            step.rewards.extend(air.rewards)

    def drop_step(self, call: PendingCall, reason: str) -> None:
        """Refuse a call that will never be answered (the episode was truncated on it) and
        forget its step."""
        with self._lock:
            self._pending.pop(call.call_id, None)
            if call.step in self.trajectory.steps:
                self.trajectory.steps.remove(call.step)
        call.resolve(error=GatewayError(409, f"episode {self.episode_id} is over: {reason}", code="episode_closed"))

    # ------------------------------------------------------------------ from the agent

    def emit_variable(self, name: str, value: Any) -> None:
        """Set a semantic variable; raises ``ValueError`` past the gateway's ``max_variables``
        names or ``max_variable_bytes`` per value (``docs/limits.md``)."""
        if not isinstance(name, str) or not name:
            raise ValueError("a semantic variable needs a non-empty string name")
        if self.max_variable_bytes is not None and (size := _json_size(value)) > self.max_variable_bytes:
            raise ValueError(
                f"semantic variable {name!r} is {size} bytes of JSON, over the limit of {self.max_variable_bytes} "
                "(GatewayLimits.max_variable_bytes): keep big data in the agent's own storage and emit a summary"
            )
        with self._lock:
            if self.max_variables is not None and name not in self._variables and len(self._variables) >= self.max_variables:
                raise ValueError(
                    f"semantic variable {name!r} would be one more than this episode's limit of "
                    f"{self.max_variables} (GatewayLimits.max_variables)"
                )
            self._variables[name] = value
            self.trajectory.variables[name] = value
            if self._last_answered is not None:
                self._last_answered.outcome[name] = value

    def record_spans(self, records: list[SpanRecord]) -> None:
        """Join the agent's spans (started or finished) to its calls
        (:mod:`agentgym_lightning.tracing.join`) and write what they say about them."""
        with self._lock:
            self._write_findings(self.spans.add(records))

    def _write_findings(self, found: SpanFindings) -> None:
        steps, trajectory = self.trajectory.steps, self.trajectory
        for index, changes in found.outcomes.items():
            step = steps[index]
            # A new dict, swapped in whole: the driver may be reading the old one (AIR) right
            # now, from its own thread, when a span arrives late.
            step.outcome = {**step.outcome, **changes}
        for index, name in found.agents.items():
            steps[index].agent = name
        trajectory.spans.extend(found.summaries)
        trajectory.spans_dropped += found.dropped

    def emit_reward(self, value: float, source: str = "agent") -> None:
        """Add a reward to the call most recently answered. A reward that is not a finite number
        within ``±MAX_ABS_REWARD`` raises :class:`~agentgym_lightning.reward_bounds.RewardRefused`
        (a ``ValueError``) and excludes the episode (see :meth:`refuse_reward`)."""
        try:
            value = checked_reward(value, f"emit_reward(source={str(source)!r})")
        except RewardRefused as exc:
            self.refuse_reward(str(exc))
            raise
        reward = Reward(value=value, source=str(source))
        with self._lock:
            if self._last_answered is not None:
                self._last_answered.rewards.append(reward)
            else:
                self.trajectory.rewards.append(reward)

    def refuse_reward(self, message: str) -> None:
        """Remember that a reward of this episode was refused: the env ends it ``infra_failed``
        with ``message`` (the first one), whatever else happens (see :mod:`~agentgym_lightning.reward_bounds`)."""
        with self._lock:
            if self.refused_reward is None:
                self.refused_reward = message

    @property
    def variables(self) -> dict[str, Any]:
        """A copy of the agent's current semantic variables."""
        with self._lock:
            return dict(self._variables)


def _json_size(value: Any) -> int:
    """Bytes of ``value`` as JSON (strings and bytes by length; ``repr`` for what JSON cannot hold)."""
    if isinstance(value, (str, bytes)):
        return len(value)
    try:
        return len(json.dumps(value, default=repr, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):  # a cycle, a non-string key...
        return len(repr(value))


def _mark_continuity(steps: Sequence[Step], step: Step, completion: Completion) -> None:
    """Record whether this call's prompt ids extend the previous call's prompt+completion ids
    (merged-trajectory training needs it); mismatches are counted, never dropped. When they
    do not, also whether the agent rebuilt its prompt (its messages do not continue the
    previous call's), which is expected, unlike template drift.

    Constant cost in the episode's length: the previous answered step is found from this
    step's index (normally the one just before), never by scanning the episode.
    """
    if completion.prompt_token_ids is None:
        return
    previous = _previous_answered(steps, step)
    if previous is None:
        return
    prev = previous.completion
    assert prev is not None
    if prev.prompt_token_ids is None or prev.completion_token_ids is None:
        return
    step.prompt_extends_previous = ids_extend(completion.prompt_token_ids, prev.prompt_token_ids, prev.completion_token_ids)
    if not step.prompt_extends_previous:
        step.prompt_rebuilt = not _messages_continue(previous, step)


def _previous_answered(steps: Sequence[Step], step: Step) -> Step | None:
    """The last step before ``step`` that has a completion (normally ``steps[step.index - 1]``)."""
    i = step.index
    if not (0 <= i < len(steps) and steps[i] is step):  # indices shifted (a dropped step)
        i = next((k for k in range(len(steps) - 1, -1, -1) if steps[k] is step), -1)
        if i < 0:
            return None
    for k in range(i - 1, -1, -1):
        if steps[k].completion is not None:
            return steps[k]
    return None


def _message_key(message: Any) -> tuple[Any, Any]:
    if not isinstance(message, Mapping):
        return (None, repr(message))
    return (message.get("role"), message.get("content") or None)


def _messages_continue(previous: Step, step: Step) -> bool:
    """Whether ``step``'s messages are ``previous``'s messages, then its answer, then more:
    the agent extended its conversation rather than starting a new one."""
    before, now = previous.request.messages, step.request.messages
    if len(now) <= len(before):
        return False
    if any(_message_key(a) != _message_key(b) for a, b in zip(before, now)):
        return False
    reply = now[len(before)]
    if not isinstance(reply, Mapping) or reply.get("role") != "assistant":
        return False
    completion = previous.completion
    assert completion is not None
    # Text answers must come back as given; a tool-call answer may carry empty content.
    return (reply.get("content") or "") == completion.text or bool(completion.tool_calls and reply.get("tool_calls"))
