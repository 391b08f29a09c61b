"""The multi-hop search agent in the OpenAI Agents SDK, written as the SDK's documentation writes agents.

    env = gym.make("lightning/MuSiQue-v0", agent="openai-agents")

One ``Agent(name="searcher")`` with one ``@function_tool`` ``search(query)``, run by
``Runner.run`` for at most ``max_turns`` model calls; its ``final_output`` is the reply that holds
``Answer: <short answer>``. The model is the Agents SDK ``Model`` the adapter hands in
(``plugins/openai_agents_adapter.py``). Instructions, results format and the emitted signals
(``action``, ``queries``, ``retrieved``, ``new_supporting``... then ``answer``,
``answer_status``) are the from-scratch agent's (:mod:`.agent`), so its AIR plugin and reward
apply unchanged, and so is the "no searches left" line after the results the model reads
before its last call (a ``RunHooks.on_llm_end`` counts the calls; the tool sees its call id).
What the SDK does its own way: there is no ``Search:`` text protocol; a run that is still
searching when its turns run out ends with ``answer_status="missing"`` (the SDK's
``MaxTurnsExceeded``); a call of a tool the agent does not have ends it with no answer,
``action="bad_tool_call"`` and ``answer_status="malformed"`` (the SDK's ``ModelBehaviorError``,
where the from-scratch agent would have told the model and gone on). Tool arguments the SDK
cannot read are read as the from-scratch agent reads them, and an error of the index itself ends
the episode with its message (the SDK's default ``failure_error_function`` would tell the model
only "An error occurred while running the tool" in both cases). The worked examples
(``examples=N``) are the run's input items (the SDK's way to seed a conversation:
``function_call`` and ``function_call_output`` items), so the model sees the from-scratch
agent's ``tools`` conversation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from agentgym_lightning.agent import emit_variable

try:  # at module level: the SDK reads the tool's type hints from this module's globals
    from agents.tool_context import ToolContext
except ImportError:  # no [openai-agents] extra: make_env refuses this agent before it runs
    ToolContext = Any  # type: ignore[assignment,misc]

from .agent import (
    EXAMPLES,
    LAST_CALL,
    SEARCH_TOOL,
    SYSTEM_TOOLS,
    USER,
    RagAgent,
    RagAgentConfig,
    Search,
    _final_answer,
    _query_argument,
    parse_reply,
)

__all__ = ["AgentsSDKRagAgent", "example_items"]


def example_items(examples: int) -> list[dict[str, Any]]:
    """The first ``examples`` worked examples (:data:`~.agent.EXAMPLES`) as Agents SDK input items:
    the question, a ``function_call`` and its ``function_call_output`` per search, the answer."""
    items: list[dict[str, Any]] = []
    for i, (question, searches, answer) in enumerate(EXAMPLES[:examples]):
        items.append({"role": "user", "content": USER.format(question=question)})
        for j, (query, results) in enumerate(searches):
            call_id = f"call_example_{i}_{j}"
            items.append({"type": "function_call", "call_id": call_id, "name": "search", "arguments": json.dumps({"query": query})})
            items.append({"type": "function_call_output", "call_id": call_id, "output": results})
        items.append({"role": "assistant", "content": f"Answer: {answer}"})
    return items


class AgentsSDKRagAgent:
    """``async agent(task, model) -> result``: the same result dict as :class:`~.agent.RagAgent`'s."""

    def __init__(self, search: Search, config: RagAgentConfig | None = None) -> None:
        self.config = config or RagAgentConfig()
        # The from-scratch agent's pieces: search + format results, and the search signals.
        self._pieces = RagAgent(search, self.config)

    async def __call__(self, task: Mapping[str, Any], model: Any) -> dict[str, Any]:
        from agents import Agent, MaxTurnsExceeded, ModelBehaviorError, ModelSettings, Runner, RunHooks, function_tool

        cfg, pieces = self.config, self._pieces
        supporting = set(task.get("supporting_ids") or [])
        seen: set[str] = set()
        retrieved: list[str] = []
        found: set[str] = set()

        class LastCallNotice(RunHooks):
            """Finds the tool call whose result the model reads just before its last call."""

            calls = 0
            call_id: str | None = None

            async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
                self.calls += 1
                if self.calls == cfg.max_turns - 1:
                    ids = [item.call_id for item in response.output if getattr(item, "type", None) == "function_call"]
                    # The from-scratch agent adds the line to the last result of the call.
                    self.call_id = ids[-1] if ids else None

        notice = LastCallNotice()

        async def run_search(ctx: ToolContext[Any], query: str) -> str:
            text = await asyncio.to_thread(pieces._results, query, retrieved)
            pieces._emit_search(emit_variable, [query], seen, retrieved, found, supporting)
            if notice.call_id is not None and ctx.tool_call_id == notice.call_id:
                text += "\n\n" + LAST_CALL
            return text

        async def on_tool_error(ctx: Any, error: Exception) -> str:
            """Arguments the SDK could not read are the model's doing: read them as the
            from-scratch agent does (an empty query if nothing is usable) and answer. Any other
            error (the index failing) is not the model's: it ends the episode with its message,
            where the SDK's default would have told the model "An error occurred" and gone on."""
            if isinstance(error, ModelBehaviorError) and isinstance(ctx, ToolContext):
                return await run_search(ctx, _query_argument(ctx.tool_arguments))
            raise error

        @function_tool(name_override="search", description_override=SEARCH_TOOL["function"]["description"],
                       failure_error_function=on_tool_error)
        async def search(ctx: ToolContext[Any], query: str) -> str:
            """Search the passages.

            Args:
                query: what to look for
            """
            return await run_search(ctx, query)

        searcher = Agent(
            name="searcher",
            instructions=SYSTEM_TOOLS,
            tools=[search],
            model=model,
            model_settings=ModelSettings(max_tokens=cfg.max_tokens, temperature=cfg.temperature),
        )
        try:
            question = USER.format(question=task["question"])
            run_input: Any = [*example_items(cfg.examples), {"role": "user", "content": question}] if cfg.examples else question
            result = await Runner.run(searcher, run_input, max_turns=cfg.max_turns, hooks=notice)
        except MaxTurnsExceeded:
            emit_variable("answer_status", "missing")
            return RagAgent._result(None, "missing", cfg.max_turns, retrieved, found, supporting)
        except ModelBehaviorError as error:
            # The model called a tool the agent does not have: the SDK ends the run. That is the
            # model's doing (an answer it did not give), not a broken episode.
            # run_data holds the responses before the one that failed.
            calls = len(error.run_data.raw_responses) + 1 if error.run_data is not None else 1
            emit_variable("action", "bad_tool_call")
            emit_variable("answer_status", "malformed")
            return RagAgent._result(None, "malformed", calls, retrieved, found, supporting)
        answer, status = _final_answer(parse_reply(str(result.final_output or "")))
        emit_variable("action", "answer")
        emit_variable("answer", answer)
        emit_variable("answer_status", status)
        return RagAgent._result(answer, status, len(result.raw_responses), retrieved, found, supporting)
