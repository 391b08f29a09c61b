"""A math agent with a calculator tool, written from scratch on the ``openai`` client.

The model reads the question (after ``examples`` worked examples in the same format, as real
turns of the conversation), calls ``calculator`` as often as it likes, reads each result, and
ends with a reply that holds the final answer (``Answer: <number>``; see :mod:`.answers` for
what else is accepted). It is one conversation: every call sends the previous call's messages
plus the assistant's reply and the tool results appended to them, so each prompt extends the
last and a trainer can merge the episode into one sequence. Every call is trainable
(``metadata={"role": "solver", "trainable": "true"}``). At most ``max_turns`` calls.

Two protocols (``MathAgentConfig.protocol``):

``tools`` (default)
    An OpenAI tool: the request carries ``tools=[CALCULATOR_TOOL]``, the model answers with
    ``tool_calls``, each result goes back as a ``{"role": "tool", "tool_call_id": ...}`` message.
    Backends whose chat template has no tools (SmolLM2's, through ``hf``/``vllm``) render the
    tool into the system prompt and parse ``<tool_call>{"name": "calculator", "arguments":
    {"expression": "12 * 7"}}</tool_call>`` out of the model's text
    (:mod:`agentgym_lightning.policies.tool_calls`).

``text``
    For servers that take no ``tools`` (``vllm serve`` without ``--enable-auto-tool-choice``), and
    for small models: the agent describes the tool in its own system prompt, reads
    ``<tool_call>{"name": "calculator", "arguments": {"expression": ...}}</tool_call>`` blocks
    from the reply itself, appends the reply verbatim as the assistant message and the results as
    one user message of ``<tool_response>`` blocks. The call format, the examples and the results
    look exactly as under ``tools`` through the ``hf`` backend; what differs is the description:
    ``tool_description="compact"`` (default) is one sentence, ``"full"`` is the generic tools
    preamble the ``hf`` backend writes
    (:func:`~agentgym_lightning.policies.tool_calls.render_tools_system_prompt`; then the two
    protocols show the model the very same tokens). With SmolLM2 the compact prompt is ~120
    tokens shorter, and the verbatim reply keeps the next prompt an extension of the last one
    even when the model writes its JSON in another layout (the ``hf`` backend re-renders
    ``tool_calls`` canonically). Text re-tokenizes, though: when the model's own token split of
    its reply is not the tokenizer's (``"}`` + ``}`` for ``"`` + ``}}``), the ids still differ.

What the agent emits (semantic variables; each lands in the ``outcome`` of the call it follows):

* ``calculator`` — after a call that asked for calculations: one record per call,
  ``{"expression", "result"}`` or ``{"expression", "error", "message"}``. A ``<tool_call>``
  block that could not be read, a tool other than ``calculator`` and missing arguments are
  errors too (``error``: ``malformed``, ``unknown_tool``, ``bad_arguments``); the model is told
  what went wrong and may try again.
* ``answer``, ``answer_status`` (``ok``, ``unparsable``, ``missing``) and ``calculator_calls``
  (calls in the whole episode) — after the last call (also when turns ran out).

``envs/math/plugin.py`` turns these into AIR signals.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentgym_lightning.policies.tool_calls import (
    TOOL_CALL_OPEN,
    format_tool_call,
    new_tool_call_id,
    parse_tool_calls,
    render_tool_result,
    render_tools_system_prompt,
)

from .answers import ExtractedAnswer, extract_answer
from .calculator import CalculatorLimits, calculate

try:  # the agent traces its tools when OpenTelemetry is installed (the `tracing` extra)
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover
    _trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    import openai

    from agentgym_lightning.agent import AgentContext

__all__ = [
    "CALCULATOR_TOOL",
    "PROTOCOLS",
    "SYSTEM_PROMPT",
    "SYSTEM_PROMPT_RESOURCE",
    "EXAMPLES",
    "COMPACT_TOOL_PROMPT",
    "MathAgentConfig",
    "MathAgent",
    "AgentResult",
    "run_tool_call",
    "traced_tool_call",
]

PROTOCOLS: tuple[str, ...] = ("tools", "text")

#: The tool, as an OpenAI function. Short on purpose: backends without native tools put all of
#: it into every prompt.
CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Compute an arithmetic expression, e.g. 12 * (3 + 4).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

SYSTEM_PROMPT = "Use the calculator for every calculation. When you know the result, reply: Answer: <number>"

#: The resource the agents read their instructions from (``ctx.resource``;
#: :mod:`agentgym_lightning.resources`), ``MathAgentConfig.system_prompt`` when the env has none:
#: ``gym.make(id, resources={"system_prompt": "..."})``, ``train --resource system_prompt=@FILE``.
SYSTEM_PROMPT_RESOURCE = "system_prompt"

#: The text protocol's compact tool description (``tool_description="compact"``).
COMPACT_TOOL_PROMPT = (
    'To use the calculator, write <tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call> '
    "and its result comes back in <tool_response></tool_response>."
)

#: Worked examples shown before the question as real turns of the conversation (question,
#: calculator call, result, answer): ``(question, expression, result)``. Small models follow the
#: format they just saw far better than one described to them (measured in envs/math/README.md).
EXAMPLES: tuple[tuple[str, str, str], ...] = (
    ("What is 12 * 7?", "12 * 7", "84"),
    ("What is 35 + 46?", "35 + 46", "81"),
    ("What is 9 * (8 - 3)?", "9 * (8 - 3)", "45"),
)

Emit = Callable[[str, Any], None]


@dataclass(frozen=True)
class MathAgentConfig:
    """How the agent behaves; every field can be passed through ``make_env(**kwargs)``."""

    #: ``"tools"`` (OpenAI tool calls) or ``"text"`` (the same calls as text; see the module doc).
    protocol: str = "tools"
    #: Most LLM calls per episode (calculator rounds plus the final answer).
    max_turns: int = 4
    #: ``max_tokens`` of each call (``None``: the policy decides).
    max_tokens: int | None = 256
    #: Sampling temperature to ask for (``None``: the policy decides).
    temperature: float | None = None
    #: The agent's own instructions (the tool description is added after them); the episode's
    #: :data:`SYSTEM_PROMPT_RESOURCE` resource replaces them when the env was given one.
    system_prompt: str = SYSTEM_PROMPT
    #: The user message; ``{question}`` is replaced by the task's question.
    user_template: str = "{question}"
    #: How many of :data:`EXAMPLES` to show before the question (0 to 3).
    examples: int = 3
    #: The text protocol's tool description: ``"compact"`` (:data:`COMPACT_TOOL_PROMPT`) or
    #: ``"full"`` (the generic preamble the ``hf`` backend writes for ``tools``).
    tool_description: str = "compact"
    #: Only an explicit marker (``Answer:``, ``####``, ``\\boxed{}``) counts as an answer; without
    #: it the reply's last number does.
    require_marker: bool = False
    #: Limits of the calculator.
    calculator: CalculatorLimits = field(default_factory=CalculatorLimits)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {self.max_turns}")
        if "{question}" not in self.user_template:
            raise ValueError("user_template must contain {question}")
        if self.tool_description not in ("compact", "full"):
            raise ValueError(f"tool_description must be 'compact' or 'full', got {self.tool_description!r}")
        if not 0 <= self.examples <= len(EXAMPLES):
            raise ValueError(f"examples must be 0 to {len(EXAMPLES)}, got {self.examples}")


@dataclass
class AgentResult:
    """What one episode of the agent produced."""

    #: The final answer's text (``None`` when there is none).
    answer: str | None
    #: ``ok``, ``unparsable`` or ``missing`` (see :mod:`.answers`).
    answer_status: str
    #: Calculator calls made, and how many of them failed.
    calculator_calls: int = 0
    calculator_errors: int = 0
    #: LLM calls made.
    turns: int = 0


def traced_tool_call(call: Mapping[str, Any], limits: CalculatorLimits | None = None) -> dict[str, Any]:
    """:func:`run_tool_call` inside an OpenTelemetry span, as the GenAI semantic conventions trace a
    tool (``execute_tool calculator``: its name, call id, arguments, result; an error status with
    the calculator's message when it failed), when OpenTelemetry is installed. In an episode the
    span is joined to the call that asked for the tool (:mod:`agentgym_lightning.tracing`): a
    failure is the AIR signal ``otel.tool_error``."""
    if _trace is None:
        return run_tool_call(call["name"], call["arguments"], limits)
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": str(call["name"]),
        "gen_ai.tool.call.arguments": call["arguments"] if isinstance(call["arguments"], str) else json.dumps(call["arguments"]),
    }
    if call.get("id"):
        attributes["gen_ai.tool.call.id"] = str(call["id"])
    with _trace.get_tracer(__name__).start_as_current_span(f"execute_tool {call['name']}", attributes=attributes):
        record = run_tool_call(call["name"], call["arguments"], limits)
        trace_tool_record(record)
    return record


def trace_tool_record(record: Mapping[str, Any]) -> None:
    """Put a calculator record on the current tool span (ours, or a framework's own
    ``execute_tool`` span, AutoGen's): its result, or an error status with the calculator's message."""
    if _trace is None:
        return
    span = _trace.get_current_span()
    if "error" in record:
        span.set_attribute("error.type", str(record["error"]))
        span.set_status(_trace.Status(_trace.StatusCode.ERROR, str(record["message"])))
    else:
        span.set_attribute("gen_ai.tool.call.result", str(record["result"]))


def _tool_error(expression: Any, kind: str, message: str) -> dict[str, Any]:
    return {"expression": expression, "error": kind, "message": message}


def run_tool_call(name: str, arguments: Any, limits: CalculatorLimits | None = None) -> dict[str, Any]:
    """Run one tool call on the calculator: ``{"expression", "result"}`` or an error record.

    ``arguments`` is the call's JSON text (or a mapping). Lenient where it costs nothing: a
    single argument of another name, or a bare string, is taken as the expression.
    """
    if name != "calculator":
        return _tool_error(None, "unknown_tool", f"there is no tool {name!r}; the only tool is calculator")
    args: Any = arguments
    if isinstance(arguments, str):
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            args = arguments  # a bare expression
    if isinstance(args, Mapping):
        if "expression" in args:
            expression = args["expression"]
        elif len(args) == 1:
            expression = next(iter(args.values()))
        else:
            return _tool_error(None, "bad_arguments", 'call the calculator with {"expression": "..."}')
    else:
        expression = args
    if isinstance(expression, (int, float)) and not isinstance(expression, bool):
        expression = str(expression)
    if not isinstance(expression, str):
        return _tool_error(None, "bad_arguments", 'the expression must be a string: {"expression": "12 * 7"}')
    result = calculate(expression, limits or CalculatorLimits())
    if result.ok:
        return {"expression": expression, "result": result.text}
    return _tool_error(expression[:200], result.error or "syntax", result.text.removeprefix("Error: "))


def _tool_text(record: Mapping[str, Any]) -> str:
    """What the model is shown for one call: the result, or ``Error: <why>``."""
    return str(record["result"]) if "result" in record else f"Error: {record['message']}"


class MathAgent:
    """``agent(task, ctx) -> AgentResult`` for :class:`~agentgym_lightning.env.AgentEnv`.

    ``task["question"]`` is the question. Use :meth:`run` with any ``openai.OpenAI`` client
    outside an env. ``name`` (e.g. ``"solver"`` beside another agent) is sent as every call's
    ``metadata["agent"]``, as framework adapters name their agents, for ``agent_match`` and
    ``lora_per_agent``; without it the calls say only their role.
    """

    def __init__(self, config: MathAgentConfig | None = None, name: str | None = None) -> None:
        self.config = config or MathAgentConfig()
        self.name = name

    def __call__(self, task: Mapping[str, Any], ctx: AgentContext) -> AgentResult:
        system_prompt = ctx.resource(SYSTEM_PROMPT_RESOURCE, default=self.config.system_prompt)
        return self.run(task, ctx.openai_client(), ctx.model, emit=ctx.emit_variable, system_prompt=system_prompt)

    def initial_messages(self, question: str, system_prompt: str | None = None) -> list[dict[str, Any]]:
        """The first call's messages: instructions (``system_prompt``, else the config's), the
        worked examples, the question."""
        cfg = self.config
        system = cfg.system_prompt if system_prompt is None else system_prompt
        if cfg.protocol == "text":
            if cfg.tool_description == "full":
                system = render_tools_system_prompt([CALCULATOR_TOOL], system)
            else:
                system = f"{system}\n{COMPACT_TOOL_PROMPT}" if system else COMPACT_TOOL_PROMPT
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for i, (example, expression, result) in enumerate(EXAMPLES[: cfg.examples]):
            messages.append({"role": "user", "content": cfg.user_template.format(question=example)})
            arguments = json.dumps({"expression": expression})
            if cfg.protocol == "text":
                messages.append({"role": "assistant", "content": format_tool_call("calculator", arguments)})
                messages.append({"role": "user", "content": render_tool_result(result)})
            else:
                call_id = f"call_example_{i}"
                call = {"id": call_id, "type": "function", "function": {"name": "calculator", "arguments": arguments}}
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
            messages.append({"role": "assistant", "content": f"Answer: {result}"})
        messages.append({"role": "user", "content": cfg.user_template.format(question=question)})
        return messages

    def run(
        self, task: Mapping[str, Any], client: openai.OpenAI, model: str, *, emit: Emit | None = None,
        system_prompt: str | None = None,
    ) -> AgentResult:
        """Solve ``task["question"]``; returns the final answer and what happened on the way.
        ``system_prompt`` replaces the config's instructions (an episode's resource)."""
        cfg = self.config
        emit = emit or (lambda name, value: None)
        messages = self.initial_messages(str(task["question"]), system_prompt)
        calls = errors = 0
        reply = ""
        turn = 0
        while turn < cfg.max_turns:
            turn += 1
            content, tool_calls, malformed, assistant = self._chat(client, model, messages)
            reply = content
            records = [traced_tool_call(c, cfg.calculator) for c in tool_calls]
            records += [_tool_error(None, "malformed", f"the tool call could not be read: {m}") for m in malformed]
            if not records:
                break  # the final reply
            calls += len(records)
            errors += sum(1 for r in records if "error" in r)
            emit("calculator", records)
            messages.append(assistant)
            if cfg.protocol == "tools" and tool_calls:
                for call, record in zip(tool_calls, records):
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": _tool_text(record)})
                extra = records[len(tool_calls):]
                if extra:  # malformed blocks next to valid calls: say so in a user message
                    messages.append({"role": "user", "content": "\n".join(_tool_text(r) for r in extra)})
            else:
                messages.append({"role": "user", "content": "\n".join(render_tool_result(_tool_text(r)) for r in records)})
            reply = ""  # a turn spent on tools gives no answer
        found = extract_answer(reply, require_marker=cfg.require_marker) if reply else ExtractedAnswer(None, "missing")
        emit("answer", found.text)
        emit("answer_status", found.status)
        emit("calculator_calls", calls)
        return AgentResult(
            answer=found.text, answer_status=found.status, calculator_calls=calls, calculator_errors=errors, turns=turn
        )

    def _chat(
        self, client: openai.OpenAI, model: str, messages: list[dict[str, Any]]
    ) -> tuple[str, list[dict[str, str]], list[str], dict[str, Any]]:
        """One call: ``(content, tool calls as {id, name, arguments}, why each unreadable
        <tool_call> block failed, the assistant message to append)``."""
        cfg = self.config
        metadata = {"role": "solver", "trainable": "true"}
        if self.name is not None:
            metadata["agent"] = self.name
        kwargs: dict[str, Any] = {"metadata": metadata}
        if cfg.max_tokens is not None:
            kwargs["max_tokens"] = cfg.max_tokens
        if cfg.temperature is not None:
            kwargs["temperature"] = cfg.temperature
        if cfg.protocol == "tools":
            kwargs["tools"] = [CALCULATOR_TOOL]
        response = client.chat.completions.create(model=model, messages=messages, **kwargs)  # type: ignore[arg-type]
        message = response.choices[0].message
        content = message.content or ""
        if cfg.protocol == "text":
            parsed = parse_tool_calls(content, make_id=new_tool_call_id)
            calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in parsed.tool_calls]
            return content, calls, parsed.errors, {"role": "assistant", "content": content}
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in (message.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]
        assistant: dict[str, Any] = {"role": "assistant", "content": message.content}
        if calls:
            assistant["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls
            ]
        # A backend that parses calls from text (hf, vllm) leaves an unreadable block in the content.
        malformed = parse_tool_calls(content).errors if TOOL_CALL_OPEN in content else []
        return content, calls, malformed, assistant
