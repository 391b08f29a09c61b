"""agentgym-lightning: train any LLM agent with reinforcement learning.

Every agent becomes a Gymnasium environment whose ``step(action)`` is exactly one LLM call::

    import gymnasium as gym
    import agentgym_lightning  # registers the lightning/... ids

    env = gym.make("lightning/GuessNumber-v0")
    obs, info = env.reset(seed=0)

What a user needs is importable from here, as from TRL or Gymnasium::

    from agentgym_lightning import AgentEnv, LightningRLConfig, LightningRLTrainer, evaluate, make_policy, rollout

The names in :data:`__all__` are the public API. The light ones (the data model, the agent's
side) load with the package; the rest (the env, the drivers, the trainers, the judge, the
conformance kit, the framework adapters) load on first use (PEP 562), so ``import
agentgym_lightning`` stays as light as it was. A module that moved (``agentgym_lightning.rollout``,
``agentgym_lightning.conformance``, ...) is not aliased: importing it raises a
:class:`ModuleNotFoundError` that says where it lives now.

Importing it before torch makes torch's idle OpenMP threads sleep rather than spin
(``OMP_WAIT_POLICY=PASSIVE``, unless set already: :mod:`agentgym_lightning.cpu_threads`).
"""

from __future__ import annotations

__version__ = "0.1.0"

# Before anything here can import torch: OpenMP reads its wait policy once, when torch loads it.
from agentgym_lightning.cpu_threads import sleeping_cpu_threads as _sleeping_cpu_threads

_sleeping_cpu_threads()

import importlib as _importlib  # noqa: E402
import sys as _sys  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

from agentgym_lightning.agent import AgentContext, emit_reward, emit_variable, read_resource  # noqa: E402
from agentgym_lightning.hookspecs import hookimpl  # noqa: E402
from agentgym_lightning.llm import ChatRequest, Completion, SamplingParams, ToolCall  # noqa: E402
from agentgym_lightning.resources import Resource  # noqa: E402
from agentgym_lightning.trajectory import (  # noqa: E402
    Reward,
    Status,
    Step,
    Trajectory,
    TrajectoryWriter,
    load_trajectories,
    save_trajectories,
)

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from agentgym_lightning.env import AgentEnv
    from agentgym_lightning.judge import GroupJudge, JudgeConfig
    from agentgym_lightning.plugins.autogen_adapter import AutoGenAgent
    from agentgym_lightning.plugins.langchain_adapter import LangChainAgent
    from agentgym_lightning.plugins.openai_agents_adapter import OpenAIAgentsAgent
    from agentgym_lightning.policies import Policy, make_policy
    from agentgym_lightning.rollouts.evaluation import EvalResult, evaluate
    from agentgym_lightning.rollouts.http_agents import StandaloneGateway
    from agentgym_lightning.rollouts.in_process import RolloutStream, iter_rollout, rollout
    from agentgym_lightning.rollouts.ray_workers import RayRolloutRunner
    from agentgym_lightning.testing.conformance import ConformanceReport, check_agent, no_network, scripted_policy
    from agentgym_lightning.training import LightningRLConfig, LightningRLTrainer, TrainResult
    from agentgym_lightning.training.sft import SFTConfig, SFTTrainer

#: Public name -> the module that defines it, imported on first access (they pull in gymnasium's
#: env machinery, torch, ray or a framework; the package's own import must not).
_LAZY: dict[str, str] = {
    # the environment
    "AgentEnv": "agentgym_lightning.env",
    # policies
    "Policy": "agentgym_lightning.policies",
    "make_policy": "agentgym_lightning.policies",
    # rollouts and evaluation
    "rollout": "agentgym_lightning.rollouts.in_process",
    "iter_rollout": "agentgym_lightning.rollouts.in_process",
    "RolloutStream": "agentgym_lightning.rollouts.in_process",
    "evaluate": "agentgym_lightning.rollouts.evaluation",
    "EvalResult": "agentgym_lightning.rollouts.evaluation",
    "RayRolloutRunner": "agentgym_lightning.rollouts.ray_workers",
    "StandaloneGateway": "agentgym_lightning.rollouts.http_agents",
    # training
    "LightningRLConfig": "agentgym_lightning.training",
    "LightningRLTrainer": "agentgym_lightning.training",
    "TrainResult": "agentgym_lightning.training",
    "SFTConfig": "agentgym_lightning.training.sft",
    "SFTTrainer": "agentgym_lightning.training.sft",
    # the LLM judge
    "JudgeConfig": "agentgym_lightning.judge",
    "GroupJudge": "agentgym_lightning.judge",
    # framework adapters (each imports its framework only when an agent runs)
    "LangChainAgent": "agentgym_lightning.plugins.langchain_adapter",
    "OpenAIAgentsAgent": "agentgym_lightning.plugins.openai_agents_adapter",
    "AutoGenAgent": "agentgym_lightning.plugins.autogen_adapter",
    # the conformance kit, for adapter and agent authors
    "check_agent": "agentgym_lightning.testing.conformance",
    "ConformanceReport": "agentgym_lightning.testing.conformance",
    "no_network": "agentgym_lightning.testing.conformance",
    "scripted_policy": "agentgym_lightning.testing.conformance",
}

