"""OTLP/HTTP trace requests (``POST .../v1/traces``), protobuf or JSON, read into :class:`~agentgym_lightning.tracing.spans.SpanRecord`\\ s.

The parsing is opentelemetry-proto's generated classes (``ExportTraceServiceRequest``) and
protobuf's own ``json_format`` for OTLP/JSON; only what OTLP/JSON does differently from
protobuf's JSON mapping is ours: trace and span ids are hex, not base64. A request is read whole
before anything is kept, so a bad one (a 4xx) changes nothing. Bounds (the gateway's
:class:`~agentgym_lightning.gateway.limits.GatewayLimits`): the body (and a gzip body once
inflated) is at most ``max_body_bytes``; JSON is parsed by the gateway's strict parser (depth,
NaN, ``max_json_values``); protobuf nesting stops at protobuf's recursion limit; then, before any
span or value is built, at most ``max_export_spans`` spans and ``max_attribute_values`` attribute
values nested at most ``max_attribute_depth`` deep. A key-value list attribute becomes one JSON
object (its inner lists nested in it, never JSON text re-escaped at every level: 30 levels of
that made a 400-byte body cost gigabytes).
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any

from agentgym_lightning.gateway.limits import GatewayLimits
from agentgym_lightning.gateway.validation import body_too_large, parse_json
from agentgym_lightning.llm import GatewayError
from agentgym_lightning.tracing.spans import SpanRecord

try:  # the `tracing` extra (make setup installs it)
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )
except ImportError:  # pragma: no cover - exercised only without the extra
    ExportTraceServiceRequest = None  # type: ignore[assignment,misc]

__all__ = ["PROTOBUF", "JSON", "parse_export_request", "export_response", "otlp_json"]

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_STATUS = {0: "unset", 1: "ok", 2: "error"}
_ID_FIELDS = ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id")


def _require_proto() -> None:
    if ExportTraceServiceRequest is None:
        raise GatewayError(
            501, "this gateway cannot read OTLP traces: opentelemetry-proto is not installed "
            "(pip install 'agentgym-lightning[tracing]')"
        )


def _media_type(content_type: str | None) -> str:
    media = (content_type or "").split(";")[0].strip().lower()
    if media not in (PROTOBUF, JSON):
        raise GatewayError(
            415, f"OTLP traces must be {PROTOBUF} or {JSON}, got content-type {content_type!r} "
            "(set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf or http/json)"
        )
    return media


def _inflate(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    encoding = (encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding != "gzip":
        raise GatewayError(415, f"unsupported content-encoding {encoding!r}: send gzip or none")
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, max_bytes + 1)  # bounded: a gzip bomb stops here
    except zlib.error as exc:
        raise GatewayError(400, f"the gzip body is corrupt: {exc}") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise body_too_large(max_bytes)
    if not inflater.eof:
        raise GatewayError(400, "the gzip body is truncated")
    return out


def _id_holders(data: Any) -> list[dict[str, Any]]:
    """The spans and span links of an OTLP/JSON trace request (the objects that carry ids)."""
    if not isinstance(data, dict):
        raise GatewayError(400, "an OTLP/JSON body must be an object with 'resourceSpans'")
    return [
        obj
        for resource in _items(data, "resourceSpans", "resource_spans")
        for scope in _items(resource, "scopeSpans", "scope_spans")
        for span in _items(scope, "spans")
        for obj in [span, *_items(span, "links")]
    ]


def _hex_ids_to_base64(data: Any) -> None:
    """OTLP/JSON writes ids as hex; protobuf's JSON mapping reads bytes as base64."""
    for obj in _id_holders(data):
        for key in _ID_FIELDS:
            value = obj.get(key)
            if isinstance(value, str) and value:
                try:
                    obj[key] = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError:
                    raise GatewayError(400, f"OTLP/JSON {key} must be hex, got {value[:40]!r}") from None


def otlp_json(request: Any) -> bytes:
    """An ``ExportTraceServiceRequest`` as OTLP/JSON (protobuf's JSON mapping with hex ids), the
    body an ``http/json`` exporter sends (tests and benchmarks post it)."""
    data = json_format.MessageToDict(request)
    for obj in _id_holders(data):
        for key in _ID_FIELDS:
            if obj.get(key):
                obj[key] = base64.b64decode(obj[key]).hex()
    return json.dumps(data).encode()


def _items(obj: Any, *keys: str) -> list[Any]:
    for key in keys:
        value = obj.get(key) if isinstance(obj, dict) else None
        if value is not None:
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise GatewayError(400, f"OTLP/JSON {key!r} must be a list of objects")
            return value
    return []


