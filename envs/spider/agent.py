"""A text-to-SQL agent written from scratch on the ``openai`` client.

The loop of the Agent Lightning paper's Spider agent: **write** a query, **execute** it,
**check** it against the question and the result, and **rewrite** it if the check fails, for at
most ``max_turns`` queries. Nothing here knows about reinforcement learning: it is a plain agent
that talks to any OpenAI-compatible endpoint. Inside :class:`~agentgym_lightning.env.AgentEnv`
each ``chat.completions.create`` becomes one env step.

Which calls are trained is marked on the request (OpenAI ``metadata``): the writer and the
rewriter (``role`` ``writer``/``rewriter``) are trainable; the checker
(``{"role": "checker", "trainable": "false"}``) is not, as in the paper, unless
``train_checker=True``. After each call the agent emits what followed it as semantic variables,
which land in that step's ``outcome``: ``sql``, ``sql_status`` (``no_sql``, ``parse_error``,
``exec_error``, ``executes``) and ``sql_error`` after a writer/rewriter call, ``check``
(``correct``/``incorrect``) after a checker call. The AIR plugin (``envs/spider/plugin.py``)
turns ``sql_status`` into intermediate rewards.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .sandbox import ExecResult, SQLSandbox
from .schema import describe_database
from .sqltext import extract_sql

if TYPE_CHECKING:
    import openai

    from agentgym_lightning.agent import AgentContext

__all__ = [
    "SpiderAgentConfig", "SpiderAgent", "SpiderAnswer", "classify_sql", "format_result", "parse_verdict",
    "SYSTEM_PROMPT_RESOURCE", "writer_system",
]

WRITER_SYSTEM = """You are an expert in SQLite. Write one SQLite query that answers the user's question over this database.
Use only the tables and columns in the schema. Reply with the query in a ```sql code block.

Database schema:
{schema}"""

#: The resource the writer's and rewriter's system prompt is read from (``ctx.resource``;
#: :mod:`agentgym_lightning.resources`), :data:`WRITER_SYSTEM` when the env has none. Its
#: ``{schema}`` is replaced by the database's schema (see :func:`writer_system`).
SYSTEM_PROMPT_RESOURCE = "system_prompt"


def writer_system(template: str, schema: str) -> str:
    """The writer's system message: ``template`` with ``{schema}`` replaced by ``schema`` (only that:
    other braces in an evolved prompt are its own text); a template without ``{schema}`` gets the
    schema appended, so the model always sees the database."""
    if "{schema}" in template:
        return template.replace("{schema}", schema)
    return f"{template}\n\nDatabase schema:\n{schema}"


# The instruction is repeated after the question: small models follow the last thing they read,
# and without it SmolLM2-135M answers in prose or copies the CREATE TABLE statements.
WRITER_USER = """Question: {question}
Answer with one SQLite SELECT query (no CREATE TABLE) in a ```sql code block."""

CHECKER_USER = """You check a SQLite query written to answer a question.

Database schema:
{schema}

Question: {question}

Query:
```sql
{sql}
```

Result of running it: {result}

Look for common mistakes: wrong tables or columns, a missing join or condition, wrong aggregation or grouping, a result that does not answer what was asked. Explain briefly, then end with one line: VERDICT: CORRECT or VERDICT: INCORRECT."""

REWRITER_USER = """Question: {question}

A previous query:
```sql
{sql}
```

Result of running it: {result}

Feedback: {feedback}

