"""Episodes as traces: each finished trajectory written as OpenTelemetry spans to any OTLP/HTTP
endpoint, so Phoenix, Jaeger or Langfuse show training and eval episodes.

Off unless ``AGENTGYM_LIGHTNING_OTEL_EXPORT`` names an endpoint (``http://127.0.0.1:6006`` for
Phoenix, ``http://127.0.0.1:4318`` for a collector or Jaeger; spans go to ``<endpoint>/v1/traces``;
``OTEL_EXPORTER_OTLP_HEADERS`` adds headers, Langfuse's ``Authorization`` say). Needs the
``tracing`` extra. Spans are queued and sent in batches from a background thread
(the SDK's ``BatchSpanProcessor``); a training run's end flushes them.

One episode is one trace, whose id is the episode id (:func:`~agentgym_lightning.tracing.spans.episode_trace_id`),
in the GenAI semantic conventions:

- the root span, ``invoke_agent <env id>`` (``gen_ai.operation.name=invoke_agent``,
  ``gen_ai.agent.name``), from the episode's start to its end; error status when it failed;
  ``agentgym.*`` attributes: episode id, status, final and total reward, group, seed;
- one ``chat <model>`` span per LLM call (``gen_ai.operation.name=chat``), from the request to
  its answer: ``gen_ai.request.model``, ``gen_ai.usage.input_tokens`` / ``output_tokens`` (where
  the policy knew its token ids), ``gen_ai.response.finish_reasons``, ``gen_ai.agent.name``
  (``step.agent``), and ours: ``agentgym.step.index``, ``agentgym.step.reward``, one
  ``agentgym.reward.<source>`` per reward source, ``agentgym.step.trainable``; an error status
  when the call was refused.

The root span's id is the one the agent's own in-process spans hang from
(:func:`~agentgym_lightning.tracing.spans.episode_root_span_id`): export those to the same backend
and both show in one tree.
"""

from __future__ import annotations

import atexit
import os
import secrets
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym_lightning.framework_agent import require_extra
from agentgym_lightning.hookspecs import hookimpl
from agentgym_lightning.tracing.spans import episode_root_span_id, episode_trace_id
from agentgym_lightning.trajectory import Status, Step, Trajectory

__all__ = ["ENDPOINT_ENV", "EpisodeExporter", "trajectory_spans"]

#: The OTLP/HTTP endpoint episodes are exported to (unset: no export).
ENDPOINT_ENV = "AGENTGYM_LIGHTNING_OTEL_EXPORT"

_FAILED = (Status.TASK_FAILED, Status.INFRA_FAILED)


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1e9)


def _ids(episode_id: str) -> tuple[int, int]:
    try:
        return episode_trace_id(episode_id), episode_root_span_id(episode_id)
    except ValueError:  # not one of our ids (a trajectory from elsewhere): fresh ones
        return int.from_bytes(secrets.token_bytes(16), "big") or 1, int.from_bytes(secrets.token_bytes(8), "big") or 1


def _step_attributes(step: Step) -> dict[str, Any]:
    completion = step.completion
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": step.request.model or "policy",
        "agentgym.step.index": step.index,
        "agentgym.step.reward": step.reward,
        "agentgym.step.trainable": step.trainable,
    }
    if step.agent:
        attrs["gen_ai.agent.name"] = step.agent
    if step.role:
        attrs["agentgym.step.role"] = step.role
    if completion is not None:
        if completion.prompt_token_ids is not None:
            attrs["gen_ai.usage.input_tokens"] = len(completion.prompt_token_ids)
        if completion.completion_token_ids is not None:
            attrs["gen_ai.usage.output_tokens"] = len(completion.completion_token_ids)
        attrs["gen_ai.response.finish_reasons"] = [completion.finish_reason]
    for reward in step.rewards:
        key = f"agentgym.reward.{reward.source}"
        attrs[key] = attrs.get(key, 0.0) + reward.value
    return attrs


