"""What a SQL text is, decided by DuckDB's own parser: only one read-only query may reach the lake's connection.

Why parsing and not the first word: ``EXPLAIN ANALYZE COPY ... TO ...`` is an EXPLAIN statement that executes the
COPY; DuckDB 2.0 also accepts data-changing common table expressions (``WITH t AS (DELETE ... RETURNING *) SELECT``),
which are SELECT statements by type. So:

- the text must hold exactly one statement (:func:`duckdb.extract_statements`), of type SELECT (``SELECT``, ``WITH``,
  ``FROM``, ``VALUES``, ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``, ``UNPIVOT`` are all SELECTs) or EXPLAIN;
- a SELECT's whole parse tree (``json_serialize_sql``) may hold only SELECT, set-operation and recursive-CTE query
  nodes; when DuckDB cannot serialize it (``PIVOT`` in a subquery), no keyword token of a writing statement may
  appear in it;
- ``EXPLAIN [ANALYZE] <query>``: the inner statement passes the same check, and what runs is rebuilt from the checked
  inner text (EXPLAIN options such as ``(FORMAT json)`` are refused rather than interpreted by us).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from typing import Any

import duckdb

from ragen_core.storage.files import LakeError

READ_ONLY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
WRITING_KEYWORDS = frozenset(
    {
        "insert",
        "update",
        "delete",
        "copy",
        "merge",
        "create",
        "drop",
        "alter",
        "attach",
        "detach",
        "install",
        "load",
        "set",
        "reset",
        "pragma",
        "call",
        "export",
        "import",
        "vacuum",
        "checkpoint",
        "truncate",
        "use",
        "prepare",
        "execute",
    }
)
HINT = (
    "the lake is read-only here, only queries run (SELECT, WITH, FROM, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN [ANALYZE] "
    "of a query); to save a result use `ragen sql ... --format csv|json|parquet --out FILE`"
)


class QueryRefused(LakeError):
    """A statement that is not a single read-only query."""


def _parser() -> duckdb.DuckDBPyConnection:
    """A private in-memory connection used only to parse: no file access, no extensions."""
    return duckdb.connect(
        ":memory:",
        config={
            "enable_external_access": False,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
        },
    )


def _one_statement(sql: str) -> duckdb.Statement:
    statements = duckdb.extract_statements(sql)
    if len(statements) != 1:
        raise QueryRefused(f"give exactly one query, not {len(statements)} statements")
    return statements[0]


def _dicts(tree: Any) -> Iterator[dict[str, Any]]:
    """Every mapping anywhere in a serialized parse tree."""
    if isinstance(tree, dict):
        yield tree
        for value in tree.values():
            yield from _dicts(value)
    elif isinstance(tree, list):
        for value in tree:
            yield from _dicts(value)


def _node_types(tree: Any) -> Iterator[str]:
    """Every query-node type (``..._NODE``) anywhere in a serialized parse tree."""
    for node in _dicts(tree):
        kind = node.get("type")
        if isinstance(kind, str) and kind.endswith("_NODE"):
            yield kind


def _keywords(sql: str) -> set[str]:
    """The keyword tokens of ``sql`` (not identifiers, strings or comments), lower-case."""
    found = set()
    for offset, kind in duckdb.tokenize(sql):
        if kind == duckdb.token_type.keyword:
            word = re.match(r"\w+", sql[offset:])
            if word:
                found.add(word.group(0).lower())
    return found


def _check_select(sql: str) -> None:
    """Refuse a SELECT statement whose parse tree holds anything but read-only query nodes."""
    tree = _serialized(sql)
    if not tree.get("error"):
        writing = sorted({kind for kind in _node_types(tree) if kind not in READ_ONLY_NODES})
        if writing:
            names = ", ".join(k.removesuffix("_QUERY_NODE").removesuffix("_NODE") for k in writing)
            raise QueryRefused(f"a query that changes data ({names}) is refused: {HINT}")
        return
    writing = sorted(_keywords(sql) & WRITING_KEYWORDS)  # DuckDB cannot serialize it: no writing keyword at all
    if writing:
        raise QueryRefused(f"a query containing {', '.join(w.upper() for w in writing)} is refused: {HINT}")


@functools.lru_cache(maxsize=256)
def _serialized(sql: str) -> dict[str, Any]:
    """DuckDB's parse tree of ``sql`` (``json_serialize_sql``); ``{"error": true, ...}`` where it cannot serialize.
    Kept per statement text (the read-only check and :func:`referenced_tables` read the same tree of each query);
    callers only read it."""
    con = _parser()
    try:
        return json.loads(con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    finally:
        con.close()


def referenced_tables(sql: str) -> frozenset[str] | None:
    """The names (lower-case: DuckDB's names ignore case, quoted or not) that a query reads as tables, from its parse
    tree: every ``FROM``/``JOIN`` source at any depth, CTE names included. None when the tree cannot say which
    tables the query sees: a table function (``duckdb_views()``), a ``SHOW``/``DESCRIBE``/``SUMMARIZE``, a qualified
    name (``information_schema.tables``, ``main.runs``) or a statement DuckDB cannot serialize (``EXPLAIN``). A reader
    that gives a query the views of these tables alone must give it all of them when a name is still unknown."""
    tree = _serialized(sql)
    if tree.get("error"):
        return None
    names = set()
    for node in _dicts(tree):
        kind = node.get("type")
        if kind in ("TABLE_FUNCTION", "SHOW_REF"):
            return None
        if kind == "BASE_TABLE":
            if node.get("schema_name") or node.get("catalog_name"):
                return None
            names.add(str(node.get("table_name", "")).lower())
    return frozenset(names)


def _explained(sql: str) -> tuple[str, str]:
    """``("EXPLAIN " or "EXPLAIN ANALYZE ", inner statement text)`` of an EXPLAIN statement."""
    tokens = [(offset, kind) for offset, kind in duckdb.tokenize(sql) if kind != duckdb.token_type.comment]
    words = [(offset, (re.match(r"\w*", sql[offset:]).group(0) or sql[offset]).lower()) for offset, _ in tokens]
    position, prefix = 1, "EXPLAIN "
    if len(words) > 1 and words[1][1] in ("analyze", "analyse"):
        position, prefix = 2, "EXPLAIN ANALYZE "
    if not words or words[0][1] != "explain" or len(words) <= position or words[position][1] == "(":
        raise QueryRefused(f"EXPLAIN takes a plain query here: EXPLAIN [ANALYZE] SELECT ...; {HINT}")
    return prefix, sql[words[position][0] :]


def check_read_only(sql: str) -> str:
    """The statement to run for ``sql`` if it is one read-only query; else :class:`QueryRefused`. SQL syntax
    errors stay DuckDB's own (``duckdb.ParserException``)."""
    statement = _one_statement(sql)
    if statement.type == duckdb.StatementType.SELECT:
        _check_select(statement.query)
        return sql
    if statement.type == duckdb.StatementType.EXPLAIN:
        prefix, inner = _explained(statement.query)
        try:
            inner_statement = _one_statement(inner)
        except duckdb.ParserException as exc:
            raise QueryRefused(f"EXPLAIN takes a plain query here: EXPLAIN [ANALYZE] SELECT ...; {exc}") from exc
        if inner_statement.type != duckdb.StatementType.SELECT:
            raise QueryRefused(f"EXPLAIN of a {inner_statement.type.name} statement is refused: {HINT}")
        _check_select(inner_statement.query)
        return prefix + inner_statement.query
    raise QueryRefused(f"{statement.type.name} statements are refused: {HINT}")


_SOURCE_LINE = re.compile(r"^LINE (\d+): ")  # DuckDB's quote of the query, above a caret line pointing into it


def one_line(message: str) -> str:
    """``message`` as one line: its non-empty lines joined (``; ``, or a space after a line ending in ``:``, as
    ``invalid config:`` and its keys), a quoted source line with a caret under it (DuckDB's syntax errors) said as
    ``(at line L, column C)``. Control characters are left to whoever shows it (the CLI escapes them)."""
    raw = [line for line in message.splitlines() if line.strip()]
    lines: list[str] = []
    for index, line in enumerate(raw):
        quoted = _SOURCE_LINE.match(raw[index - 1]) if index else None
        if quoted and set(line.strip()) == {"^"} and lines:
            lines[-1] = f"(at line {quoted.group(1)}, column {line.index('^') - quoted.end() + 1})"
        else:
            lines.append(line.strip())
    joined = "".join(
        line if not index else (" " if lines[index - 1].endswith(":") or line.startswith("(at line ") else "; ") + line
        for index, line in enumerate(lines)
    )
    return joined
