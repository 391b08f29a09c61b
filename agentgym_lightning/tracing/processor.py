"""In-process tracing: the spans of agents that run in this process reach their episodes with no
exporter and no socket.

Each episode's agent runs inside a trace of its own, whose trace id *is* the episode id
(:func:`episode_trace`, entered by the agent's worker): every span the agent or its framework
starts is in that trace, and :class:`EpisodeSpanProcessor`, a span processor on the process's
OpenTelemetry ``TracerProvider``, hands it to the episode as it starts and ends (a tool's span
has landed before the agent's next LLM call). Spans of other traces cost a dictionary lookup.

The processor is installed on the first episode when the OpenTelemetry SDK is importable (the
``tracing`` extra): added to the program's ``TracerProvider`` if it installed one (do so before
the first episode), else on an SDK provider of ours with no exporter (nothing leaves the
process). ``AGENTGYM_LIGHTNING_TRACING=0`` turns all of it off.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from agentgym_lightning.tracing.spans import SpanRecord, episode_root_span_id, episode_trace_id, record_from_sdk

try:  # the `tracing` extra
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised only without the extra
    trace = None  # type: ignore[assignment]
    SpanProcessor = object  # type: ignore[assignment,misc]

__all__ = [
    "TracedEpisode",
    "EpisodeSpanProcessor",
    "PROCESSOR",
    "DISABLE_ENV",
    "available",
    "episode_trace",
    "call_parent",
    "instrument_once",
]

log = logging.getLogger(__name__)

class TracedEpisode(Protocol):
    """What the processor needs of an episode (:class:`agentgym_lightning.episode.Episode` is
    one): tracing comes before the episode in the flow, so it names no episode module."""

    episode_id: str

    def record_spans(self, records: list[SpanRecord]) -> None:
        """Take the agent's spans (started or finished)."""


#: Set to ``0`` to leave OpenTelemetry alone: no processor, no episode traces.
DISABLE_ENV = "AGENTGYM_LIGHTNING_TRACING"


def available() -> bool:
    """Whether in-process tracing is on: the SDK is importable and :data:`DISABLE_ENV` is not ``0``."""
    return trace is not None and os.environ.get(DISABLE_ENV, "1").lower() not in ("0", "false", "no", "off")


#: The OpenTelemetry context key under which :func:`episode_trace` marks its agent's context
#: with the episode id; contexts derived from it (child spans, a framework carrying the context
#: to its threads or tasks) keep the mark.
_AGENT_OF = "agentgym_lightning.episode"


class _Route:
    """One episode's route: the episode, and the ids of its spans accepted at their start."""

    __slots__ = ("episode", "started")

    def __init__(self, episode: TracedEpisode) -> None:
        self.episode = episode
        self.started: set[int] = set()


