"""``AgentEnv``: any agent as a Gymnasium environment, one LLM call per step.

The contract:

- ``reset(seed, options)`` picks a task (``options={"task": ...}`` or ``{"task_index": i}``
  name one; ``{"group_id": ...}`` tags GRPO groups; ``{"resources": {...}}`` replaces some of the
  env's resources for this episode), starts the agent and runs it to its first
  LLM call. The observation is that call: an :class:`~agentgym_lightning.spaces.Observation`
  (the request and the agent's semantic variables).
- ``step(action)`` answers the pending call with ``action`` (a
  :class:`~agentgym_lightning.llm.Completion`, a string or a dict) and runs the agent to its next
  call (the next observation) or to its end (``terminated``).
- The reward of a step is what landed on the call it answered: rewards the agent emitted after
  it, and AIR rewards; the terminal step adds the episode's final reward. The rewards of an
  episode sum to ``trajectory.total_reward``.
- ``truncated`` when the agent asks for more than ``max_turns`` calls, or runs past
  ``time_limit`` seconds, or the infrastructure failed (``info["status"] == "infra_failed"``:
  never train on it as a zero reward).
- ``info["trajectory"]`` on the last step holds the whole episode (also ``env.trajectory``).
- An action may also be a :class:`~agentgym_lightning.gateway.GatewayError`: the call is answered
  with that OpenAI error (a 400 when a backend rejected the request, say), as a server would, and
  the agent decides what to do; the step is kept, untrainable, with ``step.error`` set.
- ``gym.make(id, max_episode_steps=N)`` ends the episode itself at step ``N`` (``max_turns`` is
  lowered to ``N``; see :class:`TimeLimitAsMaxTurns`), so the last step's ``info`` has the
  trajectory and status as always.

For drivers of many envs (:func:`~agentgym_lightning.rollouts.in_process.rollout`): ``step_wait(timeout)`` and
``reset_wait(timeout)`` raise :class:`TimeoutError` when the agent has not called or ended in time
(call again later), :meth:`AgentEnv.set_ready_callback` tells when there is something to wait
for, and :attr:`AgentEnv.deadline` says when the episode's time limit falls.

Every step costs the same however long the episode already is: nothing here scans earlier steps.
The env writes no step itself: it asks its :class:`~agentgym_lightning.episode.Episode` to (to
judge a call trainable, close a step, add its AIR from :mod:`agentgym_lightning.air`).
"""

from __future__ import annotations

import copy
import queue
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, SupportsFloat

import gymnasium as gym
import numpy as np

from agentgym_lightning.agent_match import AgentMatch, AgentMatchSpec, as_agent_match
from agentgym_lightning.air import air_rewards
from agentgym_lightning.episode import CallEvent, DoneEvent, Episode, EpisodeEvent
from agentgym_lightning.gateway.endpoint import EpisodeEndpoint
from agentgym_lightning.gateway.gateway import Gateway, get_gateway
from agentgym_lightning.gateway.openai_wire import GatewayError
from agentgym_lightning.llm import ChatRequest, as_completion
from agentgym_lightning.plugin_manager import get_plugin_manager
from agentgym_lightning.policy_request import seeded
from agentgym_lightning.resources import Resource, ResourceSpec, as_resources
from agentgym_lightning.reward_bounds import RewardRefused, checked_reward
from agentgym_lightning.spaces import CompletionSpace, Observation, ObservationSpace
from agentgym_lightning.trajectory import Status, Step, Trajectory
from agentgym_lightning.worker import AgentWorker

__all__ = ["AgentEnv", "adapt_agent", "TaskSource", "RewardFn", "TimeLimitAsMaxTurns", "NoRewardWarning"]

#: Tasks: a sequence to pick from, or a function of the env's RNG.
TaskSource = Sequence[Any] | Callable[[np.random.Generator], Any]
#: ``reward_fn(task, result) -> float``: the episode's final reward.
RewardFn = Callable[[Any, Any], SupportsFloat]

StepResult = tuple[Observation, float, bool, bool, dict[str, Any]]


class NoRewardWarning(UserWarning):
    """An env has no reward function and no plugin answered ``agentgym_episode_reward``: its
    episodes end with ``final_reward=None`` (only emitted rewards count)."""


