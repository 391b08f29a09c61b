"""The MCP tool agent: a chat loop whose tools are an MCP server's.

Each episode opens a session with the server (:mod:`.server`), hands the model the server's tools
as OpenAI function tools, and loops: one model call, then each tool call it made sent to the
server and its result appended as a ``tool`` message; a reply without tool calls is the final
answer. One conversation, so every prompt extends the last.

What it emits (each lands in the ``outcome`` of the call it follows; ``envs/mcp_tools/plugin.py``
turns them into AIR signals):

* ``mcp_tools`` — after a call that asked for tools: one record per tool call,
  ``{"tool", "ok": True}`` or ``{"tool", "ok": False, "error": "tool_error" | "unknown_tool" |
  "bad_arguments"}``.
* ``answer`` and ``answer_status`` (``"ok"``, or ``"missing"`` when the turns ran out) — after
  the last call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .server import MCPServer, open_tool_session

if TYPE_CHECKING:
    from agentgym_lightning.agent import AgentContext

__all__ = ["DEFAULT_SYSTEM_PROMPT", "MCPAgentConfig", "MCPToolAgent", "task_messages"]

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant with tools. Call a tool when it helps; when you have the answer, "
    "reply with it and no tool call."
)


@dataclass(frozen=True)
class MCPAgentConfig:
    """How the agent runs: its server, system prompt (``None``: none), the most model calls per
    episode, the completion length it asks for (``None``: the policy's default) and how long a
    tool may take."""

    server: MCPServer
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    max_turns: int = 8
    max_tokens: int | None = None
    tool_timeout: float = 30.0


def task_messages(task: Mapping[str, Any], system_prompt: str | None) -> list[dict[str, Any]]:
    """The conversation a task starts: its ``prompt`` (a string, or chat messages as they are),
    after the system prompt (unless the task's messages bring their own)."""
    prompt = task["prompt"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if system_prompt and not any(m.get("role") == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


class MCPToolAgent:
    """``agent(task, ctx)``: run one task with the server's tools; returns the final answer (the
    last reply's text), or ``None`` when the turns ran out first."""

    def __init__(self, config: MCPAgentConfig) -> None:
        if config.max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {config.max_turns}")
        self.config = config

    async def __call__(self, task: Mapping[str, Any], ctx: AgentContext) -> str | None:
        config = self.config
        client = ctx.async_openai_client()
        messages = task_messages(task, config.system_prompt)
        params: dict[str, Any] = {} if config.max_tokens is None else {"max_tokens": config.max_tokens}
        async with open_tool_session(config.server, config.tool_timeout) as session:
            for _ in range(config.max_turns):
                reply = await client.chat.completions.create(model=ctx.model, messages=messages, tools=session.tools, **params)
                message = reply.choices[0].message
                calls = message.tool_calls or []
                messages.append(message.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True))
                if not calls:
                    ctx.emit_variable("answer", message.content or "")
                    ctx.emit_variable("answer_status", "ok")
                    return message.content or ""
                records = []
                for call in calls:
                    result = await session.call(call.function.name, call.function.arguments)
                    record: dict[str, Any] = {"tool": call.function.name, "ok": result.error is None}
                    if result.error is not None:
                        record["error"] = result.error
                    records.append(record)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result.text})
                ctx.emit_variable("mcp_tools", records)
        ctx.emit_variable("answer_status", "missing")
        return None
