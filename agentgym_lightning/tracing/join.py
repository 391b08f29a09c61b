"""Spans joined to the steps of one episode.

An episode's agent may trace itself (OpenTelemetry, GenAI semantic conventions). Its spans
arrive here (:meth:`SpanJoin.add`, from the OTLP receiver or the in-process processor) and are
joined to the LLM calls the gateway recorded:

- an **agent span** (``invoke_agent``, ``gen_ai.agent.name``) names the calls made inside it:
  ``step.agent``, where the framework did not name the call itself. Inside: the call's trace
  context (or its LLM span) descends from the agent span; a call with no agent span above it
  (an exporter in another process whose HTTP client propagates nothing, an instrumentor that does
  not make its spans current) is named by the innermost agent span running when it was made;
- an **LLM span** (``chat``...) is the call it describes: the call made inside it (the trace
  context the request carried, else the time the call was made: the innermost LLM span running
  then), else the call in the same place of the episode's order (the n-th LLM span is the n-th
  call); its agent is the agent span around it;
- a **tool span** (``execute_tool``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``) is a semantic
  variable of the call that asked for the tool (the call whose completion holds that tool call
  id, else the call answered last before the tool started): appended to that step's
  ``outcome["otel.tools"]`` (name, call id, arguments and result where recorded, status, error,
  duration);
- tools and failures count on the step they belong to, as numbers in its ``outcome`` (and so AIR
  signals of the same name, which ``air_weights`` weighs as any other, :mod:`~agentgym_lightning.plugins.outcome_air`):
  ``otel.tool_ok`` (tool spans that succeeded), ``otel.tool_error`` (tool spans that failed: error
  status or an exception),
  ``otel.exception`` (exceptions recorded by other spans), ``otel.error`` (other spans ending
  in an error status). A span that is not a tool's counts on the call answered last before it
  ended.

Every finished span is also kept, summarized, on ``trajectory.spans`` (at most ``max_spans``;
the rest counted in ``trajectory.spans_dropped``). What lands after a step was closed (its AIR
computed) stays recorded but gives that step no reward: an exporter that batches must flush
before the agent's next call (``SimpleSpanProcessor``, or in-process tracing, which is immediate).

The join only reads the record: what it finds (:class:`SpanFindings`: the agent that made a call,
a step's new outcome entries, the span summaries to keep) it hands to the episode, which writes
them (:meth:`~agentgym_lightning.episode.Episode.record_spans`), as it writes every other part of
its steps.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agentgym_lightning.tracing.spans import AGENT, LLM, TOOL, SpanRecord
from agentgym_lightning.trajectory import Step, Trajectory

__all__ = ["SpanJoin", "SpanFindings", "TOOLS", "TOOL_OK", "TOOL_ERROR", "EXCEPTION", "ERROR", "MAX_TOOLS_PER_STEP"]

#: Outcome names the join writes.
TOOLS, TOOL_OK, TOOL_ERROR = "otel.tools", "otel.tool_ok", "otel.tool_error"
EXCEPTION, ERROR = "otel.exception", "otel.error"
#: Most tool records one step keeps (later ones are still counted in ``otel.tool_error``).
MAX_TOOLS_PER_STEP = 32
# Deepest parent chain walked to find a call's agent (a hostile exporter may send a loop).
_MAX_DEPTH = 64


@dataclass
class SpanFindings:
    """What one batch of spans says about an episode's record, for the episode to write."""

    #: Calls the agent spans known by now name: step index -> agent name (calls without one).
    agents: dict[int, str] = field(default_factory=dict)
    #: Outcome entries the spans change: step index -> {name: new value} (tool records, counts).
    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Summaries of finished spans to keep on ``trajectory.spans``, in order.
    summaries: list[dict[str, Any]] = field(default_factory=list)
    #: Finished spans past ``max_spans``: counted in ``trajectory.spans_dropped``, not kept.
    dropped: int = 0


