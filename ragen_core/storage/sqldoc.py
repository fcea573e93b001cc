"""docs/sql.md is generated and checked from code, so it cannot drift from the tables.

- The column reference between ``COLUMNS_BEGIN`` and ``COLUMNS_END`` is generated from the table specs
  (:mod:`schemas.tables`), with the types DuckDB shows. Regenerate it with
  ``python -m ragen_core.storage.sqldoc docs/sql.md``; a test fails while it is stale.
- Worked queries are fenced ```` ```sql ```` blocks whose first line is ``-- name: <name>``; tests and the lake
  benchmark read them with :func:`named_queries`, so what the page shows is what is tested and timed.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path

import duckdb

from schemas.tables import TABLES, TableSpec

COLUMNS_BEGIN = "<!-- columns:begin (generated: python -m ragen_core.storage.sqldoc docs/sql.md) -->"
COLUMNS_END = "<!-- columns:end -->"
_SQL_BLOCK = re.compile(r"```sql\n(.*?)```", re.DOTALL)
_NAME = re.compile(r"--\s*name:\s*([a-z0-9_]+)\s*\n")


def duckdb_types(spec: TableSpec) -> dict[str, str]:
    """Column name -> the type DuckDB shows for it (``DESCRIBE``)."""
    con = duckdb.connect(":memory:")
    try:
        con.register("t", spec.queried_schema.empty_table())
        return {name: kind for name, kind, *_ in con.execute("DESCRIBE t").fetchall()}
    finally:
        con.close()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_markdown(spec: TableSpec) -> str:
    """The reference section of one table: description, key, source, one row per column."""
    types = duckdb_types(spec)
    source = "run manifests (`runs/<run_id>/manifest.json`)" if spec.source == "manifest" else "Parquet"
    lines = [
        f"### `{spec.name}`",
        "",
        f"{spec.description} Key: `({', '.join(spec.key)})`. Source: {source}. Schema version {spec.version}.",
        "",
        "| column | type | nullable | description |",
        "|---|---|---|---|",
    ]
    for column in (*spec.columns, *spec.computed):
        nullable = "yes" if column.nullable else ""
        lines.append(f"| `{column.name}` | {types[column.name]} | {nullable} | {_cell(column.description)} |")
    return "\n".join(lines)


def columns_markdown(tables: Mapping[str, TableSpec] = TABLES) -> str:
    """The generated column reference of every table."""
    return "\n\n".join(table_markdown(spec) for spec in tables.values())


def update_columns(text: str, tables: Mapping[str, TableSpec] = TABLES) -> str:
    """``text`` with its generated section replaced by the current column reference."""
    if COLUMNS_BEGIN not in text or COLUMNS_END not in text:
        raise ValueError(f"the page has no generated section: add the lines {COLUMNS_BEGIN!r} and {COLUMNS_END!r}")
    head, rest = text.split(COLUMNS_BEGIN, 1)
    _, tail = rest.split(COLUMNS_END, 1)
    return f"{head}{COLUMNS_BEGIN}\n{columns_markdown(tables)}\n{COLUMNS_END}{tail}"


def named_queries(text: str) -> dict[str, str]:
    """The page's worked queries: name -> SQL (without the name line), in page order; duplicate names raise."""
    queries: dict[str, str] = {}
    for block in _SQL_BLOCK.findall(text):
        match = _NAME.match(block)
        if match is None:
            continue
        name = match.group(1)
        if name in queries:
            raise ValueError(f"two worked queries are named {name!r}")
        queries[name] = block[match.end() :].strip()
    return queries


def main(argv: list[str] | None = None) -> int:
    """Regenerate the column reference of the page given as the only argument."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m ragen_core.storage.sqldoc docs/sql.md", file=sys.stderr)
        return 2
    path = Path(args[0])
    path.write_text(update_columns(path.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