Write a corrected SQLite query that answers the question. Reply with the query in a ```sql code block."""


@dataclass(frozen=True)
class SpiderAgentConfig:
    """How the agent behaves; every field can be passed through ``make_env(**kwargs)``."""

    #: Most SQL queries written per episode (the first write plus rewrites); the checker runs
    #: between them, so an episode makes at most ``2 * max_turns - 1`` LLM calls.
    max_turns: int = 3
    #: Character budget of the schema text in prompts (see :mod:`.schema`). 2500 characters are
    #: at most ~1,250 SmolLM2 tokens on Spider's densest schema (~720 for the median one), so
    #: every prompt fits a 2k-token context with room to answer.
    max_schema_chars: int = 2500
    #: Example rows per table in the schema text.
    sample_rows: int = 3
    #: Rows of a query's result shown to the checker and the rewriter.
    result_rows_shown: int = 10
    #: Characters of a result, a previous query or the checker's feedback shown in a prompt.
    max_shown_chars: int = 600
    #: ``max_tokens`` of each call (``None``: the policy decides).
    max_tokens: int | None = 384
    #: Sampling temperature to ask for (``None``: the policy decides).
    temperature: float | None = None
    #: Train on the checker's calls too (the paper trained the writer and rewriter only).
    train_checker: bool = False
    #: Seconds a query may run when the agent executes it.
    sql_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {self.max_turns}")


@dataclass(frozen=True)
class SpiderAnswer:
    """The agent's final query and the result it got when it ran it (``None``: no SQL)."""

    sql: str
    result: ExecResult | None


def classify_sql(sql: str | None, result: ExecResult | None) -> str:
    """``no_sql``, ``executes``, ``parse_error`` (SQLite could not run it and sqlglot cannot parse it
    as SQLite) or ``exec_error`` (it parses but failed to run: unknown column, time limit...)."""
    if not sql:
        return "no_sql"
    if result is not None and result.ok:
        return "executes"
    if len(sql) > 100_000:  # parsing it is not worth the time; it cannot run either
        return "parse_error"
    try:
        import sqlglot
        from sqlglot.errors import SqlglotError
    except ImportError:  # the `spider` extra is not installed: parse errors look like exec errors
        _warn_no_sqlglot()
        return "exec_error"
    _quiet_sqlglot()
    try:
        statements = sqlglot.parse(sql, read="sqlite")
    except (SqlglotError, RecursionError, ValueError):
        return "parse_error"
    parsed = [s for s in statements if s is not None]
    # sqlglot is lenient: it wraps text it cannot parse into a raw Command, and reads a bare
    # expression ("SELEC x" is the column SELEC aliased x) as a statement. Neither is SQL.
    if not parsed or not all(_is_statement(s) for s in parsed):
        return "parse_error"
    return "exec_error"


def _is_statement(node: Any) -> bool:
    from sqlglot import exp

    if isinstance(node, exp.Command):
        return False
    kinds = tuple(
        getattr(exp, name)
        for name in ("Query", "DML", "DDL", "Create", "Drop", "Pragma", "Transaction", "Commit", "Rollback", "Attach", "Detach", "Analyze")
        if hasattr(exp, name)
    )
    return isinstance(node, kinds)


class _DropCommandFallback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Falling back to parsing as a 'Command'" not in record.getMessage()


_quieted = False


def _quiet_sqlglot() -> None:
    """sqlglot logs a warning for every unparseable statement; model output has plenty."""
    global _quieted
    if not _quieted:
        _quieted = True
        logging.getLogger("sqlglot").addFilter(_DropCommandFallback())


_warned_no_sqlglot = False


def _warn_no_sqlglot() -> None:
    global _warned_no_sqlglot
    if not _warned_no_sqlglot:
        _warned_no_sqlglot = True
        warnings.warn(
            "sqlglot is not installed, so the Spider agent reports unparseable SQL as exec_error "
            "(no spider.parse_error signal): pip install 'agentgym-lightning[spider]'",
            stacklevel=3,
        )


def format_result(result: ExecResult, max_rows: int = 10, max_chars: int = 1500) -> str:
    """A query's result as the checker/rewriter read it."""
    if not result.ok:
        return f"ERROR ({result.error}): {result.message}"
    rows = result.rows or []
    if not rows:
        return f"no rows (columns: {', '.join(result.column_names) or 'none'})"
    head = " | ".join(result.column_names)
    body = "\n".join(" | ".join("NULL" if v is None else str(v) for v in row) for row in rows[:max_rows])
    more = f"\n... ({len(rows)} rows in all)" if len(rows) > max_rows else ""
    text = f"{len(rows)} row{'s' if len(rows) != 1 else ''}:\n{head}\n{body}{more}"
    return text if len(text) <= max_chars else text[: max_chars - 4] + " ..."


_VERDICT = re.compile(r"VERDICT\s*[:\-]?\s*\**\s*(CORRECT|INCORRECT|WRONG|RIGHT)", re.IGNORECASE)


def parse_verdict(text: str | None) -> bool:
    """Whether the checker judged the query correct.

    The last ``VERDICT: ...`` line decides; without one, a reply that mentions a mistake
    (incorrect, wrong, error, should) fails the check, and one that says correct passes it. An
    empty or unreadable reply passes: a confused checker should not trigger endless rewrites.
    """
    if not text:
        return True
    found = _VERDICT.findall(text)
    if found:
        return found[-1].upper() in ("CORRECT", "RIGHT")
    lowered = text.lower()
    if re.search(r"\b(incorrect|wrong|error|mistake|should be|is not correct|isn't correct)\b", lowered):
        return False
    return True


Emit = Callable[[str, Any], None]


def _clip(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max_chars - 4] + " ..."


class SpiderAgent:
    """``agent(task, ctx) -> final SQL`` for :class:`~agentgym_lightning.env.AgentEnv`.

    ``task`` is a Spider task dict (``question``, ``db_path``; see :mod:`.data`). Use
    :meth:`run` directly with any ``openai.OpenAI`` client outside an env.
    """

    def __init__(self, config: SpiderAgentConfig | None = None, sandbox: SQLSandbox | None = None) -> None:
        self.config = config or SpiderAgentConfig()
        self.sandbox = sandbox or SQLSandbox()

    def __call__(self, task: Mapping[str, Any], ctx: AgentContext) -> str:
        return self.solve(task, ctx).sql

    def solve(self, task: Mapping[str, Any], ctx: AgentContext) -> SpiderAnswer:
        """Run inside an env; returns the final SQL with the result the agent saw for it."""
        template = ctx.resource(SYSTEM_PROMPT_RESOURCE, default=WRITER_SYSTEM)
        return self._loop(task, ctx.openai_client(), ctx.model, emit=ctx.emit_variable, cancel=ctx.cancelled,
                          system_template=template)

    # ------------------------------------------------------------------ the loop

    def run(
        self,
        task: Mapping[str, Any],
        client: openai.OpenAI,
        model: str,
        *,
        emit: Emit | None = None,
        cancel: Any = None,
    ) -> str:
        """Answer ``task["question"]`` over ``task["db_path"]``; returns the final SQL ("" if none)."""
        return self._loop(task, client, model, emit=emit, cancel=cancel).sql

    def _loop(
        self, task: Mapping[str, Any], client: openai.OpenAI, model: str, *, emit: Emit | None, cancel: Any,
        system_template: str = WRITER_SYSTEM,
    ) -> SpiderAnswer:
        cfg = self.config
        emit = emit or (lambda name, value: None)
        question = str(task["question"])
        db_path = str(task["db_path"])
        schema = describe_database(db_path, max_chars=cfg.max_schema_chars, sample_rows=cfg.sample_rows)
        system = writer_system(system_template, schema)

        reply = self._chat(client, model, [
            {"role": "system", "content": system},
            {"role": "user", "content": WRITER_USER.format(question=question)},
        ], role="writer", trainable=True)
        sql, result = self._execute(reply, db_path, emit, cancel)
        final_sql, final_result = sql or "", result
        for _turn in range(1, cfg.max_turns):
            if sql and result is not None and result.ok:
                check = self._chat(client, model, [
                    {"role": "user", "content": CHECKER_USER.format(
                        schema=schema, question=question, sql=_clip(sql, cfg.max_shown_chars),
                        result=format_result(result, cfg.result_rows_shown, cfg.max_shown_chars))},
                ], role="checker", trainable=cfg.train_checker)
                correct = parse_verdict(check)
                emit("check", "correct" if correct else "incorrect")
                if correct:
                    break
                feedback = _clip(check.strip(), cfg.max_shown_chars) or "The query does not answer the question."
            elif sql:
                # It did not run: that is the check's answer already, no checker call needed.
                feedback = "The query failed to run; fix the error."
            else:
                feedback = "The reply contained no SQL query; answer with a query in a ```sql code block."
            reply = self._chat(client, model, [
                {"role": "system", "content": system},
                {"role": "user", "content": REWRITER_USER.format(
                    question=question, sql=_clip(sql, cfg.max_shown_chars) if sql else "(none)",
                    result=(format_result(result, cfg.result_rows_shown, cfg.max_shown_chars)
                            if result is not None else "(not run)"),
                    feedback=feedback)},
            ], role="rewriter", trainable=True)
            new_sql, new_result = self._execute(reply, db_path, emit, cancel)
            if new_sql:  # a rewrite without SQL keeps the previous query
                sql, result, final_sql, final_result = new_sql, new_result, new_sql, new_result
        return SpiderAnswer(final_sql, final_result)

    # ------------------------------------------------------------------ pieces

    def _chat(
        self, client: openai.OpenAI, model: str, messages: list[dict[str, str]], *, role: str, trainable: bool
    ) -> str:
        kwargs: dict[str, Any] = {"metadata": {"role": role, "trainable": "true" if trainable else "false"}}
        if self.config.max_tokens is not None:
            kwargs["max_tokens"] = self.config.max_tokens
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        response = client.chat.completions.create(model=model, messages=messages, **kwargs)  # type: ignore[arg-type]
        return response.choices[0].message.content or ""

    def _execute(
        self, reply: str, db_path: str, emit: Emit, cancel: Any
    ) -> tuple[str | None, ExecResult | None]:
        sql = extract_sql(reply)
        result = self.sandbox.run(db_path, sql, timeout_s=self.config.sql_timeout_s, cancel=cancel) if sql else None
        status = classify_sql(sql, result)
        emit("sql", sql or "")
        emit("sql_status", status)
        emit("sql_error", f"{result.error}: {result.message}" if result is not None and not result.ok else "")
        return sql, result