class EpisodeSpanProcessor(SpanProcessor):  # type: ignore[misc,valid-type]
    """Hands every span of a running episode's trace to that episode (started and ended), if
    it was started in that episode's own agent's context (:func:`episode_trace`) or as the child
    of one of its open spans: a span that only carries the episode's trace id (another agent's,
    made with a hand-built context) is ignored, so no agent can write another episode's spans
    and the signals drawn from them."""

    def __init__(self) -> None:
        self._episodes: dict[int, _Route] = {}
        self._lock = threading.Lock()
        self._installed_on: set[int] = set()
        self._warned = False

    def add(self, episode: TracedEpisode) -> None:
        """Route the spans of ``episode``'s trace to it (until :meth:`remove`)."""
        with self._lock:
            self._episodes[episode_trace_id(episode.episode_id)] = _Route(episode)

    def remove(self, episode: TracedEpisode) -> None:
        with self._lock:
            self._episodes.pop(episode_trace_id(episode.episode_id), None)

    # The SDK's SpanProcessor interface.

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        context = span.get_span_context()
        route = self._episodes.get(context.trace_id)
        if route is None:
            return
        agent_of = otel_context.get_value(_AGENT_OF, parent_context)  # None: the current context
        parent = span.parent
        if agent_of != route.episode.episode_id and (parent is None or parent.span_id not in route.started):
            # Neither in this episode's agent's context nor a child of one of its open spans (a
            # framework that carries only the span to another thread): not its span.
            return
        route.started.add(context.span_id)
        route.episode.record_spans([record_from_sdk(span)])

    def on_end(self, span: Any) -> None:
        context = span.get_span_context()
        route = self._episodes.get(context.trace_id)
        if route is not None and context.span_id in route.started:
            route.started.discard(context.span_id)
            route.episode.record_spans([record_from_sdk(span)])

    def shutdown(self) -> None:
        with self._lock:
            self._episodes.clear()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def install(self) -> bool:
        """Put this processor on the process's tracer provider (once); False if it cannot be."""
        if id(trace.get_tracer_provider()) in self._installed_on:
            return True
        with self._lock:
            provider = trace.get_tracer_provider()  # again: another thread may have set it meanwhile
            if id(provider) in self._installed_on:
                return True
            if not isinstance(provider, TracerProvider):
                if isinstance(provider, trace.ProxyTracerProvider):  # none set yet: ours, no exporter
                    provider = TracerProvider()
                    trace.set_tracer_provider(provider)
                    provider = trace.get_tracer_provider()  # another thread may have set one first
                if not isinstance(provider, TracerProvider):
                    if not self._warned:
                        self._warned = True
                        log.warning(
                            "the process's OpenTelemetry tracer provider is a %s, which takes no span processor: "
                            "agents' spans are not joined to their episodes (use opentelemetry.sdk.trace.TracerProvider)",
                            type(provider).__name__,
                        )
                    return False
            provider.add_span_processor(self)
            self._installed_on.add(id(provider))
        return True


#: The process's one processor.
PROCESSOR = EpisodeSpanProcessor()


@contextlib.contextmanager
def episode_trace(episode: TracedEpisode) -> Iterator[None]:
    """Run the code inside as ``episode``'s trace (its id is the episode id), its spans routed
    to the episode; does nothing when tracing is off (:func:`available`)."""
    if not available() or not PROCESSOR.install():
        yield
        return
    root = trace.NonRecordingSpan(
        trace.SpanContext(
            trace_id=episode_trace_id(episode.episode_id),
            span_id=episode_root_span_id(episode.episode_id),
            is_remote=False,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
    )
    PROCESSOR.add(episode)
    # The agent's context: the episode's root span, and the mark the processor accepts its spans by.
    agent_context = otel_context.set_value(_AGENT_OF, episode.episode_id, trace.set_span_in_context(root))
    token = otel_context.attach(agent_context)
    try:
        yield
    finally:
        try:
            otel_context.detach(token)
        finally:
            PROCESSOR.remove(episode)


_instrumented: dict[str, bool] = {}
_instrument_lock = threading.Lock()


def instrument_once(module: str, instrument: Callable[[], object]) -> bool:
    """Turn a framework's OpenTelemetry instrumentation on, once per process: ``instrument()``
    (say ``LangChainInstrumentor().instrument()``) runs when tracing is on (:func:`available`),
    ``module`` (the instrumentor's) is importable and :data:`PROCESSOR` is on the process's
    tracer provider, so the spans it makes reach their episodes. True if it is on."""
    with _instrument_lock:
        if module not in _instrumented:
            on = available() and importlib.util.find_spec(module) is not None and PROCESSOR.install()
            if on:
                instrument()
            _instrumented[module] = on
        return _instrumented[module]


_PROPAGATOR = TraceContextTextMapPropagator() if trace is not None else None


def call_parent(headers: Mapping[str, str] | None = None) -> str | None:
    """The span an LLM call was made inside, as hex: from its W3C ``traceparent`` header, else
    (an in-process call) the caller's current span; ``None`` when neither is known."""
    if trace is None:
        return None
    traceparent = headers.get("traceparent") if headers is not None else None
    if traceparent:
        context = trace.get_current_span(_PROPAGATOR.extract({"traceparent": traceparent})).get_span_context()
    else:
        context = trace.get_current_span().get_span_context()
    return format(context.span_id, "016x") if context.is_valid else None
