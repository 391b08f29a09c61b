"""The bounds the gateway puts on what agents send it (documented in ``docs/limits.md``).

One bad or hostile client must cost only its own request, never memory, file descriptors or
other episodes' calls. Every bound is a field of :class:`GatewayLimits`, typed, defaulted and
documented here; the process-wide gateway reads overrides from ``AGENTGYM_LIGHTNING_GATEWAY_*``
environment variables (:meth:`GatewayLimits.from_env`)::

    Gateway(limits=GatewayLimits(max_body_bytes=32 * 2**20, keep_alive_timeout=120))
    AGENTGYM_LIGHTNING_GATEWAY_MAX_BODY_BYTES=33554432 agentgym-lightning eval ...
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

__all__ = ["GatewayLimits", "ENV_PREFIX"]

ENV_PREFIX = "AGENTGYM_LIGHTNING_GATEWAY_"


@dataclass(frozen=True)
class GatewayLimits:
    """Bounds on requests and connections; exceeding one answers the client in OpenAI's error shape."""

    #: Largest request body in bytes. A larger ``Content-Length`` is refused (413) before any of
    #: the body is read; a chunked body is refused as soon as it passes the limit. 8 MiB holds a
    #: conversation of about two million tokens.
    max_body_bytes: int = 8 * 2**20
    #: Largest request head (request line plus all headers) in bytes; more is refused (431) while
    #: it arrives.
    max_header_bytes: int = 64 * 2**10
    #: Seconds a client has to send a complete request head, from connecting (or, on a kept-alive
    #: connection, from its first byte); then the connection is closed. Reaps sockets that
    #: connect and send nothing, or trickle headers.
    header_timeout: float = 5.0
    #: Seconds a request has to send its whole body once its head is in; then 408 and close.
    body_timeout: float = 60.0
    #: Most bytes of request bodies still arriving, all connections together. A client that sends
    #: its body slowly holds what it sent until the rest comes (60 such clients held +971 MB at
    #: the default body size): past this total, the body that began arriving first is refused
    #: (408) and its bytes freed, so a fast request beside slow ones still gets in. ``None``: 8
    #: times ``max_body_bytes`` (64 MiB); at least ``max_body_bytes``.
    max_receiving_body_bytes: int | None = None
    #: Seconds a response may wait for its client to read it (the socket's buffers full): a
    #: client that stops reading is then dropped, with what it had not read, instead of holding
    #: its connection, its call's task and the unsent bytes for as long as it likes.
    send_timeout: float = 60.0
    #: Seconds a kept-alive connection may sit idle between a response and the next request.
    #: Time a call spends waiting for its completion is not idleness: a generation may take
    #: minutes and its connection stays open.
    keep_alive_timeout: float = 30.0
    #: Most open client connections. At the cap a new connection closes the one that has been
    #: waiting longest for a request (idle or still sending its head); if every connection has a
    #: request in progress, the new one is closed instead. ``None``: half the process's
    #: file-descriptor limit (``ulimit -n``) when the server starts, so sockets alone can never
    #: exhaust descriptors.
    max_connections: int | None = None
    #: Most agent workers that may outlive their episodes at once. A worker blocked in a call
    #: Python cannot interrupt (``time.sleep``, a read with no timeout) keeps its thread until
    #: that call returns; past this many, starting an episode raises instead of piling up threads.
    max_lingering_agents: int = 64
    #: Message content part types accepted; others are refused (400) at the gateway, because
    #: the ``hf`` and ``vllm`` backends render text only. Add ``"image_url"`` when your policy
    #: is an ``openai`` backend in front of a server that takes images.
    content_part_types: frozenset[str] = field(default_factory=lambda: frozenset({"text"}))
    #: Most distinct semantic variables one episode may emit (``emit_variable`` or ``POST
    #: .../variables``); a new name past it raises ``ValueError`` (400 over HTTP).
    max_variables: int = 256
    #: Largest semantic variable, in bytes of its JSON (``repr`` for what JSON cannot hold); a
    #: larger one raises ``ValueError`` (400 over HTTP). Variables are recorded in every
    #: trajectory and shown to the policy: big data belongs in the agent's own storage. 4 MiB
    #: still holds what a model wrote at its longest (Spider's agent emits its SQL).
    max_variable_bytes: int = 4 * 2**20
    #: Most of an agent's trace spans one episode keeps on its trajectory (``trajectory.spans``;
    #: later ones are joined to their steps all the same, and counted in
    #: ``trajectory.spans_dropped``). Four times as many span ids are remembered to join spans
    #: that arrive later; past that, a span's place in the trace is forgotten.
    max_episode_spans: int = 1000

    #: Most JSON values (arrays, objects, strings, numbers...) one request body may hold, counted
    #: on its bytes before anything is parsed (413): parsing and checking a body then costs
    #: milliseconds, however its bytes are spent. A long conversation of 10,000 messages with
    #: tool calls holds about 60,000.
    max_json_values: int = 200_000
    #: Most items in one request's ``messages`` (chat, Anthropic) or ``input`` (Responses):
    #: more is refused (413) before any item is checked.
    max_messages: int = 10_000
    #: Most ``tools`` one request may declare (413 before any is checked; OpenAI takes 128).
    max_tools: int = 1_000
    #: Most keys in one of a request's objects (its fields and their fields: ``metadata``,
    #: ``logit_bias``...): more is refused (413) before anything is validated (OpenAI takes 16
    #: metadata keys).
    max_object_keys: int = 1_000
    #: Most spans one OTLP export request may carry (413 before any span is read; an
    #: OpenTelemetry batch exporter sends at most 512 per request by default).
    max_export_spans: int = 10_000
    #: Deepest nesting of an OTLP attribute value (arrays and key-value lists in one another),
    #: checked while the export is decoded, before any value is built (400).
    max_attribute_depth: int = 16
    #: Most attribute values (every array and key-value list element counted) one OTLP export
    #: request may carry, checked while it is decoded, before any value is built (413).
    max_attribute_values: int = 200_000

    #: Most tokens one call may generate: a request asking for more (``max_tokens``,
    #: ``max_completion_tokens``, ``max_output_tokens``) is generated up to this many and ends
    #: with ``finish_reason: "length"`` (``incomplete`` on Responses, ``max_tokens`` on
    #: Anthropic), as OpenAI ends a call at its limit; one call asking for a billion tokens cannot
    #: hold a batch for hours. When training, the run's ``max_completion_length`` caps it further.
    max_completion_tokens: int = 8192

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "content_part_types":
                object.__setattr__(self, f.name, frozenset(value))
            elif value is not None and not value > 0:
                raise ValueError(f"GatewayLimits.{f.name} must be > 0, got {value!r}")
        if self.receiving_body_cap() < self.max_body_bytes:
            raise ValueError(
                f"GatewayLimits.max_receiving_body_bytes ({self.max_receiving_body_bytes}) is below max_body_bytes "
                f"({self.max_body_bytes}): one allowed body could never arrive; raise it or leave it None"
            )

    def receiving_body_cap(self) -> int:
        """:attr:`max_receiving_body_bytes`, or 8 times :attr:`max_body_bytes` when it is ``None``."""
        return self.max_receiving_body_bytes if self.max_receiving_body_bytes is not None else 8 * self.max_body_bytes

    def connection_cap(self) -> int:
        """:attr:`max_connections`, or half the file-descriptor limit when it is ``None``."""
        if self.max_connections is not None:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return max(64, soft // 2) if soft != resource.RLIM_INFINITY else 32768

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GatewayLimits:
        """Defaults, overridden by ``AGENTGYM_LIGHTNING_GATEWAY_<FIELD>`` variables
        (``..._MAX_BODY_BYTES=16777216``, ``..._CONTENT_PART_TYPES=text,image_url``)."""
        environ = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            name = ENV_PREFIX + f.name.upper()
            raw = environ.get(name)
            if raw is None or raw.strip() == "":
                continue
            try:
                if f.name == "content_part_types":
                    values[f.name] = frozenset(p.strip() for p in raw.split(",") if p.strip())
                elif f.type in ("int", "int | None"):
                    values[f.name] = int(raw)
                else:
                    values[f.name] = float(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a valid {f.type}; unset it or give a number") from None
        return cls(**values)  # type: ignore[arg-type]