def _plain(value: Any) -> Any:
    """An ``AnyValue`` as plain data (arrays as lists, key-value lists as dicts); its size was
    bounded by :func:`_check_values`."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_plain(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _plain(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which)


def _any_value(value: Any) -> Any:
    """An attribute's ``AnyValue``: a key-value list as the JSON text of one object."""
    plain = _plain(value)
    return json.dumps(plain, default=str) if isinstance(plain, dict) else plain


def _check_values(request: Any, limits: GatewayLimits) -> None:
    """Refuse a request with more than ``max_export_spans`` spans (413), attribute values
    nested deeper than ``max_attribute_depth`` (400) or more than ``max_attribute_values`` of
    them (413), walking the decoded message without building any value."""
    count = sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)
    if count > limits.max_export_spans:
        raise GatewayError(
            413,
            f"this OTLP export carries {count} spans, more than the gateway's max_export_spans of "
            f"{limits.max_export_spans}; export smaller batches (OTEL_BSP_MAX_EXPORT_BATCH_SIZE)",
            code="request_too_large",
        )
    spans = [span for resource in request.resource_spans for scope in resource.scope_spans for span in scope.spans]
    stack = [(kv.value, 1) for span in spans for kv in span.attributes]
    stack += [(kv.value, 1) for span in spans for event in span.events for kv in event.attributes]
    count = 0
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > limits.max_attribute_values:
            raise GatewayError(
                413,
                f"this OTLP export carries more than the gateway's max_attribute_values of "
                f"{limits.max_attribute_values} attribute values; export smaller batches",
                code="request_too_large",
            )
        which = value.WhichOneof("value")
        if which in ("array_value", "kvlist_value"):
            if depth >= limits.max_attribute_depth:
                raise GatewayError(
                    400,
                    f"an OTLP attribute value is nested deeper than the gateway's max_attribute_depth of "
                    f"{limits.max_attribute_depth} (arrays and key-value lists in one another)",
                )
            inner = value.array_value.values if which == "array_value" else (kv.value for kv in value.kvlist_value.values)
            stack.extend((v, depth + 1) for v in inner)


def _hex(raw: bytes, size: int, what: str) -> str:
    if len(raw) != size:
        raise GatewayError(400, f"an OTLP span's {what} must be {size} bytes, got {len(raw)}")
    return raw.hex()


def parse_export_request(
    body: bytes, content_type: str | None, content_encoding: str | None, limits: GatewayLimits
) -> list[SpanRecord]:
    """Every span of an OTLP ``ExportTraceServiceRequest`` body; raises a 4xx
    :class:`GatewayError` saying what is wrong (415 for a media type or encoding we do not read,
    413 past ``limits`` on bytes, values or spans, 400 for anything malformed or nested too deep)."""
    max_bytes = limits.max_body_bytes
    media = _media_type(content_type)
    _require_proto()
    if len(body) > max_bytes:
        raise body_too_large(max_bytes)
    body = _inflate(body, content_encoding, max_bytes)
    request = ExportTraceServiceRequest()
    try:
        if media == PROTOBUF:
            request.ParseFromString(body)
        else:
            data = parse_json(body, "OTLP/JSON body", max_bytes, limits.max_json_values)
            _hex_ids_to_base64(data)
            json_format.ParseDict(data, request, ignore_unknown_fields=True)
    except (DecodeError, json_format.ParseError, RecursionError) as exc:
        raise GatewayError(400, f"not an OTLP trace export request: {str(exc)[:200]}") from None
    _check_values(request, limits)
    records = []
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                records.append(
                    SpanRecord.build(
                        trace_id=_hex(span.trace_id, 16, "trace_id"),
                        span_id=_hex(span.span_id, 8, "span_id"),
                        parent_id=_hex(span.parent_span_id, 8, "parent_span_id") if span.parent_span_id else None,
                        name=span.name,
                        start=span.start_time_unix_nano / 1e9,
                        end=span.end_time_unix_nano / 1e9 if span.end_time_unix_nano else None,
                        attributes=((kv.key, _any_value(kv.value)) for kv in span.attributes),
                        status=_STATUS.get(span.status.code, "unset"),
                        status_message=span.status.message,
                        events=((e.name, {kv.key: _any_value(kv.value) for kv in e.attributes}) for e in span.events),
                    )
                )
    return records


def export_response(content_type: str | None) -> tuple[bytes, str]:
    """The success body of an export (an empty ``ExportTraceServiceResponse``) in the request's
    encoding, and its media type."""
    if _media_type(content_type) == PROTOBUF:
        return ExportTraceServiceResponse().SerializeToString(), PROTOBUF
    return b"{}", JSON