class SpanJoin:
    """The spans of one episode, joined to its steps. Not thread-safe: the episode calls it
    under its own lock, and writes what it finds (it reads the record, never writes it).

    Args:
        trajectory: The episode's record, read to place spans among its steps.
        max_spans: Most span summaries kept on the trajectory; also bounds what is remembered to
            join later spans (four times as many span ids).
    """

    def __init__(self, trajectory: Trajectory, max_spans: int = 1000) -> None:
        self.trajectory = trajectory
        self.max_spans = max_spans
        self._parents: dict[str, str | None] = {}
        self._agents: dict[str, str] = {}  # agent span id -> agent name
        self._agent_times: list[tuple[float, float, str]] = []  # (start, end, name) of finished agent spans
        self._call_parent: dict[int, str] = {}  # step index -> span current when the call was made
        self._llm_order: list[tuple[float, str]] = []  # (start, span id) of LLM spans, sorted
        self._llm_ids: set[str] = set()
        self._llm_times: dict[str, tuple[float, float]] = {}  # finished LLM spans: (start, end)
        self._finished: set[str] = set()

    # ------------------------------------------------------------------ from the episode

    def on_call(self, index: int, parent_span_id: str | None) -> str | None:
        """Call ``index`` is being recorded; ``parent_span_id`` is the span that was current when
        the agent made it (the trace context it carried), if any. Returns the agent span's name
        the call was made inside, if one is known (the episode names the call with it when the
        framework did not)."""
        if parent_span_id:
            self._call_parent[index] = parent_span_id
        return self._agent_above(parent_span_id)

    def add(self, records: Iterable[SpanRecord]) -> SpanFindings:
        """Take spans (started or finished), join the finished ones to their steps, and return
        what they say about the record (the episode writes it)."""
        records = list(records)
        findings = SpanFindings()
        kept = len(self.trajectory.spans)
        names_changed = False
        for record in records:  # the whole batch's places first: it may come in any order
            names_changed |= self._remember(record)
        for record in records:
            if record.end is None or record.span_id in self._finished:
                continue  # still running, or sent twice (an exporter's retry)
            if len(self._finished) < 4 * self.max_spans:
                self._finished.add(record.span_id)
                if record.kind == AGENT and (name := record.agent_name):
                    self._agent_times.append((record.start, record.end, name))
                    names_changed = True
                elif record.kind == LLM:
                    self._llm_times[record.span_id] = (record.start, record.end)
            index = self._step_of(record)
            if index is not None:
                self._count(findings.outcomes.setdefault(index, {}), self.trajectory.steps[index], record)
            if kept < self.max_spans:
                findings.summaries.append(record.summary(index))
                kept += 1
            else:
                findings.dropped += 1
        if names_changed:
            findings.agents = self._name_calls()
        return findings

    # ------------------------------------------------------------------ joining

    def _remember(self, record: SpanRecord) -> bool:
        """Note the span's place in the tree; True if it may name calls (an agent or LLM span)."""
        if record.span_id in self._parents or len(self._parents) >= 4 * self.max_spans:
            return False
        self._parents[record.span_id] = record.parent_id
        kind = record.kind
        if kind == AGENT and (name := record.agent_name):
            self._agents[record.span_id] = name
            return True
        if kind == LLM:
            bisect.insort(self._llm_order, (record.start, record.span_id))
            self._llm_ids.add(record.span_id)
            return True
        return False

    def _agent_above(self, span_id: str | None) -> str | None:
        for _ in range(_MAX_DEPTH):
            if span_id is None:
                return None
            if span_id in self._agents:
                return self._agents[span_id]
            span_id = self._parents.get(span_id)
        return None

    def _llm_span_of(self, index: int) -> str | None:
        """The LLM span describing call ``index``: the one its trace context is inside; for a
        call that carried none, the finished LLM span running when it was made (the innermost),
        else the n-th LLM span (clocks that disagree)."""
        parent = self._call_parent.get(index)
        if parent is not None:
            for _ in range(_MAX_DEPTH):
                if parent is None or parent in self._llm_ids:
                    return parent
                parent = self._parents.get(parent)
            return None
        steps = self.trajectory.steps
        at = steps[index].timings.requested_at
        around = [(start, span) for span, (start, end) in self._llm_times.items() if start <= at <= end]
        if around:
            return max(around)[1]
        if index < len(self._llm_order):  # by order, unless the n-th span's times hold another call
            span = self._llm_order[index][1]
            start, end = self._llm_times.get(span, (0.0, -1.0))
            if not any(start <= s.timings.requested_at <= end for s in steps):
                return span
        return None

    def _name_calls(self) -> dict[int, str]:
        """The names of the calls the framework did not name, from the agent spans known by now."""
        names: dict[int, str] = {}
        if not self._agents:
            return names  # no agent span yet: nothing can name a call
        for step in self.trajectory.steps:
            if step.agent is None:
                anchor = self._call_parent.get(step.index) or self._llm_span_of(step.index)
                # An instrumentor may not make its spans current: then the call's context has no
                # agent above it, and the agent span running at the time names it.
                name = self._agent_above(anchor) or self._agent_during(step.timings.requested_at)
                if name is not None:
                    names[step.index] = name
        return names

    def _agent_during(self, at: float) -> str | None:
        """A call that carried no trace context and has no LLM span: the innermost agent span
        running when it was made (the latest to start)."""
        around = [(start, name) for start, end, name in self._agent_times if start <= at <= end]
        return max(around)[1] if around else None

    def _step_of(self, record: SpanRecord) -> int | None:
        steps = self.trajectory.steps
        if record.kind == TOOL:
            call_id = record.tool().get("call_id")
            if call_id:
                for step in reversed(steps):
                    if step.completion is not None and any(c.id == call_id for c in step.completion.tool_calls):
                        return step.index
            at = record.start
        elif record.kind == LLM:
            return self._call_of_llm(record)
        else:
            at = record.end if record.end is not None else record.start
        for step in reversed(steps):  # usually the last one: the tool runs right after its answer
            if step.timings.answered_at is not None and step.timings.answered_at <= at:
                return step.index
        return None

    def _call_of_llm(self, record: SpanRecord) -> int | None:
        """The call an LLM span describes (the inverse of :meth:`_llm_span_of`), looking only at
        the calls that can be it: those with trace context, those made while it ran, the n-th."""
        end = record.end if record.end is not None else record.start
        for step in reversed(self.trajectory.steps):
            traced = step.index in self._call_parent
            if (traced or record.start <= step.timings.requested_at <= end) and self._llm_span_of(step.index) == record.span_id:
                return step.index
        n = bisect.bisect_left(self._llm_order, (record.start, record.span_id))
        if n < len(self.trajectory.steps) and self._llm_span_of(n) == record.span_id:
            return n
        return None

    @staticmethod
    def _count(changes: dict[str, Any], step: Step, record: SpanRecord) -> None:
        """Add ``record`` to ``changes``, the step's outcome entries this batch changes (each
        starting from the step's own value)."""

        def current(name: str, empty: Any) -> Any:
            return changes[name] if name in changes else step.outcome.get(name, empty)

        if record.kind == TOOL:
            tools = list(current(TOOLS, ()))
            if len(tools) < MAX_TOOLS_PER_STEP:
                changes[TOOLS] = [*tools, record.tool()]
            counter = TOOL_ERROR if record.failed else TOOL_OK
            changes[counter] = current(counter, 0) + 1
        elif record.exceptions:
            changes[EXCEPTION] = current(EXCEPTION, 0) + len(record.exceptions)
        elif record.status == "error":
            changes[ERROR] = current(ERROR, 0) + 1

