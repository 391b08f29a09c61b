"""Agent observability: the agent's own OpenTelemetry traces joined to its LLM calls.

- :mod:`.spans` — a span as we read it (:class:`~.spans.SpanRecord`) and what kind it is under
  the GenAI semantic conventions;
- :mod:`.join` — spans joined to an episode's steps: agent names, tool spans as semantic
  variables, failures as AIR signals;
- :mod:`.processor` — in-process agents: each episode in its own trace, its spans routed to it by
  a span processor (no exporter);
- the OTLP/HTTP receiver for agents elsewhere is the gateway's (:mod:`agentgym_lightning.gateway.otlp`).
"""
