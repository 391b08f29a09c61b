"""The multi-hop search agent in the OpenAI Agents SDK, written as the SDK's documentation writes agents.

    env = gym.make("lightning/MuSiQue-v0", agent="openai-agents")

One ``Agent(name="searcher")`` with one ``@function_tool`` ``search(query)``, run by
``Runner.run`` for at most ``max_turns`` model calls; its ``final_output`` is the reply that holds
``Answer: <short answer>``. The model is the Agents SDK ``Model`` the adapter hands in
(``plugins/openai_agents_adapter.py``). Instructions, results format and the emitted signals
(``action``, ``queries``, ``retrieved``, ``new_supporting``... then ``answer``,
``answer_status``) are the from-scratch agent's (:mod:`.agent`), so its AIR plugin and reward
apply unchanged. What the SDK does its own way: there is no ``Search:`` text protocol and no
"no searches left" nudge on the last call (a run that is still searching when its turns run out
ends with ``answer_status="missing"``, the SDK's ``MaxTurnsExceeded``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from agentgym_lightning.agent import emit_variable

from .agent import SEARCH_TOOL, SYSTEM_TOOLS, USER, RagAgent, RagAgentConfig, Search, _final_answer, parse_reply

__all__ = ["AgentsSDKRagAgent"]


class AgentsSDKRagAgent:
    """``async agent(task, model) -> result``: the same result dict as :class:`~.agent.RagAgent`'s."""

    def __init__(self, search: Search, config: RagAgentConfig | None = None) -> None:
        self.config = config or RagAgentConfig()
        # The from-scratch agent's pieces: search + format results, and the search signals.
        self._pieces = RagAgent(search, self.config)

    async def __call__(self, task: Mapping[str, Any], model: Any) -> dict[str, Any]:
        from agents import Agent, MaxTurnsExceeded, ModelSettings, Runner, function_tool

        cfg, pieces = self.config, self._pieces
        supporting = set(task.get("supporting_ids") or [])
        seen: set[str] = set()
        retrieved: list[str] = []
        found: set[str] = set()

        @function_tool(name_override="search", description_override=SEARCH_TOOL["function"]["description"])
        async def search(query: str) -> str:
            """Search the passages.

            Args:
                query: what to look for
            """
            text = await asyncio.to_thread(pieces._results, query, retrieved)
            pieces._emit_search(emit_variable, [query], seen, retrieved, found, supporting)
            return text

        searcher = Agent(
            name="searcher",
            instructions=SYSTEM_TOOLS,
            tools=[search],
            model=model,
            model_settings=ModelSettings(max_tokens=cfg.max_tokens, temperature=cfg.temperature),
        )
        try:
            result = await Runner.run(searcher, USER.format(question=task["question"]), max_turns=cfg.max_turns)
        except MaxTurnsExceeded:
            emit_variable("answer_status", "missing")
            return RagAgent._result(None, "missing", cfg.max_turns, retrieved, found, supporting)
        answer, status = _final_answer(parse_reply(str(result.final_output or "")))
        emit_variable("action", "answer")
        emit_variable("answer", answer)
        emit_variable("answer_status", status)
        return RagAgent._result(answer, status, len(result.raw_responses), retrieved, found, supporting)
