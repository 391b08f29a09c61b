"""A multi-hop search agent written from scratch on the ``openai`` client.

The model answers a question by searching a passage collection: it calls ``search(query)`` as
often as it needs, sees the top-k passages of each search, and finally answers. Nothing here
knows about reinforcement learning; inside :class:`~agentgym_lightning.env.AgentEnv` each
``chat.completions.create`` is one env step, and every call is trainable
(``metadata={"role": "searcher", "trainable": "true"}``).

**One conversation.** Each request is the previous request's messages plus the model's reply and
what followed it (tool results, a nudge), so every prompt extends the last: a trainer can merge
an episode's calls into one sequence.

**Worked examples.** ``examples=N`` (0 by default, at most 2) puts N made-up two-hop questions
before the real one as real turns of the conversation (:data:`EXAMPLES`: the question, one
search per fact with its results, ``Answer: ...``), in the agent's own protocol.

**Searching.** With ``tool_mode="tools"`` (default) the request carries an OpenAI tool,
``search(query)``; each call gets a ``tool`` message with the results. Backends whose chat
template has no tool support (SmolLM2's) render the tool into the system prompt and parse the
model's ``<tool_call>`` text back into tool calls (``agentgym_lightning.policies.tool_calls``),
so the same agent works there. The **text protocol** is the fallback, always accepted and the
only one with ``tool_mode="text"`` (no ``tools`` in the request): a reply whose first directive
line is ``Search: <query>`` is a search, and its results come back in a ``user`` message.

**Results.** The top ``top_k`` passages, numbered, each ``[n] Title: text`` with the text cut
at a word boundary to ``max_passage_chars`` characters (300 by default: MuSiQue paragraphs
average ~460 characters, and three whole ones would triple a small model's prompt).

**Answering.** The documented format: a reply whose first directive line is ``Answer: <short
answer>`` ends the episode with that answer. A reply with neither directive (or with a tool call
the policy could not parse) gets a one-line reminder of the format and the episode goes on; on
the last call such a reply ends it instead, its whole text scored as the answer and flagged
``malformed``. The call before the last is followed by "No searches left"; a model still
searching on its last call has no answer (``missing``).

**Signals.** After each call the agent emits what happened, into that step's ``outcome`` (read
by ``envs/rag/plugin.py``): ``action`` (``search``, ``answer``, ``no_directive``,
``bad_tool_call``, ``unknown_tool``),
``queries``, ``retrieved`` (passage ids), ``empty_queries``, ``repeated_queries``,
``new_supporting`` (supporting passages this call found first, where the data marks them), and
after the final call ``answer`` and ``answer_status`` (``ok``, ``malformed``, ``missing``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .index import Hit

if TYPE_CHECKING:
    import openai

    from agentgym_lightning.agent import AgentContext

__all__ = ["RagAgentConfig", "RagAgent", "SEARCH_TOOL", "EXAMPLES", "parse_reply", "format_hits", "example_messages", "TOOL_MODES",
           "ANSWER_STATUSES"]

TOOL_MODES = ("tools", "text")
ANSWER_STATUSES = ("ok", "malformed", "missing")

#: The one tool, in OpenAI's format. Short on purpose: templates without tool support paste it
#: into the system prompt.
SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the passages. Returns the best matches.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "what to look for"}},
            "required": ["query"],
        },
    },
}

SYSTEM_TOOLS = (
    "Answer the question. Use the search tool to find facts, one fact per search. "
    "When you know the answer, reply with one line: Answer: <short answer>"
)
SYSTEM_TEXT = (
    "Answer the question. To search the passages, reply with one line: Search: <query>. "
    "Search one fact at a time. When you know the answer, reply with one line: Answer: <short answer>"
)
USER = "Question: {question}"
LAST_CALL = "No searches left. Reply with one line: Answer: <short answer>"
NO_DIRECTIVE_TOOLS = "Use the search tool, or reply with one line: Answer: <short answer>"
NO_DIRECTIVE_TEXT = "Reply with one line: Search: <query> or Answer: <short answer>"
BAD_TOOL_CALL = 'Your tool call could not be read. Call search with {"query": "..."}, or reply: Answer: <short answer>'

#: Worked examples shown before the question as real turns of the conversation (``examples=N``):
#: ``(question, ((query, results), ...), answer)``. The facts are made up, so no answer of the
#: data leaks into the prompt; each is two hops, one search per fact, then a short answer. Small
#: models follow a format they just saw far better than one described to them (measured for math
#: in envs/math/README.md, for search in envs/rag/README.md).
EXAMPLES: tuple[tuple[str, tuple[tuple[str, str], ...], str], ...] = (
    ("Which river flows through the capital of Norland?",
     (("capital of Norland", "[1] Norland: Norland is a small country in the north. Its capital is Vessby."),
      ("Vessby river", "[1] Vessby: Vessby is the capital of Norland. The river Alda flows through the city.")),
     "Alda"),
    ("When was the founder of Brightwater Records born?",
     (("Brightwater Records founder", "[1] Brightwater Records: Brightwater Records is a record label founded in 1971 by Ellen Marsh."),
      ("Ellen Marsh born", "[1] Ellen Marsh: Ellen Marsh (born 3 May 1940) is an American music producer.")),
     "3 May 1940"),
)

Search = Callable[[str, int], Sequence[Hit]]
Emit = Callable[[str, Any], None]


@dataclass(frozen=True)
class RagAgentConfig:
    """How the agent behaves; every field can be passed through ``make_env(**kwargs)``."""

    #: Most LLM calls per episode (searches plus the answer); the last one must answer.
    max_turns: int = 4
    #: Passages returned by each search.
    top_k: int = 3
    #: Characters of each passage's text shown to the model (cut at a word boundary).
    max_passage_chars: int = 300
    #: ``"tools"``: an OpenAI ``search`` tool (the text protocol still accepted); ``"text"``:
    #: the text protocol only, for backends that reject ``tools``.
    tool_mode: str = "tools"
    #: ``max_tokens`` of each call (``None``: the policy decides).
    max_tokens: int | None = 96
    #: Sampling temperature to ask for (``None``: the policy decides).
    temperature: float | None = None
    #: Characters of a query that are searched (longer ones are cut).
    max_query_chars: int = 300
    #: Worked examples (:data:`EXAMPLES`) shown before the question, 0 to 2.
    examples: int = 0

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {self.max_turns}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {self.top_k}")
        if self.max_passage_chars < 20:
            raise ValueError(f"max_passage_chars must be at least 20, got {self.max_passage_chars}")
        if self.tool_mode not in TOOL_MODES:
            raise ValueError(f"tool_mode must be one of {', '.join(TOOL_MODES)}, got {self.tool_mode!r}")
        if not 0 <= self.examples <= len(EXAMPLES):
            raise ValueError(f"examples must be 0 to {len(EXAMPLES)}, got {self.examples}")


_DIRECTIVE = re.compile(r"^\W*(search|answer)\W*?\s*:\s*(.*)$", re.IGNORECASE | re.MULTILINE)
_SEARCH_CALL = re.compile(r"\bsearch\s*\(\s*(?:query\s*=\s*)?([\"'])(.+?)\1\s*\)", re.IGNORECASE)


@dataclass(frozen=True)
class Reply:
    """What a text reply asks for: ``kind`` is ``search``, ``answer`` or ``none``."""

    kind: str
    value: str


def parse_reply(text: str) -> Reply:
    """Read the text protocol: the first ``Search: ...`` or ``Answer: ...`` line decides
    (``search("...")`` counts as a search); otherwise ``none``."""
    match = _DIRECTIVE.search(text)
    call = _SEARCH_CALL.search(text)
    if call is not None and (match is None or call.start() < match.start()):
        return Reply("search", call.group(2).strip())
    if match is None:
        return Reply("none", text.strip())
    return Reply(match.group(1).lower(), match.group(2).strip().strip("*").strip())


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
    return cut.rstrip(" ,;:") + " ..."


def format_hits(hits: Sequence[Hit], max_chars: int) -> str:
    """Search results as the model reads them: ``[n] Title: text``, one per line."""
    if not hits:
        return "No passages found."
    return "\n".join(f"[{i}] {h.passage.title}: {_clip(h.passage.text, max_chars)}" for i, h in enumerate(hits, 1))


def example_messages(examples: int, tools: bool) -> list[dict[str, Any]]:
    """The first ``examples`` worked examples as OpenAI chat messages: the question, each search
    (a ``search`` tool call and its ``tool`` result, or ``Search: ...`` and a ``user`` message of
    results), then ``Answer: ...``."""
    messages: list[dict[str, Any]] = []
    for i, (question, searches, answer) in enumerate(EXAMPLES[:examples]):
        messages.append({"role": "user", "content": USER.format(question=question)})
        for j, (query, results) in enumerate(searches):
            if tools:
                call_id = f"call_example_{i}_{j}"
                call = {"id": call_id, "type": "function", "function": {"name": "search", "arguments": json.dumps({"query": query})}}
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                messages.append({"role": "tool", "tool_call_id": call_id, "content": results})
            else:
                messages.append({"role": "assistant", "content": f"Search: {query}"})
                messages.append({"role": "user", "content": results})
        messages.append({"role": "assistant", "content": f"Answer: {answer}"})
    return messages


def _normalize_query(query: str) -> str:
    return " ".join(query.lower().split())


class RagAgent:
    """``agent(task, ctx) -> {"answer", "answer_status", ...}`` for :class:`AgentEnv`.

    ``task`` is a task dict of :mod:`.data` (``question``; ``supporting_ids`` when known);
    ``search(query, k)`` returns hits (a :class:`~.retriever.Retriever`'s ``search``). Use
    :meth:`run` directly with any ``openai.OpenAI`` client outside an env.
    """

    def __init__(self, search: Search, config: RagAgentConfig | None = None) -> None:
        self.search = search
        self.config = config or RagAgentConfig()

    def __call__(self, task: Mapping[str, Any], ctx: AgentContext) -> dict[str, Any]:
        return self.run(task, ctx.openai_client(), ctx.model, emit=ctx.emit_variable)

    def run(self, task: Mapping[str, Any], client: openai.OpenAI, model: str, *, emit: Emit | None = None) -> dict[str, Any]:
        cfg = self.config
        emit = emit or (lambda name, value: None)
        tools = cfg.tool_mode == "tools"
        supporting = set(task.get("supporting_ids") or [])
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_TOOLS if tools else SYSTEM_TEXT},
            *example_messages(cfg.examples, tools),
            {"role": "user", "content": USER.format(question=task["question"])},
        ]
        seen_queries: set[str] = set()
        retrieved: list[str] = []
        found_supporting: set[str] = set()
        for turn in range(cfg.max_turns):
            last_but_one = turn == cfg.max_turns - 2
            message = self._chat(client, model, messages, tools)
            text = message.content or ""
            calls = list(message.tool_calls or [])
            if calls:
                messages.append({
                    "role": "assistant",
                    "content": text,
                    "tool_calls": [
                        {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                        for c in calls
                    ],
                })
                queries = []
                for call in calls:
                    if call.function.name != "search":
                        content = f"Error: there is no tool {call.function.name!r}; the only tool is search(query)."
                    else:
                        query = _query_argument(call.function.arguments)
                        queries.append(query)
                        content = self._results(query, retrieved)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
                self._emit_search(emit, queries, seen_queries, retrieved, found_supporting, supporting)
                if last_but_one:
                    messages[-1]["content"] += "\n\n" + LAST_CALL
                continue
            reply = parse_reply(text)
            if reply.kind == "search":
                messages.append({"role": "assistant", "content": text})
                content = self._results(reply.value, retrieved)
                self._emit_search(emit, [reply.value], seen_queries, retrieved, found_supporting, supporting)
                messages.append({"role": "user", "content": content + ("\n\n" + LAST_CALL if last_but_one else "")})
                continue
            if reply.kind == "none" and turn < cfg.max_turns - 1:
                # Neither a search nor an answer (or a tool call the policy could not parse):
                # say what is expected and let the model try again.
                bad_call = "<tool_call>" in text
                emit("action", "bad_tool_call" if bad_call else "no_directive")
                messages.append({"role": "assistant", "content": text})
                reminder = BAD_TOOL_CALL if bad_call else (NO_DIRECTIVE_TOOLS if tools else NO_DIRECTIVE_TEXT)
                messages.append({"role": "user", "content": reminder + ("\n\n" + LAST_CALL if last_but_one else "")})
                continue
            answer, status = _final_answer(reply)
            emit("action", "answer")
            emit("answer", answer)
            emit("answer_status", status)
            return self._result(answer, status, turn + 1, retrieved, found_supporting, supporting)
        emit("answer_status", "missing")
        return self._result(None, "missing", cfg.max_turns, retrieved, found_supporting, supporting)

    # ------------------------------------------------------------------ pieces

    def _chat(self, client: openai.OpenAI, model: str, messages: list[dict[str, Any]], tools: bool) -> Any:
        kwargs: dict[str, Any] = {"metadata": {"role": "searcher", "trainable": "true"}}
        if tools:
            kwargs["tools"] = [SEARCH_TOOL]
        if self.config.max_tokens is not None:
            kwargs["max_tokens"] = self.config.max_tokens
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        # A copy: the SDK must not see later appends to the list it was given.
        response = client.chat.completions.create(model=model, messages=[dict(m) for m in messages], **kwargs)  # type: ignore[arg-type]
        return response.choices[0].message

    def _results(self, query: str, retrieved: list[str]) -> str:
        """Search and format the results; record the passages seen (in order, once each)."""
        query = query.strip()[: self.config.max_query_chars]
        if not query:
            return 'Error: the query is empty. Call search with a query, e.g. {"query": "..."}.'
        hits = self.search(query, self.config.top_k)
        for h in hits:
            if h.passage.id not in retrieved:
                retrieved.append(h.passage.id)
        return format_hits(hits, self.config.max_passage_chars)

    def _emit_search(self, emit: Emit, queries: list[str], seen: set[str], retrieved: list[str], found: set[str],
                     supporting: set[str]) -> None:
        empty = sum(1 for q in queries if not q.strip())
        repeated = 0
        for q in queries:
            key = _normalize_query(q)
            if key and key in seen:
                repeated += 1
            seen.add(key)
        new = [pid for pid in retrieved if pid in supporting and pid not in found]
        found.update(new)
        emit("action", "search" if queries else "unknown_tool")
        emit("queries", list(queries))
        emit("retrieved", list(retrieved))
        emit("empty_queries", empty)
        emit("repeated_queries", repeated)
        emit("new_supporting", len(new))

    @staticmethod
    def _result(answer: str | None, status: str, calls: int, retrieved: list[str], found: set[str],
                supporting: set[str]) -> dict[str, Any]:
        return {
            "answer": answer,
            "answer_status": status,
            "calls": calls,
            "retrieved": list(retrieved),
            "supporting_found": len(found),
            "supporting_total": len(supporting),
        }


def _query_argument(arguments: str | None) -> str:
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return ""
    if isinstance(args, dict):
        value = args.get("query", next((v for v in args.values() if isinstance(v, str)), ""))
        return value if isinstance(value, str) else ""
    return args if isinstance(args, str) else ""


def _final_answer(reply: Reply) -> tuple[str | None, str]:
    if reply.kind == "answer" and reply.value:
        return reply.value.splitlines()[0].strip(), "ok"
    text = " ".join(reply.value.split())
    if not text:
        return None, "missing"
    return text[:300], "malformed"