__all__ = [
    "__version__",
    "AgentContext",
    "ChatRequest",
    "Completion",
    "Resource",
    "Reward",
    "SamplingParams",
    "Status",
    "Step",
    "ToolCall",
    "Trajectory",
    "TrajectoryWriter",
    "emit_reward",
    "emit_variable",
    "hookimpl",
    "load_trajectories",
    "read_resource",
    "save_trajectories",
    # lazy (_LAZY): written out, so that linters and IDEs see the public names
    "AgentEnv",
    "Policy",
    "make_policy",
    "rollout",
    "iter_rollout",
    "RolloutStream",
    "evaluate",
    "EvalResult",
    "RayRolloutRunner",
    "StandaloneGateway",
    "LightningRLConfig",
    "LightningRLTrainer",
    "TrainResult",
    "SFTConfig",
    "SFTTrainer",
    "JudgeConfig",
    "GroupJudge",
    "LangChainAgent",
    "OpenAIAgentsAgent",
    "AutoGenAgent",
    "check_agent",
    "ConformanceReport",
    "no_network",
    "scripted_policy",
]


def __getattr__(name: str) -> Any:
    """A lazy public name (:data:`_LAZY`), imported on first access and kept."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


#: Modules that moved, and where their names live now (the package keeps no alias modules).
MOVED_MODULES: dict[str, str] = {
    "agentgym_lightning.rollout": (
        "agentgym_lightning.rollouts.in_process; import `rollout`, `iter_rollout` and `RolloutStream` "
        "from agentgym_lightning"
    ),
    "agentgym_lightning.ray_rollout": "agentgym_lightning.rollouts.ray_workers; import `RayRolloutRunner` from agentgym_lightning",
    "agentgym_lightning.eval": (
        "agentgym_lightning.commands.eval (the command); import `evaluate` from agentgym_lightning"
    ),
    "agentgym_lightning.conformance": (
        "agentgym_lightning.testing.conformance; import `check_agent`, `ConformanceReport`, `no_network` "
        "and `scripted_policy` from agentgym_lightning"
    ),
    "agentgym_lightning.pytest_plugin": (
        'agentgym_lightning.testing.pytest_plugin; write pytest_plugins = ["agentgym_lightning.testing.pytest_plugin"]'
    ),
    "agentgym_lightning.gateway.standalone": (
        "agentgym_lightning.rollouts.http_agents; import `StandaloneGateway` from agentgym_lightning"
    ),
    "agentgym_lightning.gateway.background_loop": "agentgym_lightning.background_loop",
    "agentgym_lightning.policies.openai_server": "agentgym_lightning.policies.openai",
    "agentgym_lightning.policies.openai_mock": "agentgym_lightning.testing.mock_openai_server",
    "agentgym_lightning.training.remote_rollouts": "agentgym_lightning.rollouts.served_policy",
    "agentgym_lightning.training.async_rollouts": "agentgym_lightning.rollouts.async_rollouts",
    "agentgym_lightning.training.schedule": "agentgym_lightning.rollouts.schedule",
    "agentgym_lightning.plugins.math_air": "agentgym_lightning.envs.math.plugin",
    "agentgym_lightning.plugins.rag_air": "agentgym_lightning.envs.rag.plugin",
    "agentgym_lightning.plugins.spider_air": "agentgym_lightning.envs.spider.plugin",
}


class _MovedModuleFinder:
    """Last on ``sys.meta_path``: an import of a moved module fails saying where it lives now.

    It is asked only after every other finder found nothing, so it costs a dict lookup on a
    failed import and nothing on any other.
    """

    @staticmethod
    def find_spec(fullname: str, path: object = None, target: object = None) -> None:
        if fullname in MOVED_MODULES:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: it moved to {MOVED_MODULES[fullname]}", name=fullname
            )
        return None


if not any(type(finder).__name__ == "_MovedModuleFinder" for finder in _sys.meta_path):
    _sys.meta_path.append(_MovedModuleFinder())

from agentgym_lightning.registration import register_envs as _register_envs  # noqa: E402

_register_envs()
