"""agentgym-lightning: train any LLM agent with reinforcement learning.

Every agent becomes a Gymnasium environment whose ``step(action)`` is exactly one LLM call::

    import gymnasium as gym
    import agentgym_lightning  # registers the lightning/... ids

    env = gym.make("lightning/GuessNumber-v0")
    obs, info = env.reset(seed=0)

Importing it before torch makes torch's idle OpenMP threads sleep rather than spin
(``OMP_WAIT_POLICY=PASSIVE``, unless set already: :mod:`agentgym_lightning.cpu_threads`).
"""

from __future__ import annotations

__version__ = "0.1.0"

# Before anything here can import torch: OpenMP reads its wait policy once, when torch loads it.
from agentgym_lightning.cpu_threads import sleeping_cpu_threads as _sleeping_cpu_threads

_sleeping_cpu_threads()

from agentgym_lightning.agent import AgentContext, emit_reward, emit_variable, read_resource
from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.llm import ChatRequest, Completion, SamplingParams, ToolCall
from agentgym_lightning.resources import Resource
from agentgym_lightning.trajectory import (
    Reward,
    Status,
    Step,
    Trajectory,
    TrajectoryWriter,
    load_trajectories,
    save_trajectories,
)

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
]

from agentgym_lightning.registration import register_envs as _register_envs

_register_envs()