def trajectory_spans(trajectory: Trajectory, resource: Any = None) -> list[Any]:
    """The spans (the SDK's ``ReadableSpan``) of one trajectory: its root, then one per call."""
    require_extra("tracing", "opentelemetry.sdk")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    scope = InstrumentationScope("agentgym_lightning")
    trace_id, root_id = _ids(trajectory.episode_id)
    flags = trace.TraceFlags(trace.TraceFlags.SAMPLED)
    root = trace.SpanContext(trace_id, root_id, is_remote=False, trace_flags=flags)
    name = trajectory.env_id or "agent"
    ended = trajectory.ended_at or trajectory.started_at
    root_attrs: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": name,
        "agentgym.episode_id": trajectory.episode_id,
        "agentgym.status": trajectory.status.value,
        "agentgym.total_reward": trajectory.total_reward,
        "agentgym.steps": len(trajectory.steps),
    }
    for key, value in (("final_reward", trajectory.final_reward), ("group_id", trajectory.group_id), ("seed", trajectory.seed)):
        if value is not None:
            root_attrs[f"agentgym.{key}"] = value
    failed = trajectory.status in _FAILED
    spans = [
        ReadableSpan(
            f"invoke_agent {name}",
            context=root,
            resource=resource,
            attributes=root_attrs,
            instrumentation_scope=scope,
            status=trace.Status(trace.StatusCode.ERROR, (trajectory.error or "")[:2000]) if failed else trace.Status(trace.StatusCode.OK),
            start_time=_ns(trajectory.started_at),
            end_time=_ns(ended),
            kind=trace.SpanKind.INTERNAL,
        )
    ]
    for step in trajectory.steps:
        timings = step.timings
        context = trace.SpanContext(trace_id, int.from_bytes(secrets.token_bytes(8), "big") or 1, is_remote=False, trace_flags=flags)
        spans.append(
            ReadableSpan(
                f"chat {step.request.model or 'policy'}",
                context=context,
                parent=root,
                resource=resource,
                attributes=_step_attributes(step),
                instrumentation_scope=scope,
                status=trace.Status(trace.StatusCode.ERROR, step.error[:2000]) if step.error else trace.Status(trace.StatusCode.UNSET),
                start_time=_ns(timings.requested_at),
                end_time=_ns(timings.answered_at or timings.ended_at or timings.requested_at),
                kind=trace.SpanKind.CLIENT,
            )
        )
    return spans


class EpisodeExporter:
    """Sends trajectories' spans (:func:`trajectory_spans`) to ``endpoint`` + ``/v1/traces``
    over OTLP/HTTP, batched on a background thread."""

    def __init__(self, endpoint: str, **batch_options: Any) -> None:
        require_extra("tracing", "opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.endpoint = endpoint
        self.resource = Resource.create({"service.name": "agentgym-lightning"})
        self._processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces"), **batch_options)

    def export(self, trajectory: Trajectory) -> None:
        """Queue ``trajectory``'s spans (sent within the batch delay, or at :meth:`flush`)."""
        for span in trajectory_spans(trajectory, self.resource):
            self._processor.on_end(span)

    def flush(self, timeout_s: float = 30.0) -> bool:
        return self._processor.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self._processor.shutdown()


_exporters: dict[str, EpisodeExporter] = {}
_lock = threading.Lock()


def exporter() -> EpisodeExporter | None:
    """The exporter for ``AGENTGYM_LIGHTNING_OTEL_EXPORT`` (one per endpoint), or ``None`` when it is unset."""
    endpoint = os.environ.get(ENDPOINT_ENV, "").strip()
    if not endpoint:
        return None
    with _lock:
        if endpoint not in _exporters:
            _exporters[endpoint] = EpisodeExporter(endpoint)
            atexit.register(_exporters[endpoint].shutdown)  # what is queued is sent before exit
        return _exporters[endpoint]


@hookimpl
def agentgym_episode_end(trajectory: Trajectory) -> None:
    if (episodes := exporter()) is not None:
        episodes.export(trajectory)


@hookimpl
def agentgym_train_end(output_dir: str, metrics: Mapping[str, float], interrupted: bool) -> Sequence[str] | None:
    if (episodes := exporter()) is None:
        return None
    episodes.flush()
    return [f"episodes exported as OpenTelemetry traces to {episodes.endpoint}"]
