"""``lightning/Spider-v0``: text-to-SQL on Spider, one LLM call of the agent per step.

    import gymnasium as gym
    import agentgym_lightning

    env = gym.make("lightning/Spider-v0", split="dev", reward="strict")
    obs, info = env.reset(options={"task_index": 0})
    obs, reward, terminated, truncated, info = env.step("```sql\\nSELECT count(*) FROM singer\\n```")

The episode reward is execution accuracy in the chosen variant (``strict``, the default training
reward, or ``official``, comparable with published numbers; see :mod:`.evaluation`). Both are
recorded per episode in ``trajectory.variables["metrics"]`` (``{"official": 0/1, "strict": 0/1}``)
and in ``trajectory.result``, with each variant's verdict (reason, detail, the shapes of the
prediction's and the gold result), the final prediction's result (shape, columns, first rows) and
the gold result's shape, so a ``mismatch`` can be debugged from the JSONL alone. Without Spider data the env runs on the bundled sample (see
:mod:`.data`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
from collections.abc import Mapping
from typing import Any

from agentgym_lightning.agent import AgentContext
from agentgym_lightning.env import AgentEnv
from agentgym_lightning.envs.tasks import shuffle_tasks, slice_tasks

from .agent import SpiderAgent, SpiderAgentConfig, SpiderAnswer
from .data import load_spider
from .evaluation import VARIANTS, GoldQueryError, SpiderEvaluator
from .langgraph_agent import TRAINED_NODES, LangGraphSpiderAgent
from .sandbox import ExecResult, SandboxLimits, SQLSandbox
from .subset import select_tasks

__all__ = ["ENV_ID", "AGENTS", "make_env", "SpiderEpisodeAgent", "LangGraphSpiderEpisodeAgent", "SpiderReward", "gold_policy", "describe_result"]

ENV_ID = "lightning/Spider-v0"
#: The agents the env can run (``make_env(agent=...)``).
AGENTS = ("scratch", "langgraph")

_AGENT_FIELDS = {f.name for f in dataclasses.fields(SpiderAgentConfig)}


class SpiderEpisodeAgent:
    """The env's agent: the :class:`SpiderAgent`, then both reward variants of its final SQL.

    Judging here (in the agent's worker, after its last LLM call) lets episodes of a batch be
    judged in parallel and puts the metrics on the trajectory. A gold query that fails is not
    the policy's fault: the result carries the error and :class:`SpiderReward` raises on it, so
    the episode ends as an infrastructure failure instead of a zero reward.
    """

    def __init__(self, agent: SpiderAgent, evaluator: SpiderEvaluator) -> None:
        self.agent = agent
        self.evaluator = evaluator

    def __call__(self, task: Mapping[str, Any], ctx: AgentContext) -> dict[str, Any]:
        return self.judge(task, self.agent.solve(task, ctx), ctx)

    def judge(self, task: Mapping[str, Any], answer: SpiderAnswer, ctx: AgentContext) -> dict[str, Any]:
        """Both reward variants of ``answer``, recorded as ``metrics``; the episode's result."""
        # The agent's own run of its final query is the judged one when it ran in the judge's
        # sandbox with the judge's time limit: a query runs once per step, not once more per variant.
        same_run = (
            self.agent.sandbox is self.evaluator.sandbox
            and self.agent.config.sql_timeout_s == self.evaluator.sandbox.limits.timeout_s
        )
        try:
            verdicts = self.evaluator.evaluate_all(
                task["db_path"], answer.sql, task["query"], pred_result=answer.result if same_run else None
            )
        except GoldQueryError as exc:
            return {"sql": answer.sql, "error": str(exc), "prediction": describe_result(answer.result)}
        metrics = {name: v.score for name, v in verdicts.items()}
        ctx.emit_variable("metrics", metrics)
        return {
            "sql": answer.sql,
            **metrics,
            "reasons": {name: v.reason for name, v in verdicts.items()},
            "verdicts": {name: v.to_dict() for name, v in verdicts.items()},
            "prediction": describe_result(answer.result),
            "gold": {"shape": _list_or_none(verdicts[VARIANTS[0]].gold_shape)},
        }


class LangGraphSpiderEpisodeAgent(SpiderEpisodeAgent):
    """The env's agent with ``agent="langgraph"``: the LangGraph graph (:mod:`.langgraph_agent`),
    handed its ``ChatOpenAI`` by the LangChain adapter, run as a task on the shared event loop;
    then judged like the from-scratch agent's answer (in a worker thread: the judge runs SQL)."""

    def __init__(self, agent: LangGraphSpiderAgent, evaluator: SpiderEvaluator) -> None:
        from agentgym_lightning.env import adapt_agent
        from agentgym_lightning.plugins.langchain_adapter import LangChainAgent

        super().__init__(agent, evaluator)  # type: ignore[arg-type]  # same config/sandbox attributes
        self._solve = adapt_agent(LangChainAgent(agent, name="spider-langgraph"))

    async def __call__(self, task: Mapping[str, Any], ctx: AgentContext) -> dict[str, Any]:  # type: ignore[override]
        answer = await self._solve(task, ctx)
        return await asyncio.to_thread(self.judge, task, answer, ctx)


#: Rows of the final prediction's result kept on the trajectory, and characters of each value.
RESULT_ROWS_RECORDED = 5
RESULT_VALUE_CHARS = 200


def describe_result(result: ExecResult | None) -> dict[str, Any] | None:
    """The final prediction's result as recorded on the trajectory: shape, columns, the first
    :data:`RESULT_ROWS_RECORDED` rows (JSON-safe, long values clipped) or the error."""
    if result is None:
        return None
    if not result.ok:
        return {"shape": None, "error": result.error, "message": result.message[:RESULT_VALUE_CHARS]}
    rows = result.rows or []
    return {
        "shape": _list_or_none(result.shape),
        "columns": list(result.column_names),
        "rows": [[_json_value(v) for v in row] for row in rows[:RESULT_ROWS_RECORDED]],
    }


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # JSONL is strict JSON
    if isinstance(value, bytes):
        value = "0x" + value[: RESULT_VALUE_CHARS // 2].hex()
    if isinstance(value, str) and len(value) > RESULT_VALUE_CHARS:
        return value[: RESULT_VALUE_CHARS - 3] + "..."
    return value


def _list_or_none(shape: tuple[int, int] | None) -> list[int] | None:
    return list(shape) if shape is not None else None


class SpiderReward:
    """``reward_fn(task, result)``: the chosen variant's execution accuracy (1.0 or 0.0).

    ``result`` is what :class:`SpiderEpisodeAgent` returns, or plain SQL text (then it is judged
    here, which lets this reward serve any Spider agent).
    """

    def __init__(self, evaluator: SpiderEvaluator, variant: str = "strict") -> None:
        if variant not in VARIANTS:
            raise ValueError(f"unknown Spider reward {variant!r}; choose one of {', '.join(VARIANTS)}")
        self.evaluator = evaluator
        self.variant = variant

    def __call__(self, task: Mapping[str, Any], result: Any) -> float:
        if isinstance(result, Mapping):
            if "error" in result:
                raise GoldQueryError(str(result["error"]))
            if self.variant in result:
                return float(result[self.variant])
            result = result.get("sql")
        sql = result if isinstance(result, str) else None
        return self.evaluator.evaluate(task["db_path"], sql, task["query"], self.variant).score  # type: ignore[arg-type]


_evaluators: dict[SandboxLimits, SpiderEvaluator] = {}
_evaluators_lock = threading.Lock()


def _shared_evaluator(limits: SandboxLimits) -> SpiderEvaluator:
    """One evaluator (gold cache, worker processes) per limits, shared by every env of the
    process: a rollout with 8 envs runs each gold query once, not 8 times."""
    with _evaluators_lock:
        if limits not in _evaluators:
            _evaluators[limits] = SpiderEvaluator(SQLSandbox(limits))
        return _evaluators[limits]


def make_env(
    split: str = "dev",
    data_dir: str | None = None,
    reward: str = "strict",
    air_weights: Mapping[str, float] | None = None,
    max_turns: int = 3,
    *,
    limit: int | None = None,
    offset: int = 0,
    single_table: bool = False,
    max_tables: int | None = None,
    shuffle_seed: int | None = None,
    sql_timeout_s: float = 5.0,
    max_rows: int = 100_000,
    sql_limits: Mapping[str, Any] | None = None,
    agent: str = "scratch",
    **kwargs: Any,
) -> AgentEnv:
    """Build ``lightning/Spider-v0``.

    Args:
        split: ``"dev"`` or ``"train"``.
        data_dir: A Spider folder (else ``$AGENTGYM_LIGHTNING_SPIDER_DIR``, the imported copy, or
            the bundled sample; see :mod:`.data`).
        reward: ``"strict"`` (default, for training) or ``"official"`` (published numbers).
        air_weights: AIR weights, e.g. ``{"spider.exec_error": -0.1, "spider.executes": 0.1}``
            (sources ``spider.no_sql``, ``spider.parse_error``, ``spider.exec_error``,
            ``spider.executes``); AIR is off without them.
        max_turns: Most queries the agent writes per episode (write + rewrites).
        limit: Keep only the first ``limit`` questions of the split (after ``offset``).
        offset: Skip the split's first ``offset`` questions, e.g. to train on one database's
            questions (Spider's train split is grouped by database: ``offset=16, limit=18`` is
            ``farm``'s).
        single_table: Keep only questions whose gold query is one ``SELECT`` over one table
            (:mod:`.subset`; applied before ``shuffle_seed``, ``offset`` and ``limit``).
        max_tables: Keep only questions on databases of at most this many tables (:mod:`.subset`).
        shuffle_seed: Put the (kept) questions in a fixed order drawn from this seed before
            ``offset``/``limit``, so the first N are a sample across databases (None: file order).
        sql_timeout_s: Time limit of each predicted query.
        max_rows: Rows a query may return before it fails.
        sql_limits: Any other :class:`~.sandbox.SandboxLimits` field, e.g.
            ``{"max_result_bytes": 64_000_000}`` (see ``docs/limits.md``).
        agent: ``"scratch"`` (default: :class:`~.agent.SpiderAgent` on the ``openai`` client) or
            ``"langgraph"`` (the same write → check → rewrite loop as a LangGraph graph,
            :mod:`.langgraph_agent`; needs the ``[langchain]`` extra). The LangGraph agent marks no
            call untrainable itself: ``agent_match`` selects the nodes to train, by default
            ``"writer|rewriter"`` (every node with ``train_checker=True``).
        **kwargs: Agent options (any :class:`SpiderAgentConfig` field: ``max_schema_chars``,
            ``max_tokens``, ``temperature``, ``train_checker``...), then
            :class:`~agentgym_lightning.env.AgentEnv` options (``time_limit``, ``transport``,
            ``model_name``...).
    """
    if reward not in VARIANTS:
        raise ValueError(f"unknown Spider reward {reward!r}; choose one of {', '.join(VARIANTS)}")
    if agent == "langgraph":
        from agentgym_lightning.plugins.langchain_adapter import LangChainAgent

        LangChainAgent.check_installed()
    dataset = load_spider(split, data_dir)
    kept = select_tasks(dataset.tasks(), single_table=single_table, max_tables=max_tables)
    if not kept:
        raise ValueError(f"no Spider {split} question passes single_table={single_table}, max_tables={max_tables}")
    tasks = slice_tasks(shuffle_tasks(kept, shuffle_seed), split, offset, limit)
    agent_options = {k: kwargs.pop(k) for k in list(kwargs) if k in _AGENT_FIELDS}
    config = SpiderAgentConfig(max_turns=max_turns, sql_timeout_s=sql_timeout_s, **agent_options)
    try:
        limits = SandboxLimits(**{**dict(sql_limits or {}), "timeout_s": sql_timeout_s, "max_rows": max_rows})
    except TypeError:
        known = ", ".join(f.name for f in dataclasses.fields(SandboxLimits) if f.name not in ("timeout_s", "max_rows"))
        raise ValueError(f"sql_limits {dict(sql_limits or {})} has an unknown field; known: {known}") from None
    evaluator = _shared_evaluator(limits)
    if agent == "scratch":
        episode_agent: SpiderEpisodeAgent = SpiderEpisodeAgent(SpiderAgent(config, evaluator.sandbox), evaluator)
    elif agent == "langgraph":
        episode_agent = LangGraphSpiderEpisodeAgent(LangGraphSpiderAgent(config, evaluator.sandbox), evaluator)
        if not config.train_checker:
            kwargs.setdefault("agent_match", TRAINED_NODES)
    else:
        raise ValueError(f"unknown Spider agent {agent!r}; choose one of {', '.join(AGENTS)}")
    kwargs.setdefault("env_id", ENV_ID)
    # A guard only: the agent itself never makes more than this many calls.
    kwargs.setdefault("max_turns", 2 * max_turns - 1)
    env = AgentEnv(episode_agent, tasks, SpiderReward(evaluator, reward), air_weights=air_weights, **kwargs)
    env.spider_dataset = dataset  # type: ignore[attr-defined]  # for tools: split, source, skipped
    env.spider_evaluator = evaluator  # type: ignore[attr-defined]
    return env


def gold_policy(observation: Any, task: Mapping[str, Any]) -> str:
    """A scripted policy that answers with the gold SQL and accepts it at the check (tests)."""
    metadata = observation.request.metadata
    if (metadata.get("role") or metadata.get("agent")) == "checker":  # the scratch agent names roles, LangGraph's nodes agents
        return "The query answers the question.\nVERDICT: CORRECT"
    return f"```sql\n{task['query']}\n```"
