"""One OpenTelemetry span as the tracing code reads it: :class:`SpanRecord`, and what kind of
span it is under the GenAI semantic conventions (and OpenInference's, which LangChain and Agents
SDK instrumentors write).

Spans reach us two ways: as OTLP (:mod:`.otlp`, an exporter in another process) or as the SDK's
``ReadableSpan`` (:mod:`.processor`, in this process); both become a :class:`SpanRecord`, which
is all :mod:`.join` reads. Attribute values are bounded here, once: a string longer than
:data:`MAX_VALUE_CHARS` is cut, at most :data:`MAX_ATTRIBUTES` attributes are kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SpanRecord",
    "MAX_ATTRIBUTES",
    "MAX_VALUE_CHARS",
    "AGENT",
    "TOOL",
    "LLM",
    "OTHER",
    "bounded_value",
    "record_from_sdk",
    "episode_trace_id",
    "episode_root_span_id",
]

#: Most attributes kept of one span (the rest are dropped, counted in ``dropped_attributes``).
MAX_ATTRIBUTES = 64
#: Longest string value kept (tool arguments and results included); longer ones are cut and end
#: with ``"…"``.
MAX_VALUE_CHARS = 2000
#: Longest list value kept.
MAX_LIST_ITEMS = 32

# What a span is, from its attributes.
AGENT, TOOL, LLM, OTHER = "agent", "tool", "llm", "other"
_GENAI_KINDS = {
    "invoke_agent": AGENT,
    "create_agent": OTHER,
    "execute_tool": TOOL,
    "chat": LLM,
    "text_completion": LLM,
    "generate_content": LLM,
}
# OpenInference's span kinds (openinference.span.kind).
_OPENINFERENCE_KINDS = {"AGENT": AGENT, "TOOL": TOOL, "LLM": LLM}


def bounded_value(value: Any) -> Any:
    """``value`` as a JSON-ready scalar or list, within :data:`MAX_VALUE_CHARS` and
    :data:`MAX_LIST_ITEMS` (bytes and mappings become strings)."""
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [bounded_value(v) for v in list(value)[:MAX_LIST_ITEMS]]
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


@dataclass(slots=True)
class SpanRecord:
    """A span, finished or just started, with bounded attributes.

    Ids are lower-case hex (32 digits for the trace, 16 for spans); times are ``time.time()``
    seconds.
    """

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start: float
    #: ``None`` while the span runs (seen at its start by the in-process processor).
    end: float | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    #: ``"error"``, ``"ok"`` or ``"unset"`` (OpenTelemetry's status code).
    status: str = "unset"
    status_message: str = ""
    #: The exceptions the span recorded (``exception`` events): ``{"type", "message"}`` each.
    exceptions: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        *,
        trace_id: str,
        span_id: str,
        parent_id: str | None,
        name: str,
        start: float,
        end: float | None,
        attributes: Iterable[tuple[str, Any]],
        status: str = "unset",
        status_message: str = "",
        events: Iterable[tuple[str, Mapping[str, Any]]] = (),
    ) -> SpanRecord:
        """A record with every value bounded (see the module docstring)."""
        kept: dict[str, Any] = {}
        for key, value in attributes:
            if len(kept) >= MAX_ATTRIBUTES:
                break
            kept[str(key)[:200]] = bounded_value(value)
        exceptions = [
            {
                "type": str(bounded_value(attrs.get("exception.type", ""))),
                "message": str(bounded_value(attrs.get("exception.message", ""))),
            }
            for event, attrs in events
            if event == "exception"
        ][:MAX_LIST_ITEMS]
        return cls(
            trace_id=trace_id,
            span_id=span_id,
            parent_id=parent_id or None,
            name=str(bounded_value(name)),
            start=start,
            end=end,
            attributes=kept,
            status=status,
            status_message=str(bounded_value(status_message)),
            exceptions=exceptions,
        )

    @property
    def kind(self) -> str:
        """:data:`AGENT`, :data:`TOOL`, :data:`LLM` or :data:`OTHER`: ``gen_ai.operation.name``
        (``invoke_agent``, ``execute_tool``, ``chat``...), else ``openinference.span.kind``."""
        kind = _GENAI_KINDS.get(str(self.attributes.get("gen_ai.operation.name", "")))
        if kind is None:
            kind = _OPENINFERENCE_KINDS.get(str(self.attributes.get("openinference.span.kind", "")), OTHER)
        return kind

    @property
    def agent_name(self) -> str | None:
        """The agent this span is (``gen_ai.agent.name``; OpenInference's ``agent.name`` on agent spans)."""
        name = self.attributes.get("gen_ai.agent.name")
        if name is None and self.kind == AGENT:
            name = self.attributes.get("agent.name") or self.attributes.get("graph.node.id")
        return str(name) if name else None

    @property
    def failed(self) -> bool:
        """The span ended in an error status, or recorded an exception."""
        return self.status == "error" or bool(self.exceptions)

    @property
    def duration(self) -> float | None:
        return None if self.end is None else max(0.0, self.end - self.start)

    def tool(self) -> dict[str, Any]:
        """A tool span as a semantic variable: name, call id, arguments and result where
        recorded, status, error, duration."""
        attrs = self.attributes
        record: dict[str, Any] = {
            "name": attrs.get("gen_ai.tool.name") or attrs.get("tool.name") or self.name,
            "call_id": attrs.get("gen_ai.tool.call.id") or attrs.get("tool_call.id"),
            "status": "error" if self.failed else "ok",
            "duration_s": self.duration,
        }
        arguments = attrs.get("gen_ai.tool.call.arguments", attrs.get("tool.parameters", attrs.get("input.value")))
        result = attrs.get("gen_ai.tool.call.result", attrs.get("output.value"))
        if arguments is not None:
            record["arguments"] = arguments
        if result is not None:
            record["result"] = result
        if self.failed:
            first = self.exceptions[0] if self.exceptions else {}
            record["error"] = (
                self.status_message or first.get("message") or attrs.get("error.type") or first.get("type") or "error"
            )
        return record

    def summary(self, step: int | None) -> dict[str, Any]:
        """What the trajectory keeps of a span (``Trajectory.spans``), joined to step ``step``."""
        data: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "span_id": self.span_id,
            "parent_id": self.parent_id,
            "start": self.start,
            "duration_s": self.duration,
            "status": self.status,
            "step": step,
            "attributes": self.attributes,
        }
        if self.status_message:
            data["status_message"] = self.status_message
        if self.exceptions:
            data["exceptions"] = self.exceptions
        return data


