"""Text-level SQL helpers: the official evaluator's string rewrites, and SQL extraction.

Spider's official execution evaluator (test-suite-sql-eval, ``exec_eval.py`` + ``parse.py``) does
three things to both the predicted and the gold SQL *before* running them, and their side
effects are part of its verdicts:

* ``postprocess``: the text ``"> ="``, ``"< ="`` and ``"! ="`` is joined to ``>=``/``<=``/``!=``
  (a plain string replace, so it also applies inside string literals);
* ``remove_distinct``: the query is tokenized with sqlparse, **only the first statement** is kept
  (``sqlparse.parse(s)[0]``) and every token whose text is ``distinct`` (any case) is dropped;
  an empty or whitespace-only query has no first statement and crashes the official code;
* ``replace_cur_year``: ``YEAR(CURDATE())`` becomes ``2020`` when the query is executed.

sqlparse is not a dependency of this project, so :func:`official_normalize` reimplements the
part of sqlparse's lexer and statement splitter that decides those verdicts (which text is a
string, a quoted name or a comment; where the first statement ends; which tokens are a bare
``distinct``). ``tests/spider/test_sqltext.py`` pins the behaviour on the tricky cases.

:func:`extract_sql` pulls the SQL out of a model's completion (fenced blocks, bare queries,
truncated generations).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

__all__ = [
    "StatementTooLong",
    "join_split_comparisons",
    "replace_cur_year",
    "official_normalize",
    "has_order_by",
    "extract_sql",
]


def join_split_comparisons(sql: str) -> str:
    """The official ``postprocess``: join ``> =``, ``< =`` and ``! =`` (everywhere, literally)."""
    return sql.replace("> =", ">=").replace("< =", "<=").replace("! =", "!=")


_CUR_YEAR = re.compile(r"YEAR\s*\(\s*CURDATE\s*\(\s*\)\s*\)\s*", re.IGNORECASE)


def replace_cur_year(sql: str) -> str:
    """The official evaluator rewrites MySQL's ``YEAR(CURDATE())`` to ``2020`` before executing
    (a few Spider gold queries were written for MySQL)."""
    return _CUR_YEAR.sub("2020", sql)


# --------------------------------------------------------------------------- sqlparse-compatible lexing
#
# Token shapes, in the priority order sqlparse's lexer tries them (sqlparse/keywords.py, 0.4/0.5).
# Every alternative that can swallow a ``;``, a parenthesis or the word ``distinct``, or that
# decides where a word ends, is listed; the rest falls through one character at a time, which
# changes neither statement boundaries nor DISTINCT removal.
_L = "A-ZÀ-Ü"  # sqlparse's letter class (compiled with IGNORECASE, as here)
_TOKEN = re.compile(
    rf"""
      (?P<comment1>(?:--|\#\ ).*?(?:\r\n|\r|\n|$))       # single-line comment (and hint)
    | (?P<comment2>/\*[\s\S]*?\*/)                        # block comment
    | (?P<newline>\r\n|\r|\n)
    | (?P<ws>\s)                                          # one blank a token, as sqlparse
    | (?P<op2>:=|::|\*)
    | (?P<quoted>`(?:``|[^`])*`|´(?:´´|[^´])*´)          # quoted names
    | (?P<dollar>(?P<dollar_tag>(?<!\S)\$(?:[_{_L}]\w*)?\$)[\s\S]*?(?P=dollar_tag))
    | (?P<placeholder>\?|%(?:\(\w+\))?s|(?<!\w)[$:?]\w+|\\\w+)
    | (?P<kw>(?:CASE|IN|VALUES|USING|FROM|AS)\b)
    | (?P<atname>(?:@|\#\#|\#)[{_L}]\w+)
    | (?P<name>[{_L}]\w*(?=\s*\.)|(?<=\.)[{_L}]\w*|[{_L}]\w*(?=\())
    | (?P<number>-?0x[\dA-F]+|-?\d+(?:\.\d+)?E-?\d+
                 |(?![_{_L}])-?(?:\d+\.\d*|\.\d+)(?![_{_L}])
                 |(?![_{_L}])-?\d+(?![_{_L}]))
    | (?P<string>'(?:''|\\\\|\\'|[^'])*'|"(?:""|\\\\|\\"|[^"])*"|""|".*?[^\\]")
    | (?P<bracket>(?<![\w\])])\[[^\]\[]+\])
    | (?P<join>(?:(?:LEFT\s+|RIGHT\s+|FULL\s+)?(?:INNER\s+|OUTER\s+|STRAIGHT\s+)?|(?:CROSS\s+|NATURAL\s+)?)?JOIN\b)
    | (?P<end>END(?:\s+IF|\s+LOOP|\s+WHILE)?\b)
    | (?P<create>CREATE(?:\s+OR\s+REPLACE)?\b)
    | (?P<kw2>NOT\s+NULL\b|NULLS\s+(?:FIRST|LAST)\b|UNION\s+ALL\b|DOUBLE\s+PRECISION\b|GROUP\s+BY\b
              |ORDER\s+BY\b|HANDLER\s+FOR\b|(?:NOT\s+)?(?:LIKE|ILIKE|RLIKE)\b|(?:NOT\s+)?REGEXP\b)
    | (?P<word>\w[$\#\w]*)
    | (?P<punct>[;:()\[\],.])
    | (?P<cmp>[<>=~!]+)
    | (?P<op>[+/@\#%^&|-]+)
    | (?P<other>.)
    """,
    re.VERBOSE | re.IGNORECASE | re.DOTALL,
)


# Runs of characters that can start none of the tokens that matter (blanks, operators, and
# numbers not glued to a word), skipped in one match: a megabyte of `1 + 1 + ...` lexes quickly.
_BORING_ITEM = r"(?:[+*<>=~!,^&|]|\d+(?![\w$#]))"
_BORING = re.compile(rf"(?P<ws>[ \t\f\v]+)|(?P<other>{_BORING_ITEM}(?:[ \t\f\v]*{_BORING_ITEM})*)")


def _tokens(sql: str) -> Iterator[tuple[str, str]]:
    """``(kind, text)`` tokens covering ``sql`` exactly, lazily."""
    pos = 0
    n = len(sql)
    while pos < n:
        b = _BORING.match(sql, pos)
        if b is not None:
            yield b.lastgroup or "other", b.group()
            pos = b.end()
            continue
        m = _TOKEN.match(sql, pos)
        assert m is not None and m.end() > pos  # the `other` alternative always matches a char
        yield m.lastgroup or "other", m.group()
        pos = m.end()


class _Splitter:
    """sqlparse's StatementSplitter level bookkeeping: parentheses nest; an ``END`` keyword
    closes a level (even the ``END`` of a ``CASE``, so the level can go negative); inside a
    ``CREATE`` statement ``BEGIN``/``DECLARE`` (and ``IF``/``FOR``/``WHILE``/``CASE`` within a
    ``BEGIN``) open one. A ``;`` ends the statement when the level is not positive."""

    def __init__(self) -> None:
        self.level = 0
        self.is_create = False
        self.begin_depth = 0

    def feed(self, kind: str, text: str) -> None:
        if kind == "punct":
            self.level += 1 if text == "(" else -1 if text == ")" else 0
            return
        if kind == "create":
            self.is_create = True
            return
        if kind not in ("end", "kw", "word", "join", "kw2"):
            return
        unified = text.upper()
        if unified == "DECLARE" and self.is_create and self.begin_depth == 0:
            self.level += 1
        elif unified == "BEGIN":
            self.begin_depth += 1
            if self.is_create:
                self.level += 1
        elif unified == "END":
            self.begin_depth = max(0, self.begin_depth - 1)
            self.level -= 1
        elif unified in ("IF", "FOR", "WHILE", "CASE") and self.is_create and self.begin_depth > 0:
            self.level += 1
        elif unified in ("END IF", "END FOR", "END WHILE"):
            self.level -= 1


class StatementTooLong(ValueError):
    """The first statement is longer than the caller is willing to lex (see ``max_chars``)."""


def official_normalize(sql: str, *, max_chars: int | None = None) -> str | None:
    """The official ``remove_distinct`` step (after ``postprocess``), DISTINCT removal included.

    Returns the text of the first statement as sqlparse splits it (up to and including the first
    ``;`` outside strings, comments and parentheses, plus the blanks and ``--`` comments that
    follow it on the same line), with every bare ``distinct`` token removed. ``None`` when the
    text has no statement at all (empty or only whitespace): the official code raises there.

    With ``max_chars``, raises :class:`StatementTooLong` once the first statement is known to be
    longer (lexing stops there: a megabyte of hostile text costs little).
    """
    if ";" not in sql and "distinct" not in sql.lower():
        return None if not sql.strip() else sql  # one statement, nothing to remove
    tokens = _tokens(sql)
    first: list[tuple[str, str]] = []
    length = 0
    splitter = _Splitter()
    consuming_tail = False
    for kind, text in tokens:
        if consuming_tail:
            # sqlparse keeps blanks (not newlines) and single-line comments after the ';'.
            if kind == "ws" or (kind == "comment1" and not text.startswith(("--+", "# +"))):
                first.append((kind, text))
                continue
            break
        splitter.feed(kind, text)
        first.append((kind, text))
        length += len(text)
        if max_chars is not None and length > max_chars:
            raise StatementTooLong(f"the first statement is longer than {max_chars} characters")
        if splitter.level <= 0 and kind == "punct" and text == ";":
            consuming_tail = True
    if all(kind in ("ws", "newline") for kind, _ in first):
        return None
    return "".join(text for _, text in first if text.lower() != "distinct")


def has_order_by(sql: str) -> bool:
    """The official order rule: rows are compared in order iff ``'order by'`` (exactly one space)
    occurs anywhere in the (normalized) gold text, subqueries and literals included."""
    return "order by" in sql.lower()


# --------------------------------------------------------------------------- extraction from completions

_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.DOTALL | re.IGNORECASE)
# A fenced block; the closing fence may be missing when generation was cut off.
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n?(.*?)(?:```|$)", re.DOTALL)
_SQL_START = re.compile(r"(?<![\w.])(SELECT|WITH)\b", re.IGNORECASE)
_LINE_START = re.compile(r"[ \t]*(?:(?:sql|query|answer)[ \t]*[:=][ \t]*)?[(`]?[ \t]*", re.IGNORECASE)
_LABEL = re.compile(r"^\s*(?:sql(?:ite)?|query|answer|final(?:\s+(?:sql|query|answer))?)\s*[:=]\s*", re.IGNORECASE)


