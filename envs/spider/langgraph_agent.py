"""The Spider agent in LangGraph: the paper's write → check → rewrite graph, written as LangGraph's
documentation writes graphs.

    env = gym.make("lightning/Spider-v0", agent="langgraph")

Nodes ``writer``, ``execute``, ``checker``, ``rewriter``; the model is the ``ChatOpenAI`` the
LangChain adapter hands in (``plugins/langchain_adapter.py``), and the graph itself marks nothing
as trainable: the env selects the calls to train by the nodes that made them
(``agent_match="writer|rewriter"`` by default, as in the paper: the checker's calls are answered
and recorded but not trained). The prompts, the SQL sandbox and the emitted variables (``sql``,
``sql_status``, ``sql_error``, ``check``) are the from-scratch agent's (:mod:`.agent`), so its AIR
plugin and reward apply unchanged and the two agents can be compared call for call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, TypedDict

from agentgym_lightning.agent import emit_variable, read_resource

from .agent import (
    CHECKER_USER,
    REWRITER_USER,
    SYSTEM_PROMPT_RESOURCE,
    WRITER_SYSTEM,
    WRITER_USER,
    SpiderAgentConfig,
    SpiderAnswer,
    _clip,
    classify_sql,
    format_result,
    parse_verdict,
    writer_system,
)
from .sandbox import ExecResult, SQLSandbox
from .schema import describe_database
from .sqltext import extract_sql

__all__ = ["SQLState", "build_sql_graph", "LangGraphSpiderAgent", "TRAINED_NODES"]

#: The nodes whose calls are trained by default (the paper's choice).
TRAINED_NODES = "writer|rewriter"


class SQLState(TypedDict, total=False):
    """The graph's state."""

    question: str
    db_path: str
    schema: str
    reply: str  # the last writer/rewriter reply
    sql: str | None  # the query under consideration
    result: ExecResult | None  # its result
    feedback: str | None  # why it needs a rewrite (None: it runs, the checker decides)
    final_sql: str
    final_result: ExecResult | None
    queries: int  # queries written so far
    done: bool


def build_sql_graph(llm: Any, sandbox: SQLSandbox, config: SpiderAgentConfig | None = None) -> Any:
    """The compiled ``StateGraph``: ``writer → execute → (checker →) rewriter → execute → ...``."""
    from langchain_core.messages import HumanMessage, SystemMessage
    from langgraph.graph import END, START, StateGraph

    cfg = config or SpiderAgentConfig()
    options: dict[str, Any] = {}
    if cfg.max_tokens is not None:
        options["max_tokens"] = cfg.max_tokens
    if cfg.temperature is not None:
        options["temperature"] = cfg.temperature
    model = llm.bind(**options) if options else llm

    def system(schema: str) -> str:
        # The episode's system_prompt resource when the env has one (the graph sees only its model).
        return writer_system(read_resource(SYSTEM_PROMPT_RESOURCE, default=WRITER_SYSTEM), schema)

    def shown(result: ExecResult | None) -> str:
        return format_result(result, cfg.result_rows_shown, cfg.max_shown_chars) if result is not None else "(not run)"

    async def writer(state: SQLState) -> SQLState:
        reply = await model.ainvoke([
            SystemMessage(system(state["schema"])),
            HumanMessage(WRITER_USER.format(question=state["question"])),
        ])
        return {"reply": str(reply.content or ""), "queries": 1}

    async def execute(state: SQLState) -> SQLState:
        new_sql = extract_sql(state["reply"])
        result = await asyncio.to_thread(sandbox.run, state["db_path"], new_sql, timeout_s=cfg.sql_timeout_s) if new_sql else None
        emit_variable("sql", new_sql or "")
        emit_variable("sql_status", classify_sql(new_sql, result))
        emit_variable("sql_error", f"{result.error}: {result.message}" if result is not None and not result.ok else "")
        update: SQLState = {}
        if new_sql:  # a rewrite without SQL keeps the previous query
            update = {"sql": new_sql, "result": result, "final_sql": new_sql, "final_result": result}
        sql, ran = new_sql or state.get("sql"), result if new_sql else state.get("result")
        if not sql:
            update["feedback"] = "The reply contained no SQL query; answer with a query in a ```sql code block."
        elif ran is None or not ran.ok:
            # It did not run: that is the check's answer already, no checker call needed.
            update["feedback"] = "The query failed to run; fix the error."
        else:
            update["feedback"] = None  # it runs: the checker judges it
        return update

    async def checker(state: SQLState) -> SQLState:
        reply = await model.ainvoke([HumanMessage(CHECKER_USER.format(
            schema=state["schema"], question=state["question"], sql=_clip(state["sql"] or "", cfg.max_shown_chars),
            result=shown(state.get("result"))))])
        text = str(reply.content or "")
        correct = parse_verdict(text)
        emit_variable("check", "correct" if correct else "incorrect")
        feedback = _clip(text.strip(), cfg.max_shown_chars) or "The query does not answer the question."
        return {"done": correct, "feedback": feedback}

    async def rewriter(state: SQLState) -> SQLState:
        sql = state.get("sql")
        reply = await model.ainvoke([
            SystemMessage(system(state["schema"])),
            HumanMessage(REWRITER_USER.format(
                question=state["question"], sql=_clip(sql, cfg.max_shown_chars) if sql else "(none)",
                result=shown(state.get("result")), feedback=state.get("feedback", ""))),
        ])
        return {"reply": str(reply.content or ""), "queries": state.get("queries", 0) + 1}

    def after_execute(state: SQLState) -> str:
        if state.get("queries", 0) >= cfg.max_turns:
            return END
        return "checker" if state.get("feedback") is None else "rewriter"

    def after_check(state: SQLState) -> str:
        return END if state.get("done") else "rewriter"

    graph = StateGraph(SQLState)
    graph.add_node("writer", writer)
    graph.add_node("execute", execute)
    graph.add_node("checker", checker)
    graph.add_node("rewriter", rewriter)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "execute")
    graph.add_conditional_edges("execute", after_execute, ["checker", "rewriter", END])
    graph.add_conditional_edges("checker", after_check, ["rewriter", END])
    graph.add_edge("rewriter", "execute")
    return graph.compile()


class LangGraphSpiderAgent:
    """``async agent(task, llm) -> SpiderAnswer``: the graph on one Spider task (``question``, ``db_path``)."""

    def __init__(self, config: SpiderAgentConfig | None = None, sandbox: SQLSandbox | None = None) -> None:
        self.config = config or SpiderAgentConfig()
        self.sandbox = sandbox or SQLSandbox()

    async def __call__(self, task: Mapping[str, Any], llm: Any) -> SpiderAnswer:
        cfg = self.config
        db_path = str(task["db_path"])
        schema = await asyncio.to_thread(describe_database, db_path, max_chars=cfg.max_schema_chars, sample_rows=cfg.sample_rows)
        graph = build_sql_graph(llm, self.sandbox, cfg)
        # Each query costs at most execute + checker + rewriter: keep LangGraph's own step limit clear of ours.
        state = await graph.ainvoke(
            {"question": str(task["question"]), "db_path": db_path, "schema": schema, "final_sql": "", "final_result": None},
            {"recursion_limit": 4 * cfg.max_turns + 4},
        )
        return SpiderAnswer(state.get("final_sql") or "", state.get("final_result"))
