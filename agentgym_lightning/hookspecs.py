"""Every hook a plugin can implement, documented where it is declared (as pytest does).

A plugin is a module or object with functions named like the hooks below, decorated with
:data:`hookimpl`::

    from agentgym_lightning import hookimpl

    @hookimpl
    def agentgym_intermediate_rewards(step, trajectory, weights):
        if "tool_error" in weights and step.outcome.get("tool_error"):
            return Reward(value=-1.0, source="tool_error")

Bundled plugins live in ``agentgym_lightning.plugins``; third-party packages expose theirs
through the ``agentgym_lightning`` entry-point group (see CONTRIBUTING.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from agentgym_lightning.trajectory import Reward, Status, Step, Trajectory

PROJECT = "agentgym_lightning"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: A credit strategy maps a finished trajectory to one value per step.
CreditStrategy = Callable[..., "list[float]"]


# --------------------------------------------------------------------------- agents


@hookspec(firstresult=True)
def agentgym_adapt_agent(agent: object) -> Callable[..., Any] | None:
    """Turn a framework's agent object into an agent callable ``fn(task, ctx) -> result``.

    ``ctx`` is an :class:`~agentgym_lightning.agent.AgentContext`: it carries the episode's
    OpenAI ``base_url``/``api_key`` and ready clients. An adapter points the framework's model
    client at them (``ChatOpenAI(base_url=ctx.base_url, ...)`` for LangChain, say). Return
    ``None`` when ``agent`` is not of your framework; the first non-``None`` answer wins.
    Plain Python callables (sync or async) are handled by the bundled ``callable`` adapter.
    """


# --------------------------------------------------------------------------- rewards


@hookspec(firstresult=True)
def agentgym_episode_reward(task: Any, result: Any, trajectory: Trajectory) -> float | None:
    """The episode's final reward, when the environment was given no ``reward_fn``.

    Called once when the agent returns; ``result`` is what it returned. Return ``None`` to let
    another plugin answer. An exception here is an infrastructure failure, not a zero reward.
    """


@hookspec
def agentgym_intermediate_rewards(
    step: Step, trajectory: Trajectory, weights: Mapping[str, float]
) -> Reward | Sequence[Reward] | None:
    """Automatic Intermediate Rewards (AIR): rewards from system signals of one step.

    Called once per step, when it is complete (the agent's next call arrived, or the episode
    ended), with ``step.completion`` and ``step.outcome`` (the variables the agent emitted after
    the call: tool errors, SQL results...). Return raw rewards whose ``source`` names the signal;
    each is multiplied by ``weights[source]`` (:mod:`agentgym_lightning.air`) and logged as its own component. Signals with
    no weight are dropped, so AIR is off unless a weight is given: skip the work when your
    sources are not in ``weights``.
    """


@hookspec
def agentgym_credit_strategies() -> Mapping[str, CreditStrategy] | None:
    """Name credit-assignment strategies: ``{"name": fn(trajectory, **params) -> list[float]}``.

    A strategy shares an episode's return among its LLM calls (one value per step, in step
    order). Bundled: ``identical`` (LightningRL: every call gets the episode return),
    ``discounted`` (return-to-go with ``gamma``), ``final-only``.
    """


# --------------------------------------------------------------------------- failures


@hookspec(firstresult=True)
def agentgym_classify_error(error: BaseException) -> Status | None:
    """Tell an infrastructure failure from a task failure for an exception the agent raised.

    Return ``Status.INFRA_FAILED`` for faults of the machinery (a dead backend, a gateway
    error), ``Status.TASK_FAILED`` for the agent's own, ``None`` when you do not know. Default:
    connection/5xx errors of the OpenAI client are infrastructure, anything else is the task.
    """


# --------------------------------------------------------------------------- environments


@hookspec
def agentgym_register_envs() -> Sequence[Mapping[str, Any]] | None:
    """Environments a plugin provides, as keyword arguments of ``gymnasium.register``.

    Called on ``import agentgym_lightning``; ids must be namespaced (``"myorg/MyEnv-v0"``).
    """


# --------------------------------------------------------------------------- run logging


@hookspec
def agentgym_episode_start(trajectory: Trajectory) -> None:
    """An episode was reset (its task and ids are set; it has no steps yet)."""


@hookspec
def agentgym_step_end(step: Step, trajectory: Trajectory) -> None:
    """A step is complete: answered, its aftermath recorded, its rewards attached."""


@hookspec
def agentgym_episode_end(trajectory: Trajectory) -> None:
    """An episode ended (any status); the trajectory is final."""


@hookspec
def agentgym_log_metrics(metrics: Mapping[str, float], step: int | None) -> None:
    """Scalar metrics of a run (eval summaries, training statistics) for loggers such as W&B.

    ``step`` is the training step (``None`` outside training). Values may be NaN when a
    quantity is undefined (no episodes of a kind); loggers decide how to show it.
    """


# --------------------------------------------------------------------------- training runs


@hookspec
def agentgym_train_start(config: Mapping[str, Any], output_dir: str, step: int) -> Sequence[str] | None:
    """A training run starts (``step`` > 0 when it resumes a checkpoint).

    ``config`` is the run's config as a dict: a :class:`~agentgym_lightning.training.LightningRLConfig`
    or, for an SFT run, an ``SFTConfig``; both share the options of ``RunConfig``
    (``config["report_to"]`` lists the loggers the user asked for); ``output_dir`` is the run
    folder. Return lines to show the user (where a logger writes, say).
    """


@hookspec
def agentgym_log_episodes(trajectories: Sequence[Trajectory], step: int) -> None:
    """Sample episodes of a training step, for loggers that show them (a W&B table)."""


@hookspec
def agentgym_train_end(output_dir: str, metrics: Mapping[str, float], interrupted: bool) -> Sequence[str] | None:
    """A training run ended (``interrupted`` on Ctrl-C); ``metrics`` holds the final held-out
    evaluation when there was one. Flush and close here; return lines to show the user."""