def _looks_like_sql(text: str) -> bool:
    return bool(re.match(r"\s*\(?\s*(SELECT|WITH)\b", text, re.IGNORECASE))


def _clean(sql: str) -> str | None:
    sql = sql.strip()
    # Inline code (`SELECT ...`) and a trailing statement terminator are not part of the query.
    if len(sql) >= 2 and sql[0] == "`" and sql[-1] == "`":
        sql = sql.strip("`").strip()
    sql = _LABEL.sub("", sql, count=1).strip()
    if sql.endswith("`") and sql.count("`") % 2 == 1:  # the end of inline code around a bare query
        sql = sql[:-1].rstrip()
    while sql.endswith(";"):
        sql = sql[:-1].rstrip()
    return sql or None


def _cut_bare_query(text: str, start: int) -> str:
    """From a bare ``SELECT``/``WITH`` to the end of the query: the first ``;`` outside strings,
    or a blank line, or a line that reads as prose after the query."""
    tail = text[start:]
    out: list[str] = []
    in_str: str | None = None
    i = 0
    while i < len(tail):
        ch = tail[i]
        if in_str:
            if ch == in_str:
                in_str = None
        elif ch in ("'", '"', "`"):
            in_str = ch
        elif ch == ";":
            break
        elif ch == "\n":
            rest = tail[i + 1 :]
            if rest.startswith("\n") or re.match(r"[ \t]*\n", rest):
                break  # a blank line ends the query
            nxt = rest.lstrip()
            # Prose after the query ("This query ...", "Explanation:") ends it too.
            if re.match(r"(This|The|Here|Explanation|Note|It|I|We|Output|Result)\b", nxt):
                break
        out.append(ch)
        i += 1
    return "".join(out)


