"""DuckDB over the lake: one view per table across every run (``SELECT ... FROM trajectories``).

- Parquet tables: a view over the published files (``read_parquet`` of the table's glob, by column name). Tables
  with no files yet are empty views with the right columns, so queries never fail on a fresh root.
- ``runs``: the rows derived from the run manifests (:mod:`ragen_core.storage.runs`), registered as an Arrow table.
- Older ``schema_version`` files: columns added since are null or their default (``COALESCE``), the same rule as
  the Python reader. When a version step needs a registered upgrade function (renames, type changes), the view is
  the Python reader's upgraded table instead.
- A table that cannot be read (a damaged file, a file newer than this code) still gets a view, one that fails when
  queried with a message naming the file(s); the other tables stay queryable. :func:`query` turns such failures
  into a :class:`LakeError`.
- Read-only: only one query per call (SELECT / WITH / DESCRIBE / SHOW / SUMMARIZE / EXPLAIN); anything else raises
  :class:`QueryRefused`. The connection is in-memory, and once the views exist it may touch no file outside the data
  root and no setting can change (``enable_external_access=false``, ``allowed_directories``,
  ``lock_configuration``), so a query cannot write the lake or read elsewhere.
- Views list their files explicitly (the compaction rule of :mod:`ragen_core.storage.parts`), so a reader never
  counts a compacted partition twice; ``run_id=`` scopes every view to one run.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pyarrow as pa

from ragen_core.storage.files import LakeError, damaged_files
from ragen_core.storage.lake import DataLake
from schemas.tables import ColumnSpec, TableSpec
from schemas.versions import NewerSchemaError, check_readable

ERROR_PREFIX = "ragen lake: "
READ_ONLY_STATEMENTS = (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN)
QUERY_ATTEMPTS = 3


class QueryRefused(LakeError):
    """A statement that is not a single read-only query."""


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _sql_literal(value: object) -> str | None:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _quote(value)
    return None


def _column_sql(column: ColumnSpec, oldest_version: int) -> str:
    name = '"' + column.name.replace('"', '""') + '"'
    if column.added_in > oldest_version and column.default is not None:
        return f"COALESCE({name}, {_sql_literal(column.default)}) AS {name}"
    return name


def _read_failure(exc: duckdb.Error, table: str, files: list[Path]) -> LakeError:
    """A :class:`LakeError` for a DuckDB read failure, naming the damaged file(s) even when DuckDB does not."""
    message = str(exc).splitlines()[0]
    named = [f for f in files if str(f) in str(exc)] or damaged_files(files)
    if named:
        listed = ", ".join(repr(str(f)) for f in named)
        return LakeError(f"cannot read table {table!r}: damaged Parquet file(s) {listed} ({message})")
    return LakeError(f"cannot read table {table!r} from {len(files)} file(s): {message}")


def _files_sql(files: list[Path]) -> str:
    return "[" + ", ".join(_quote(str(f)) for f in files) + "]"


def _file_versions(con: duckdb.DuckDBPyConnection, spec: TableSpec, files: list[Path]) -> set[int]:
    """The schema versions of the table's files (1 for files without one); too-new files raise."""
    try:
        found = con.execute(
            f"SELECT file_name, decode(value) FROM parquet_kv_metadata({_files_sql(files)}) "
            "WHERE key = 'schema_version'::BLOB"
        ).fetchall()
    except duckdb.Error as exc:
        raise _read_failure(exc, spec.name, files) from exc
    by_file = {Path(name): int(version) for name, version in found}
    for path, version in by_file.items():
        try:
            check_readable(spec, version)
        except NewerSchemaError as exc:
            raise LakeError(f"cannot read {str(path)!r}: {exc}") from exc
    return set(by_file.values()) | ({1} if len(by_file) < len(files) else set())


def _needs_python_upgrade(lake: DataLake, spec: TableSpec, versions: set[int]) -> bool:
    oldest = min(versions)
    if any(lake.upgrades.has_function(spec.name, v, spec.version) for v in versions):
        return True
    return any(c.added_in > oldest and c.default is not None and _sql_literal(c.default) is None for c in spec.columns)


def _register_rows(con: duckdb.DuckDBPyConnection, name: str, rows: pa.Table) -> None:
    con.register(f"_{name}_rows", rows)
    con.execute(f"CREATE VIEW {name} AS SELECT * FROM _{name}_rows")


