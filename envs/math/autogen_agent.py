"""The calculator agent in AutoGen AgentChat, written as AutoGen's documentation writes agents.

    env = gym.make("lightning/GSM8K-v0", agent="autogen")

One ``AssistantAgent("solver")`` with the calculator as a tool (a plain ``async`` function AutoGen
wraps in a ``FunctionTool``), ``reflect_on_tool_use=True`` so that it answers after reading the
results, and up to ``max_turns - 1`` tool rounds (``max_tool_iterations``): at most ``max_turns``
model calls, as the from-scratch agent. The worked examples (:data:`~.agent.EXAMPLES`) are the
agent's ``model_context`` history (AutoGen's way to seed a conversation), so the model sees the
from-scratch agent's ``tools``-protocol conversation. The model client is the AutoGen
``OpenAIChatCompletionClient`` the adapter hands in (``plugins/autogen_adapter.py``).

Signals, as the from-scratch agent's (so ``envs/math/plugin.py`` and the reward apply unchanged):
``calculator`` after each calculation (``[record]``; when one reply makes several calls at once,
the step keeps the last one's: the tool cannot see which reply it belongs to), then
``answer``, ``answer_status`` and ``calculator_calls``. AutoGen calls tools natively only: the
text protocol is the from-scratch agent's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agentgym_lightning.agent import emit_variable, read_resource

from .agent import (
    CALCULATOR_TOOL,
    EXAMPLES,
    SYSTEM_PROMPT_RESOURCE,
    AgentResult,
    MathAgentConfig,
    _tool_text,
    run_tool_call,
    trace_tool_record,
)
from .answers import ExtractedAnswer, extract_answer

__all__ = ["AutoGenMathAgent"]


def _example_context(config: MathAgentConfig) -> list[Any]:
    """The worked examples as AutoGen messages: question, calculator call, its result, answer."""
    from autogen_core import FunctionCall
    from autogen_core.models import AssistantMessage, FunctionExecutionResult, FunctionExecutionResultMessage, UserMessage

    messages: list[Any] = []
    for i, (question, expression, result) in enumerate(EXAMPLES[: config.examples]):
        call_id = f"call_example_{i}"
        messages += [
            UserMessage(content=config.user_template.format(question=question), source="user"),
            AssistantMessage(content=[FunctionCall(id=call_id, name="calculator", arguments=json.dumps({"expression": expression}))],
                             source="solver"),
            FunctionExecutionResultMessage(content=[FunctionExecutionResult(content=result, name="calculator", call_id=call_id)]),
            AssistantMessage(content=f"Answer: {result}", source="solver"),
        ]
    return messages


class AutoGenMathAgent:
    """``async agent(task, model_client) -> AgentResult`` (the from-scratch agent's result)."""

    def __init__(self, config: MathAgentConfig | None = None) -> None:
        self.config = config or MathAgentConfig()

    async def __call__(self, task: Mapping[str, Any], model_client: Any) -> AgentResult:
        from autogen_agentchat.agents import AssistantAgent
        from autogen_agentchat.messages import TextMessage
        from autogen_core.model_context import UnboundedChatCompletionContext

        cfg = self.config
        records: list[dict[str, Any]] = []

        async def calculator(expression: str) -> str:
            record = run_tool_call("calculator", {"expression": expression}, cfg.calculator)
            trace_tool_record(record)  # on AutoGen's own execute_tool span: a failure is otel.tool_error
            records.append(record)
            emit_variable("calculator", [record])
            return _tool_text(record)

        calculator.__doc__ = CALCULATOR_TOOL["function"]["description"]
        solver = AssistantAgent(
            "solver",
            model_client=model_client,
            tools=[calculator],
            # The episode's system_prompt resource when the env has one (the adapter hands us only
            # the model client: read it from the running episode).
            system_message=read_resource(SYSTEM_PROMPT_RESOURCE, default=cfg.system_prompt),
            model_context=UnboundedChatCompletionContext(initial_messages=_example_context(cfg)),
            reflect_on_tool_use=True,
            max_tool_iterations=max(1, cfg.max_turns - 1),
        )
        result = await solver.run(task=cfg.user_template.format(question=str(task["question"])))
        final = result.messages[-1] if result.messages else None
        reply = final.content if isinstance(final, TextMessage) else ""
        turns = sum(1 for m in result.messages if getattr(m, "models_usage", None) is not None)
        found = extract_answer(reply, require_marker=cfg.require_marker) if reply else ExtractedAnswer(None, "missing")
        errors = sum(1 for r in records if "error" in r)
        emit_variable("answer", found.text)
        emit_variable("answer_status", found.status)
        emit_variable("calculator_calls", len(records))
        return AgentResult(answer=found.text, answer_status=found.status, calculator_calls=len(records),
                           calculator_errors=errors, turns=turns)