def extract_sql(completion: str | None) -> str | None:
    """The SQL query a completion answers with, or ``None`` when it has none.

    In order of preference: the last fenced block that is labelled ``sql``/``sqlite`` or starts
    with ``SELECT``/``WITH`` (a model that revises itself puts its final answer last; an unclosed
    fence of a truncated generation still counts), where a block that starts with
    ``SELECT``/``WITH`` beats a later labelled fragment that does not (```` ```sql FROM t ``` ````
    after a whole query is rambling, not a revision); else the last bare query introduced by
    ``SELECT``/``WITH``. Reasoning in ``<think>`` tags is ignored; a trailing ``;`` is dropped.
    """
    if not completion:
        return None
    text = _THINK.sub("", completion)
    candidates: list[str] = []
    for m in _FENCE.finditer(text):
        lang, body = m.group(1).lower(), m.group(2)
        if lang in ("sql", "sqlite", "sqlite3") or _looks_like_sql(_LABEL.sub("", body.strip(), count=1)):
            cleaned = _clean(body)
            if cleaned:
                candidates.append(cleaned)
    if candidates:
        queries = [c for c in candidates if _looks_like_sql(c)]
        return (queries or candidates)[-1]
    outside = _FENCE.sub("", text) if "```" in text else text
    # Walk the bare queries left to right; a SELECT inside an earlier query (a subquery) is
    # part of that query, not a new one.
    found: list[tuple[bool, str]] = []
    pos = 0
    while (m := _SQL_START.search(outside, pos)) is not None:
        query = _cut_bare_query(outside, m.start())
        line_prefix = outside[outside.rfind("\n", 0, m.start()) + 1 : m.start()]
        at_line_start = _LINE_START.fullmatch(line_prefix) is not None
        found.append((at_line_start, query))
        pos = m.start() + max(len(query), 1)
    if not found:
        return None
    # The last query that starts a line (or follows a label) beats one quoted inside prose.
    found = [(at_start, q) for at_start, q in found if _plausible_bare_query(q)]
    if not found:
        return None
    line_queries = [q for at_start, q in found if at_start]
    return _clean((line_queries or [q for _, q in found])[-1])


def _plausible_bare_query(query: str) -> bool:
    """Prose such as "The SELECT statement: ..." is not a query: a bare query reads a table
    (``FROM``) or is a short expression list, and does not end in a colon."""
    q = query.strip().rstrip(";").strip()
    if not q or q.endswith(":"):
        return False
    return re.search(r"\bFROM\b", q, re.IGNORECASE) is not None or ":" not in q and len(q.split()) <= 12