def _create_view(
    con: duckdb.DuckDBPyConnection, lake: DataLake, spec: TableSpec, run_id: str | None, listed: list[Path]
) -> None:
    """Create the view of one table (scoped to ``run_id`` when given); add the files it reads to ``listed``."""
    name = spec.name
    if spec.source == "manifest":
        _register_rows(con, name, lake.read_table(name, run_id))
        return
    files = lake.partition_files(name, run_id)
    listed += files
    if not files:
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM _{name}_empty")
        return
    versions = _file_versions(con, spec, files)
    if _needs_python_upgrade(lake, spec, versions):
        _register_rows(con, name, lake.read_table(name, run_id))
        return
    columns = ", ".join(_column_sql(c, min(versions)) for c in spec.columns)
    files_sql = f"read_parquet({_files_sql(files)}, union_by_name=true, hive_partitioning=false)"
    try:
        con.execute(
            f"CREATE VIEW {name} AS SELECT {columns} FROM "
            f"(SELECT * FROM {files_sql} UNION ALL BY NAME SELECT * FROM _{name}_empty)"
        )
    except duckdb.Error as exc:
        raise _read_failure(exc, name, files) from exc


def _create_failing_view(con: duckdb.DuckDBPyConnection, spec: TableSpec, message: str) -> None:
    """A view with the table's columns that raises ``message`` when queried."""
    con.register(f"_{spec.name}_null", pa.table({c.name: pa.nulls(1, c.type) for c in spec.columns}))
    con.execute(f"DROP VIEW IF EXISTS {spec.name}")
    con.execute(
        f"CREATE VIEW {spec.name} AS SELECT * FROM _{spec.name}_null WHERE error({_quote(ERROR_PREFIX + message)}) "
        "IS NULL"
    )


def _lock_down(con: duckdb.DuckDBPyConnection, root: Path) -> None:
    """From now on the connection reads only under ``root`` and its settings cannot change."""
    con.execute(f"SET allowed_directories = [{_quote(str(root) + os.sep)}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _open(lake: DataLake, run_id: str | None) -> tuple[duckdb.DuckDBPyConnection, list[Path]]:
    con = duckdb.connect(":memory:")
    files: list[Path] = []
    for spec in lake.tables.values():
        con.register(f"_{spec.name}_empty", spec.arrow_schema.empty_table())
        try:
            _create_view(con, lake, spec, run_id, files)
        except LakeError as exc:
            _create_failing_view(con, spec, str(exc))
    _lock_down(con, lake.root)
    return con, files


def connect(root: str | Path | DataLake, run_id: str | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory, read-only DuckDB connection with a view per table over the published rows of ``root``
    (of every run, or only of ``run_id``)."""
    lake = root if isinstance(root, DataLake) else DataLake(root)
    return _open(lake, run_id)[0]


def check_read_only(sql: str) -> None:
    """Refuse anything but one query (SELECT, WITH, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN); SQL syntax errors stay
    DuckDB's own."""
    statements = duckdb.extract_statements(sql)
    if len(statements) != 1:
        raise QueryRefused(f"give exactly one query, not {len(statements)} statements")
    kind = statements[0].type
    if kind not in READ_ONLY_STATEMENTS:
        raise QueryRefused(
            f"{kind.name} statements are refused: the lake is read-only here, only queries run (SELECT, WITH, "
            "DESCRIBE, SHOW, SUMMARIZE, EXPLAIN); to save a result use `ragen sql ... --format csv|json|parquet "
            "--out FILE`"
        )


def _translate(exc: duckdb.Error, lake: DataLake) -> LakeError | None:
    """The :class:`LakeError` a DuckDB failure stands for, or None when it is not about the lake's files."""
    text = str(exc)
    if ERROR_PREFIX in text:
        return LakeError(text.split(ERROR_PREFIX, 1)[1].splitlines()[0])
    if not isinstance(exc, (duckdb.IOException, duckdb.InvalidInputException)):
        return None
    for spec in lake.tables.values():
        files = lake.partition_files(spec.name) if spec.source == "parquet" else []
        if any(str(f) in text for f in files) or (files and damaged_files(files)):
            return _read_failure(exc, spec.name, files)
    return None


def query(root: str | Path | DataLake, sql: str, run_id: str | None = None) -> pa.Table:
    """Run one read-only query against the lake at ``root`` (every run, or only ``run_id``) as an Arrow table.

    A statement that is not a query raises :class:`QueryRefused`; a failure to read the lake's files raises
    :class:`LakeError` naming the file(s); SQL mistakes raise DuckDB's own error. When a file vanished between
    listing and reading (a concurrent compaction), the query runs again on a fresh listing.
    """
    lake = root if isinstance(root, DataLake) else DataLake(root)
    check_read_only(sql)
    for attempt in range(QUERY_ATTEMPTS):
        con, files = _open(lake, run_id)
        try:
            relation = con.sql(sql)
            return relation.to_arrow_table() if relation is not None else pa.table({})
        except duckdb.Error as exc:
            if attempt + 1 < QUERY_ATTEMPTS and any(not f.exists() for f in files):
                continue
            translated = _translate(exc, lake)
            if translated is None:
                raise
            raise translated from exc
        finally:
            con.close()
    raise AssertionError("unreachable: the last attempt returns or raises")
