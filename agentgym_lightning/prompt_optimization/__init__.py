"""Prompt optimization: evolve an agent's resources (its system prompt) with GEPA, scored by the
env's reward, without training the model (``agentgym-lightning optimize-prompt``,
``docs/prompt-optimization.md``).

- :mod:`.optimize`: :func:`optimize_prompt`, the run (splits, seed texts, output files);
- :mod:`.adapter`: GEPA's adapter over an env (a candidate's score is its episodes' return);
- :mod:`.reflection`: the reflection model over any policy (an OpenAI-compatible server);
- :mod:`.candidates`: every candidate and its scores, ``candidates.jsonl``.

Needs the ``optimize`` extra (the ``gepa`` package), imported only when a run starts.
"""

from agentgym_lightning.prompt_optimization.adapter import EpisodeAdapter, episode_score
from agentgym_lightning.prompt_optimization.candidates import CandidateLog
from agentgym_lightning.prompt_optimization.optimize import PromptOptimizationResult, draw_tasks, optimize_prompt, read_seed_texts
from agentgym_lightning.prompt_optimization.reflection import ReflectionFailed, ReflectionModel

__all__ = [
    "optimize_prompt", "PromptOptimizationResult", "draw_tasks", "read_seed_texts", "EpisodeAdapter", "episode_score",
    "CandidateLog", "ReflectionModel", "ReflectionFailed",
]