class _Inbox:
    """The env's event queue (what :class:`~agentgym_lightning.episode.Episode` puts calls and
    its end on), which also wakes a driver waiting on many envs."""

    __slots__ = ("_queue", "callback")

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[EpisodeEvent] = queue.SimpleQueue()
        self.callback: Callable[[], None] | None = None

    def put(self, event: EpisodeEvent) -> None:
        self._queue.put(event)
        callback = self.callback
        if callback is not None:
            callback()

    def get(self, timeout: float | None = None) -> EpisodeEvent:
        return self._queue.get(timeout=timeout)


def adapt_agent(agent: object) -> Callable[..., Any]:
    """Turn ``agent`` into an agent callable ``fn(task, ctx)`` through the adapter plugins."""
    adapted = get_plugin_manager().hook.agentgym_adapt_agent(agent=agent)
    if adapted is None:
        raise TypeError(
            f"don't know how to run an agent of type {type(agent).__name__}: pass a callable "
            "fn(task, ctx) (sync or async), or install an adapter plugin for its framework"
        )
    return adapted


class AgentEnv(gym.Env[Observation, Any]):
    """Wraps an agent callable and a reward function as a Gymnasium environment.

    Args:
        agent: ``fn(task, ctx) -> result`` (sync or ``async``), or any object an adapter plugin
            understands. It makes its LLM calls through ``ctx.openai_client()`` or any OpenAI
            client pointed at ``ctx.base_url``.
        tasks: The tasks to pick from at reset (a non-empty sequence), or ``fn(rng) -> task``.
        reward_fn: ``fn(task, result) -> float``, the final reward when the agent returns. When
            ``None``, the ``agentgym_episode_reward`` hook is asked; if nothing answers, the
            final reward is ``None`` (only emitted rewards count).
        env_id: Recorded on trajectories (``gym.make`` passes its id).
        max_turns: Most LLM calls an episode may make; one more truncates it.
        time_limit: Seconds the agent may run in an episode, ``None`` for no limit. Time its calls
            spend waiting for the policy's answer does not count: a slow generator (a CPU, a
            busy server) never truncates an agent, only the agent's own work (tools, SQL, a hang)
            does. :attr:`deadline` moves on by the wait when a call is answered.
        air_weights: Weight of each Automatic Intermediate Reward source (``{"tool_error":
            -0.1}``). Sources without a weight are not applied: AIR is off by default.
        transport: How ``ctx.openai_client()`` reaches the gateway: ``"inproc"`` (no socket) or
            ``"http"`` (a real socket to the gateway server).
        model_name: The model name agents are told to use (``ctx.model``).
        gateway: The gateway to register episodes with (default: the process-wide one).
        stop_grace: Seconds to wait for an agent to unwind when its episode is cut short.
        seed_calls: Give every call the agent did not seed a ``seed`` derived from the episode's
            seed and the call's index, in the observation's request (the recorded request stays
            as the agent sent it; :func:`~agentgym_lightning.policy_request.seeded`). With a
            backend that samples seeded requests independently of their batch (``hf``,
            ``vllm``), a rollout is then reproducible however its calls were batched; the
            trainer turns this on.
        agent_match: Which calls are trainable (selective / multi-agent training; see
            :mod:`agentgym_lightning.agent_match`): a regular expression matched in full against
            each call's agent name or role (``"writer|rewriter"``), a mapping of
            :class:`~agentgym_lightning.agent_match.AgentMatch` fields, or ``fn(step) -> bool``.
            Calls it rejects are answered and recorded as always, with ``step.trainable=False``.
            ``None`` (default): every call the agent did not mark untrainable.
        trajectory_reward: ``fn(trajectory) -> float | None``, the final reward when the agent
            returns, read from its episode's trajectory (``trajectory.result`` is what the agent
            returned); instead of ``reward_fn`` and the hook. For a driver that learns the reward
            from elsewhere than the agent's result (the HTTP driver: a remote agent's ``done``).
        on_end: ``fn(episode_id)``, called when an episode ends, however it ends (the agent
            returned, truncated, closed), before its agent is stopped: an agent that waits on
            something outside (the HTTP driver's stand-in for a remote agent) is released there
            at once, rather than cancelled after ``stop_grace``.
        resources: Named, versioned texts the agent reads instead of its constants
            (``ctx.resource("system_prompt", default=...)``; :mod:`agentgym_lightning.resources`):
            ``{name: text}``, ``{name: {"text", "version"}}`` or ``{name: Resource}``. Each
            trajectory records the versions its episode was given. Settable between episodes
            (:attr:`resources`).

    With neither ``reward_fn`` nor an ``agentgym_episode_reward`` hook that answers, episodes end
    with ``final_reward=None``; the env warns once (:class:`NoRewardWarning`).
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        agent: object,
        tasks: TaskSource,
        reward_fn: RewardFn | None = None,
        *,
        env_id: str | None = None,
        max_turns: int | None = None,
        time_limit: float | None = 300.0,
        air_weights: Mapping[str, float] | None = None,
        transport: Literal["inproc", "http"] = "inproc",
        model_name: str = "policy",
        gateway: Gateway | None = None,
        stop_grace: float = 1.0,
        render_mode: str | None = None,
        seed_calls: bool = False,
        agent_match: AgentMatchSpec | AgentMatch | None = None,
        trajectory_reward: Callable[[Trajectory], SupportsFloat | None] | None = None,
        on_end: Callable[[str], None] | None = None,
        resources: Mapping[str, ResourceSpec] | None = None,
    ) -> None:
        if transport not in ("inproc", "http"):
            raise ValueError(f"transport must be 'inproc' or 'http', not {transport!r}")
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1 or None, not {max_turns}")
        if time_limit is not None and time_limit <= 0:
            raise ValueError(f"time_limit must be > 0 seconds or None, not {time_limit}")
        if not callable(tasks) and len(tasks) == 0:
            raise ValueError("tasks is empty: give at least one task, or a function rng -> task")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, not {render_mode!r}")
        self.agent = adapt_agent(agent)
        self.tasks = tasks
        self.reward_fn = reward_fn
        self.env_id = env_id
        self.max_turns = max_turns
        self.time_limit = time_limit
        self.air_weights: dict[str, float] = {k: float(v) for k, v in (air_weights or {}).items()}
        self.transport = transport
        self.model_name = model_name
        self.gateway = gateway or get_gateway()
        self.stop_grace = stop_grace
        self.render_mode = render_mode
        self.seed_calls = seed_calls
        self.agent_match = as_agent_match(agent_match)
        self.trajectory_reward = trajectory_reward
        self.on_end = on_end
        self.resources = as_resources(resources)
        self.observation_space = ObservationSpace()
        self.action_space = CompletionSpace()

        self._hook = get_plugin_manager().hook
        self._events = _Inbox()
        self._warned_no_reward = False
        self._episode: Episode | None = None
        self._worker: AgentWorker | None = None
        self._call: Any = None  # the PendingCall the last observation showed
        self._unfinalized: list[Step] = []
        self._last_obs: Observation | None = None
        self._deadline: float | None = None
        self._waiting_since: float | None = None  # when the pending call was shown to the driver
        self._early_end: StepResult | None = None  # the agent ended before its first call

    # ------------------------------------------------------------------ public state

    @property
    def trajectory(self) -> Trajectory | None:
        """The current (or last) episode's trajectory."""
        return self._episode.trajectory if self._episode is not None else None

    @property
    def episode_id(self) -> str | None:
        return self._episode.episode_id if self._episode is not None else None

    @property
    def base_url(self) -> str:
        """The running episode's OpenAI base URL over HTTP, for an agent in another process."""
        if self._episode is None:
            raise gym.error.ResetNeeded("no episode is running: call reset() first")
        return self.gateway.base_url(self._episode.episode_id)

    @property
    def anthropic_base_url(self) -> str:
        """The running episode's base URL for an Anthropic client in another process (no ``/v1``)."""
        if self._episode is None:
            raise gym.error.ResetNeeded("no episode is running: call reset() first")
        return self.gateway.anthropic_base_url(self._episode.episode_id)

    @property
    def deadline(self) -> float | None:
        """When the running episode hits ``time_limit`` (``time.monotonic()`` seconds), or None.
        While a call waits for its answer the clock is stopped; answering moves this later."""
        return self._deadline

    @property
    def resources(self) -> dict[str, Resource]:
        """The resources every episode is given (unless its reset options replace some)."""
        return self._resources

    @resources.setter
    def resources(self, resources: Mapping[str, ResourceSpec] | None) -> None:
        self._resources = as_resources(resources)  # checked now, not at the next reset

    @property
    def resources_read(self) -> dict[str, str]:
        """What the running (or last) episode's agent read through ``ctx.resource``, by name: the
        given text or the agent's default. After :meth:`reset` it holds what the agent read
        before its first call (a system prompt): how ``optimize-prompt`` finds the prompt an
        agent starts from."""
        return dict(self._episode.resources_read) if self._episode is not None else {}

    def set_ready_callback(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback()`` whenever the running agent makes an LLM call or ends, i.e. when
        :meth:`step_wait` / :meth:`reset_wait` may have something to return.

        For drivers that wait on many envs at once. It runs on the agent's thread (or the
        gateway's): keep it short and never block in it. ``None`` removes it.
        """
        self._events.callback = callback

    def sample_task(self, rng: np.random.Generator) -> Any:
        """Draw a task from this env's task source with ``rng``."""
        if callable(self.tasks):
            return self.tasks(rng)
        return self.tasks[int(rng.integers(len(self.tasks)))]

    # ------------------------------------------------------------------ Gymnasium API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Pick the task and start the agent; :meth:`reset_wait` returns its first call.

        Split in two so a driver can start many episodes before waiting on any.
        """
        super().reset(seed=seed)
        # Refused while too many agents outlive their episodes; checked before anything changes,
        # so a refused reset leaves the episode in progress as it was.
        self.gateway.check_lingering()
        if self._episode is not None and not self._episode.trajectory.done:
            self._end(Status.TRUNCATED, "reset() called before the episode ended", self._finalize(time.time()))
        options = dict(options or {})
        task = self._pick_task(options)
        resources = {**self.resources, **as_resources(options.get("resources"))}
        self._unfinalized = []
        self._last_obs = None
        self._early_end = None
        self._call = None
        episode = Episode(
            task=task,
            model_name=self.model_name,
            env_id=self.env_id,
            seed=int(self.np_random.integers(2**31 - 1)),
            group_id=options.get("group_id"),
            events=self._events,  # type: ignore[arg-type]  # put() is all an Episode uses
            max_variables=self.gateway.limits.max_variables,
            max_variable_bytes=self.gateway.limits.max_variable_bytes,
            max_spans=self.gateway.limits.max_episode_spans,
            agent_match=self.agent_match,
            resources=resources,
        )
        self._worker = AgentWorker(self.agent, episode, EpisodeEndpoint(self.gateway, episode, self.transport))
        self._episode = episode
        self._hook.agentgym_episode_start(trajectory=episode.trajectory)
        self._deadline = None if self.time_limit is None else time.monotonic() + self.time_limit
        self._waiting_since = None
        self._worker.start()

    def reset_wait(self, timeout: float | None = None) -> tuple[Observation, dict[str, Any]]:
        """Run the started agent to its first LLM call (see :meth:`reset_async`).

        With ``timeout``, raises :class:`TimeoutError` if the agent has neither called nor ended
        within ``timeout`` seconds (``0``: only look); nothing changes, call it again later.
        """
        if self._episode is None or self._episode.trajectory.done or self._call is not None or self._last_obs is not None:
            raise gym.error.ResetNeeded("reset_wait() must follow reset_async()")
        obs, reward, terminated, truncated, info = self._advance(timeout)
        reset_info: dict[str, Any] = {"task": copy.deepcopy(self._episode.trajectory.task), "turn": 0}
        if terminated or truncated:
            # Gymnasium's reset cannot end an episode: report it now, end it on the next step().
            self._early_end = (obs, reward, terminated, truncated, info)
            reset_info.update(episode_over=True, status=info["status"], error=info["error"])
        return obs, reset_info

    def step(self, action: Any) -> StepResult:
        self.step_async(action)
        return self.step_wait()

    def step_async(self, action: Any) -> None:
        """Answer the pending call with ``action`` and let the agent run on; see :meth:`step_wait`.

        Split in two so a driver can answer many envs before waiting on any.
        """
        if self._early_end is not None:
            return
        if self._call is None:
            raise gym.error.ResetNeeded(
                "no LLM call is waiting for an answer: call reset() first (or again, after the episode ended)"
            )
        if isinstance(action, GatewayError):
            self._refuse(action)
            return
        completion = as_completion(action)
        self._resume_clock()
        call, self._call = self._call, None
        assert self._episode is not None
        self._episode.answer(call, completion)
        self._unfinalized.append(call.step)

    def step_wait(self, timeout: float | None = None) -> StepResult:
        """Run the agent to its next LLM call or its end, and report the step.

        With ``timeout``, raises :class:`TimeoutError` if the agent has neither called nor ended
        within ``timeout`` seconds (``0``: only look); nothing changes, call it again later. The
        episode's ``time_limit`` still ends it (truncated) whatever ``timeout`` says.
        """
        if self._early_end is not None:
            result, self._early_end = self._early_end, None
            return result
        return self._advance(timeout)

    def abort(self, error: str, status: Status = Status.INFRA_FAILED) -> StepResult:
        """End the running episode from outside (a policy backend failed, say)."""
        if self._episode is None or self._episode.trajectory.done:
            raise gym.error.ResetNeeded("no episode is running")
        self._early_end = None
        return self._end(status, error, self._finalize(time.time()))

    def close(self) -> None:
        """Stop a running agent (recorded as truncated); no thread or task is left behind."""
        if self._episode is not None and not self._episode.trajectory.done:
            self._end(Status.TRUNCATED, "the env was closed mid-episode", self._finalize(time.time()))
        super().close()

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self._last_obs is None:
            return None
        lines = [f"[{m.get('role')}] {m.get('content')}" for m in self._last_obs.request.messages]
        return "\n".join(lines)

    # ------------------------------------------------------------------ internals

    def _pick_task(self, options: dict[str, Any]) -> Any:
        if "task" in options:
            return options["task"]
        if "task_index" in options:
            if callable(self.tasks):
                raise ValueError("options['task_index'] needs a sequence of tasks; this env draws tasks from a function")
            index = int(options["task_index"])
            if not -len(self.tasks) <= index < len(self.tasks):
                raise IndexError(f"task_index {index} is out of range for {len(self.tasks)} tasks")
            return self.tasks[index]
        return self.sample_task(self.np_random)

    def _refuse(self, error: GatewayError) -> None:
        """Answer the pending call with an OpenAI error instead of a completion."""
        self._resume_clock()
        call, self._call = self._call, None
        assert self._episode is not None
        self._episode.refuse(call, error)
        self._unfinalized.append(call.step)

    def _resume_clock(self) -> None:
        """The answer came: the time the call waited for it is not the agent's."""
        if self._waiting_since is not None and self._deadline is not None:
            self._deadline += time.monotonic() - self._waiting_since
        self._waiting_since = None

    def _next_event(self, timeout: float | None = None) -> EpisodeEvent | None:
        """The episode's next event; None once the time limit passed; TimeoutError after ``timeout``."""
        give_up = None if timeout is None else time.monotonic() + timeout
        while True:
            ends = [t for t in (self._deadline, give_up) if t is not None]
            try:
                event = self._events.get(timeout=max(0.0, min(ends) - time.monotonic()) if ends else None)
            except queue.Empty:
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    return None
                raise TimeoutError(f"the agent has not called or ended within {timeout} s") from None
            if event.episode is self._episode:  # skip leftovers of an episode already ended
                return event

    def _advance(self, timeout: float | None = None) -> StepResult:
        episode = self._episode
        assert episode is not None
        event = self._next_event(timeout)
        reward = self._finalize(time.time())
        if event is None:
            return self._end(Status.TRUNCATED, f"time limit of {self.time_limit} s reached", reward)
        if isinstance(event, CallEvent):
            answered = len(episode.trajectory.steps) - 1
            if self.max_turns is not None and answered >= self.max_turns:
                reason = f"max_turns={self.max_turns} reached"
                episode.drop_step(event.pending, reason)
                return self._end(Status.TRUNCATED, reason, reward)
            self._call = event.pending
            step = event.pending.step
            episode.judge(step)  # with the agent_match, now that the driver takes the call
            request = seeded(step.request, episode.trajectory.seed, step.index) if self.seed_calls else step.request
            obs = Observation(request=request, variables=dict(step.variables))
            self._last_obs = obs
            self._waiting_since = time.monotonic()  # the agent's clock stops until the answer
            return obs, reward, False, False, {"turn": step.index}
        return self._end_by_agent(event, reward)

    def _end_by_agent(self, event: DoneEvent, reward: float) -> StepResult:
        trajectory = event.episode.trajectory
        trajectory.result = event.result
        if event.error is None:
            try:
                final = self._episode_reward(trajectory.task, event.result, trajectory)
            except RewardRefused as exc:
                return self._end(Status.INFRA_FAILED, str(exc), reward)
            except Exception as exc:  # noqa: BLE001 - reward code failing is not the agent's fault
                return self._end(Status.INFRA_FAILED, "reward function failed: " + _format_error(exc), reward)
            return self._end(Status.SUCCEEDED, None, reward, final)
        status = self._hook.agentgym_classify_error(error=event.error) or Status.TASK_FAILED
        final = 0.0 if status is Status.TASK_FAILED else None
        return self._end(status, _format_error(event.error), reward, final)

    def _episode_reward(self, task: Any, result: Any, trajectory: Trajectory) -> float | None:
        if self.trajectory_reward is not None:
            value = self.trajectory_reward(trajectory)
            return None if value is None else checked_reward(value, f"the trajectory_reward of {self._name}")
        if self.reward_fn is not None:
            return checked_reward(self.reward_fn(task, result), f"the reward_fn of {self._name}")
        value = self._hook.agentgym_episode_reward(task=task, result=result, trajectory=trajectory)
        if value is None and not self._warned_no_reward:
            self._warned_no_reward = True
            warnings.warn(
                f"{self._name}: no reward_fn was given and no agentgym_episode_reward "
                "hook answered, so episodes end with final_reward=None (only rewards the agent emits count); "
                "pass reward_fn=fn(task, result) -> float or install a reward plugin",
                NoRewardWarning,
                stacklevel=2,
            )
        return None if value is None else checked_reward(value, f"the agentgym_episode_reward hook of {self._name}")

    @property
    def _name(self) -> str:
        return self.env_id or type(self).__name__

    def _finalize(self, now: float) -> float:
        """Close the answered steps: timings, AIR rewards (:mod:`agentgym_lightning.air`), the
        step hook. Returns their reward."""
        total = 0.0
        if not self._unfinalized:
            return total
        episode = self._episode
        assert episode is not None
        trajectory = episode.trajectory
        for step in self._unfinalized:
            episode.close_step(step, now)
            if self.air_weights:
                episode.add_air(step, air_rewards(self._hook, step, trajectory, self.air_weights, self._name))
            self._hook.agentgym_step_end(step=step, trajectory=trajectory)
            total += step.reward
        self._unfinalized = []
        return total

    def _end(self, status: Status, error: str | None, reward: float, final: float | None = None) -> StepResult:
        episode = self._episode
        assert episode is not None
        if self.on_end is not None:
            self.on_end(episode.episode_id)
        trajectory = episode.trajectory
        if episode.refused_reward is not None and status is not Status.INFRA_FAILED:
            # A refused reward (see reward_bounds): the episode's return is unknown, never train on it.
            status, error, final = Status.INFRA_FAILED, episode.refused_reward, None
        episode.end(status, error, final)  # with an agent_match, every call is judged again there
        self._call = None
        assert self._worker is not None
        self._worker.stop(self.stop_grace)
        reward += (final or 0.0) + sum(r.value for r in trajectory.rewards)
        self._hook.agentgym_episode_end(trajectory=trajectory)
        terminated = status in (Status.SUCCEEDED, Status.TASK_FAILED)
        info = {
            "turn": len(trajectory.steps),
            "status": status.value,
            "error": error,
            "final_reward": final,
            "trajectory": trajectory,
        }
        obs = self._last_obs or Observation(request=ChatRequest(messages=[]))
        return Observation(request=obs.request, variables=dict(obs.variables)), float(reward), terminated, not terminated, info


def _format_error(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-4000:]


class TimeLimitAsMaxTurns(gym.Wrapper[Observation, Any, Observation, Any], gym.utils.RecordConstructorArgs):
    """Makes ``gym.make(id, max_episode_steps=N)`` end agent episodes properly.

    Gymnasium's :class:`~gymnasium.wrappers.TimeLimit` only flips ``truncated`` after ``N`` steps:
    the agent would keep running and the last ``info`` would lack the trajectory and status. This
    wrapper (applied by ``gym.make`` after ``TimeLimit``, through the ``additional_wrappers`` of
    every ``lightning/...`` id) finds that limit and lowers the env's ``max_turns`` to ``N``, so
    the env ends the episode itself on step ``N`` (``truncated``, ``status`` ``truncated``, the
    trajectory in ``info``); ``TimeLimit`` agrees on the same step. Without a ``TimeLimit`` below
    it, it does nothing.
    """

    def __init__(self, env: gym.Env[Observation, Any]) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        limit = None
        inner: Any = env
        while isinstance(inner, gym.Wrapper):
            if isinstance(inner, gym.wrappers.TimeLimit):
                limit = inner._max_episode_steps
            inner = inner.env
        agent_env = env.unwrapped
        if limit is not None and isinstance(agent_env, AgentEnv):
            agent_env.max_turns = limit if agent_env.max_turns is None else min(agent_env.max_turns, limit)