def episode_trace_id(episode_id: str) -> int:
    """An episode's trace id: its id (32 hex digits) read as a number."""
    return int(episode_id, 16)


def episode_root_span_id(episode_id: str) -> int:
    """The id of an episode's root span: the parent of every span its agent makes in-process,
    and the span the episode exporter (``plugins/otel_exporter.py``) writes for the episode, so
    a tracing backend shows both in one tree."""
    return int(episode_id[16:], 16) or 1


_STATUS = {0: "unset", 1: "ok", 2: "error"}


def record_from_sdk(span: Any) -> SpanRecord:
    """A :class:`SpanRecord` of an OpenTelemetry SDK span (``ReadableSpan``: started or ended)."""
    context = span.get_span_context()
    parent = span.parent
    status = span.status
    return SpanRecord.build(
        trace_id=format(context.trace_id, "032x"),
        span_id=format(context.span_id, "016x"),
        parent_id=format(parent.span_id, "016x") if parent is not None else None,
        name=span.name,
        start=(span.start_time or 0) / 1e9,
        end=span.end_time / 1e9 if span.end_time else None,
        attributes=(span.attributes or {}).items(),
        status=_STATUS.get(int(status.status_code.value), "unset") if status is not None else "unset",
        status_message=(status.description or "") if status is not None else "",
        events=[(e.name, e.attributes or {}) for e in span.events],
    )
