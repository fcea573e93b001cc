"""DuckDB over the lake: one view per table across every run (``SELECT ... FROM trajectories``).

- Parquet tables: a view over the published files (``read_parquet`` of the listed files, by column name; each path
  with its glob characters escaped, so a data root at ``data[1]`` never reads a sibling ``data1``). Tables with no
  files yet are empty views with the right columns, so queries never fail on a fresh root. The files of a partition
  hold no key twice (:mod:`ragen_core.storage.keys`: their footers' key ranges, the keys read where they overlap).
- ``runs``: the rows derived from the run manifests (:mod:`ragen_core.storage.runs`), registered as an Arrow table.
- Older ``schema_version`` files: columns added since are null or their default (``COALESCE``), the same rule as
  the Python reader. When a version step needs a registered upgrade function (renames, type changes), the view is
  the Python reader's upgraded table instead.
- A table that cannot be read (a damaged or unreadable file, a file newer than this code) still gets a view, one
  that fails when the statement is *bound*, with a message naming the file(s): the failure comes from a constant
  table-function argument that is only an error once the connection is locked, so no filter, grouping, join or
  statistics-based pruning can skip it (an ``error()`` evaluated per row could be, and a filtered count then read
  0). The other tables stay queryable. :func:`query` turns such failures into a :class:`LakeError`.
- ``runs``: a damaged manifest makes the view fail the same way, naming the file; ``broken_manifests="row"`` (the
  ``ragen runs`` overview) shows it instead as a row with status ``broken`` and the reason in ``error``.
- Read-only: only one query per call, decided by DuckDB's parser (:mod:`ragen_core.storage.statements`); anything
  else raises :class:`QueryRefused`. The connection is in-memory, and once the views exist it may open only the
  Parquet files the views list (``allowed_paths``; no directory, so no new file can be created anywhere), has no
  temporary directory, loads no extension, and no setting can change (``enable_external_access=false``,
  ``lock_configuration``).
- Views list their files explicitly (the read path's listing, :mod:`ragen_core.storage.reader`), so a reader never
  counts a compacted partition twice; ``run_id=`` scopes every view to one run.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from ragen_core.storage.files import VANISHED_ATTEMPTS, LakeError, VanishedFileError, damaged_files, read_json
from ragen_core.storage.keys import Bounds, check_files, key_bounds, overlapping
from ragen_core.storage.lake import DataLake
from ragen_core.storage.layout import manifest_file, run_dir
from ragen_core.storage.names import is_valid_run_id
from ragen_core.storage.reader import by_partition, relist
from ragen_core.storage.relocation import located_form
from ragen_core.storage.running import check_limits, interrupted, run_interruptible
from ragen_core.storage.runs import manifest_row, runs_table
from ragen_core.storage.statements import QueryRefused, check_read_only, referenced_tables
from ragen_core.storage.trust import check_footer, check_manifest, check_regular_file, footer
from schemas.manifest import RunManifest
from schemas.tables import ColumnSpec, TableSpec
from schemas.versions import SchemaVersionError, check_readable, needs_function, stored_version

ERROR_PREFIX = "ragen lake: "
BROKEN_STATUS = "broken"

__all__ = ["QueryRefused", "check_read_only", "connect", "query", "read_manifests"]


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


def _list_sql(texts: Iterable[str]) -> str:
    return "[" + ", ".join(_quote(text) for text in texts) + "]"


def _pattern(path: Path) -> str:
    """``path`` as a ``read_parquet`` argument that names that one file: DuckDB expands ``*``, ``?`` and ``[...]`` in
    its path arguments, so a data root at ``/x/data[1]`` read a sibling ``/x/data1``'s files; they are escaped."""
    return glob.escape(str(path))


def _nameable(path: Path) -> bool:
    """Whether DuckDB can be handed ``path``: its glob takes ``\\`` for a folder separator, so a path holding both a
    backslash and a glob character names no file (a table with such a file is read by the Python reader)."""
    return "\\" not in str(path) or _pattern(path) == str(path)


# Footers already checked by this process: (path, table, its schema version here, the file's :func:`_identity`) ->
# (the file's schema version, whether an upgrade function renamed its columns when it was checked). A long-lived
# reader (`ragen view`, a sweep's comparisons, `reproduce --all`) queries the same files again and again; their
# footers are read and checked once. A file written, replaced or removed since has another identity, so it is checked
# again: the identity the reader already trusts to see a file replaced while a query reads it.
_CHECKED_FOOTERS: dict[tuple[Any, ...], tuple[int, bool, Bounds]] = {}
_CHECKED_LIMIT = 200_000  # entries (~200 bytes each); the cache starts over beyond it


FileIdentity = tuple[int, int, int, int] | None


def _identity(path: Path) -> FileIdentity:
    """Which file ``path`` names now (None: none). A writer that removes or replaces a listed file changes it, even
    when the same name is published again before a reader looks (a redone stage)."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino, found.st_mtime_ns, found.st_ctime_ns


def _file_versions(lake: DataLake, spec: TableSpec, files: list[Path], bounds: dict[Path, Bounds]) -> set[int]:
    """The schema versions of the table's files (1 for files without one), from their footers, which are also held
    to the layout's row rules (:func:`ragen_core.storage.layout.check_footer`: the NOT NULL columns present, the rows
    of the folder's run and iteration); a damaged, too-new or misplaced file raises, naming it. Each file's key
    bounds go into ``bounds`` (:func:`~ragen_core.storage.keys.key_bounds`). A file this process checked before and
    that has not changed since is not read again (:data:`_CHECKED_FOOTERS`)."""
    versions = set()
    for path in files:
        identity = _identity(path)
        key = (str(path), spec.name, spec.version, identity)
        known = _CHECKED_FOOTERS.get(key) if identity is not None else None
        if known is not None:
            version, renamed, bounds[path] = known
            if renamed == needs_function(lake.upgrades, spec.name, version, spec.version):
                versions.add(version)
                continue
        try:
            metadata = footer(path)
        except VanishedFileError:
            raise  # removed since it was listed: the caller lists its partition again
        except LakeError as exc:
            raise LakeError(f"cannot read table {spec.name!r}: damaged Parquet file(s) {str(path)!r} ({exc})") from exc
        try:
            version = stored_version(metadata.schema.to_arrow_schema())
            check_readable(spec, version)
        except SchemaVersionError as exc:  # a newer file, or a version that is no number
            raise LakeError(f"cannot read {str(path)!r}: {exc}") from exc
        renamed = needs_function(lake.upgrades, spec.name, version, spec.version)
        check_footer(path, spec, metadata, renamed)
        versions.add(version)
        bounds[path] = key_bounds(spec, metadata)
        if identity is not None and identity == _identity(path):  # unchanged while it was read
            if len(_CHECKED_FOOTERS) >= _CHECKED_LIMIT:
                _CHECKED_FOOTERS.clear()
            _CHECKED_FOOTERS[key] = (version, renamed, bounds[path])
    return versions


def _checked_files(lake: DataLake, spec: TableSpec, files: list[Path]) -> tuple[list[Path], set[int]]:
    """The table's visible ``files`` with their footers checked (:func:`_file_versions`), and their schema versions;
    the files of a partition whose key bounds overlap are checked to share no key (:mod:`ragen_core.storage.keys`).
    A partition with a file that vanished since the listing (a compaction's last step, a redo) is listed again and
    checked whole from the fresh listing: a view holds each partition whole or not at all."""
    checked: list[Path] = []
    versions: set[int] = set()
    for partition in by_partition(files):
        for attempt in range(VANISHED_ATTEMPTS):
            try:
                bounds: dict[Path, Bounds] = {}
                versions |= _file_versions(lake, spec, partition, bounds)
                check_files(spec, overlapping(bounds), lake.upgrades)
                break
            except VanishedFileError:
                if attempt + 1 == VANISHED_ATTEMPTS:
                    raise
            partition = relist(lake, spec, partition)
            if not partition:
                break
        checked += partition
    return checked, versions


def _needs_python_upgrade(lake: DataLake, spec: TableSpec, versions: set[int]) -> bool:
    oldest = min(versions)
    if any(needs_function(lake.upgrades, spec.name, v, spec.version) for v in versions):
        return True
    return any(c.added_in > oldest and c.default is not None and _sql_literal(c.default) is None for c in spec.columns)


def _register_rows(con: duckdb.DuckDBPyConnection, name: str, rows: pa.Table) -> None:
    con.register(f"_{name}_rows", rows)
    con.execute(f"CREATE VIEW {name} AS SELECT * FROM _{name}_rows")


def _manifest_paths(lake: DataLake, run_id: str | None) -> list[Path]:
    """The manifests under ``runs/`` (only ``run_id``'s when given), found by listing, never by a pattern; a link
    or anything else in place of a manifest is listed too (it is then refused, naming it)."""
    folder = run_dir(lake.root)
    if run_id is not None:
        candidates = [manifest_file(run_dir(lake.root, run_id))]
    else:
        candidates = [manifest_file(d) for d in sorted(folder.iterdir())] if folder.is_dir() else []
    return [path for path in candidates if os.path.lexists(path)]  # a folder or FIFO in its place is broken too


def _broken_row(lake: DataLake, path: Path, message: str) -> dict:
    """A ``runs`` row standing for a manifest that cannot be read: status ``broken``, the reason in ``error``."""
    stamp = datetime.fromtimestamp(path.lstat().st_mtime, timezone.utc).isoformat()
    run_id = path.parent.name
    try:
        committed = lake.committed_iterations(run_id) if is_valid_run_id(run_id) else []
    except LakeError:
        committed = []
    row = manifest_row(RunManifest(run_id=run_id, kind="?", updated_at=stamp), committed)
    return {**row, "status": BROKEN_STATUS, "error": message}


def read_manifests(lake: DataLake, run_id: str | None = None) -> tuple[pa.Table, list[str]]:
    """The ``runs`` rows of every manifest (or of ``run_id``'s) and the problems found: a manifest that cannot be
    read or is not a run manifest becomes a row with status ``broken`` and its problem (naming the file) in ``error``,
    so one damaged manifest never hides the other runs."""
    rows, problems = [], []
    for path in _manifest_paths(lake, run_id):
        try:
            check_regular_file(path, "manifest")
            manifest = check_manifest(path, located_form(read_json(path), lake.root))  # names its folder's run
            rows.append(manifest_row(manifest, lake.committed_iterations(manifest.run_id)))
        except LakeError as exc:
            problems.append(str(exc))
            rows.append(_broken_row(lake, path, str(exc)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            problems.append(f"manifest {str(path)!r} cannot be read as a runs row: {exc!r}")
            rows.append(_broken_row(lake, path, problems[-1]))
    return runs_table(rows), problems


def _changed(files: dict[Path, FileIdentity]) -> list[Path]:
    """The files gone, or replaced since their identity was taken (each was there when it was listed)."""
    changed = []
    for path, seen in files.items():
        now = _identity(path)
        if now is None or now != seen:
            changed.append(path)
    return changed


def _create_view(
    con: duckdb.DuckDBPyConnection,
    lake: DataLake,
    spec: TableSpec,
    run_id: str | None,
    listed: dict[Path, FileIdentity],
    broken_manifests: str,
    iteration: int | None = None,
) -> None:
    """Create the view of one table (scoped to ``run_id``, and to its ``iteration``, when given); add the files it
    reads to ``listed``, each with its identity before DuckDB opens it."""
    name = spec.name
    if spec.source == "manifest":
        rows, problems = read_manifests(lake, run_id)
        if problems and broken_manifests != "row":
            raise LakeError("; ".join(problems))
        _register_rows(con, name, rows)
        return
    files, versions = _checked_files(lake, spec, lake.partition_files(name, run_id, iteration))
    listed.update((path, _identity(path)) for path in files)
    if not files:
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM _{name}_empty")
        return
    if _needs_python_upgrade(lake, spec, versions) or not all(_nameable(path) for path in files):
        _register_rows(con, name, lake.read_table(name, run_id, iteration))
        return
    columns = ", ".join(_column_sql(c, min(versions)) for c in spec.columns)
    patterns = _list_sql(_pattern(path) for path in files)
    files_sql = f"read_parquet({patterns}, union_by_name=true, hive_partitioning=false)"
    try:
        con.execute(
            f"CREATE VIEW {name} AS SELECT {columns} FROM "
            f"(SELECT * FROM {files_sql} UNION ALL BY NAME SELECT * FROM _{name}_empty)"
        )
    except duckdb.Error as exc:
        if interrupted(exc):
            raise KeyboardInterrupt from exc  # the stop, not a damaged file: never a failing view in its place
        raise _read_failure(exc, name, files) from exc


def _create_failing_view(con: duckdb.DuckDBPyConnection, spec: TableSpec, message: str) -> None:
    """A view with the table's columns that raises ``message`` whenever a statement uses it, once the connection
    is locked: ``range()``'s argument is a constant evaluated when the statement is bound, before any optimizer
    can prune a scan (a per-row ``error()`` behind a filter would never run)."""
    con.register(f"_{spec.name}_null", spec.queried_schema.empty_table())
    con.execute(f"DROP VIEW IF EXISTS {spec.name}")
    con.execute(
        f"CREATE VIEW {spec.name} AS SELECT _{spec.name}_null.* FROM _{spec.name}_null, "
        f"range(CASE WHEN current_setting('lock_configuration') THEN error({_quote(ERROR_PREFIX + message)}) "
        "ELSE 0 END)"
    )


def _kept_checkpoints(lake: DataLake, run_id: str | None) -> pa.Table:
    """``(run_id, updates)`` of every complete checkpoint folder of the data root's runs (or of ``run_id``'s)."""
    folder = run_dir(lake.root)
    runs = [run_id] if run_id is not None else sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    rows = [(run, n) for run in runs if is_valid_run_id(run) for n, _ in lake.list_checkpoints(run)]
    return pa.table(
        {"run_id": [r for r, _ in rows], "updates": [n for _, n in rows]},
        schema=pa.schema([("run_id", pa.string()), ("updates", pa.int64())]),
    )


def _checkpoint_columns(con: duckdb.DuckDBPyConnection, lake: DataLake, run_id: str | None) -> str:
    """``available``: a row's folder (``.../iteration=<n>``, or its ``hf/`` export or ``adapter/``) is a complete
    checkpoint now."""
    con.register("_checkpoints_kept", _kept_checkpoints(lake, run_id))
    updates = r"TRY_CAST(regexp_extract(s.path, '/iteration=([0-9]+)(/hf|/adapter)?$', 1) AS BIGINT)"
    return (
        f"EXISTS (SELECT 1 FROM _checkpoints_kept k WHERE k.run_id = s.run_id AND k.updates = {updates}) AS available"
    )


def _add_computed(con: duckdb.DuckDBPyConnection, lake: DataLake, spec: TableSpec, run_id: str | None) -> None:
    """The table's view with its computed columns (:attr:`~schemas.tables.TableSpec.computed`) after the stored
    ones: the stored view renamed, and a view over it adding them."""
    if not spec.computed:
        return
    if spec.name != "checkpoints":  # the one table with computed columns
        raise ValueError(f"table {spec.name!r} has computed columns, but no rule computes them")
    columns = _checkpoint_columns(con, lake, run_id)
    con.execute(f"ALTER VIEW {spec.name} RENAME TO _{spec.name}_stored")
    con.execute(f"CREATE VIEW {spec.name} AS SELECT s.*, {columns} FROM _{spec.name}_stored s")


def _lock_down(con: duckdb.DuckDBPyConnection, files: list[Path]) -> None:
    """From now on the connection opens only ``files`` (the views' Parquet files: exact paths, not folders, so no
    new file can be created anywhere), spills nothing to disk, loads no extension, and its settings cannot change.
    DuckDB holds both the pattern a view names (:func:`_pattern`) and each file it expands to against the list."""
    allowed = dict.fromkeys(text for path in files for text in (str(path), _pattern(path)))
    con.execute(f"SET allowed_paths = {_list_sql(allowed)}")
    con.execute("SET allowed_directories = []")
    con.execute("SET temp_directory = ''")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET allow_community_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _open(
    lake: DataLake,
    run_id: str | None,
    broken_manifests: str = "fail",
    memory_limit: str | None = None,
    iteration: int | None = None,
    tables: tuple[str, ...] | None = None,
) -> tuple[duckdb.DuckDBPyConnection, dict[Path, FileIdentity]]:
    no_extensions = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    con = duckdb.connect(":memory:", config=no_extensions)
    try:
        return con, _views(con, lake, run_id, broken_manifests, memory_limit, iteration, tables)
    except (duckdb.Error, RuntimeError) as exc:
        with contextlib.suppress(duckdb.Error):
            con.close()
        if interrupted(exc):
            raise KeyboardInterrupt from exc  # the stop, whichever of DuckDB's calls it landed in
        raise


def _views(
    con: duckdb.DuckDBPyConnection,
    lake: DataLake,
    run_id: str | None,
    broken_manifests: str,
    memory_limit: str | None,
    iteration: int | None,
    tables: tuple[str, ...] | None,
) -> dict[Path, FileIdentity]:
    """Create the views of ``lake``'s tables on ``con`` and lock it down; the files they read, each with its
    identity when listed."""
    files: dict[Path, FileIdentity] = {}
    for spec in lake.tables.values():
        if tables is not None and spec.name not in tables:
            continue
        con.register(f"_{spec.name}_empty", spec.arrow_schema.empty_table())
        try:
            _create_view(con, lake, spec, run_id, files, broken_manifests, iteration)
            _add_computed(con, lake, spec, run_id)
        except LakeError as exc:
            _create_failing_view(con, spec, str(exc))
    if memory_limit is not None:  # checked by check_limits: a size, never other SQL
        con.execute(f"SET memory_limit = '{memory_limit}'")
    _lock_down(con, list(files))
    return files


def connect(
    root: str | Path | DataLake, run_id: str | None = None, broken_manifests: str = "fail"
) -> duckdb.DuckDBPyConnection:
    """An in-memory, locked-down DuckDB connection with a view per table over the published rows of ``root`` (of
    every run, or only of ``run_id``). It cannot write files, but it runs any statement given to it: hand users
    :func:`query`, which admits only read-only queries."""
    lake = root if isinstance(root, DataLake) else DataLake(root)
    return _open(lake, run_id, broken_manifests)[0]


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


def query(
    root: str | Path | DataLake,
    sql: str,
    run_id: str | None = None,
    params: list | dict | None = None,
    broken_manifests: str = "fail",
    timeout: float | None = None,
    memory_limit: str | None = None,
    iteration: int | None = None,
    tables: tuple[str, ...] | None = None,
) -> pa.Table:
    """Run one read-only query against the lake at ``root`` (every run, or only ``run_id``) as an Arrow table.

    A statement that is not a query raises :class:`QueryRefused`; a failure to read the lake's files raises
    :class:`LakeError` naming the file(s); SQL mistakes raise DuckDB's own error. ``params`` binds ``?`` / ``$name``
    placeholders (a run id is always a parameter, never text in the SQL). When a file the views read was removed
    or replaced between listing and reading (a concurrent compaction, a redone stage) and the query failed, it runs
    again on a fresh listing (up to ``VANISHED_ATTEMPTS`` times, each after such a writer's step). A damaged manifest
    fails a query of ``runs`` unless ``broken_manifests="row"`` (then it is a row with status ``broken``).
    ``timeout`` (seconds) stops a query that runs longer (:class:`QueryTimeout`); ``memory_limit`` (a size: '4GB')
    is DuckDB's: it bounds the memory of the query's operators (joins, sorts, aggregates; nothing spills to disk),
    not a single value a function builds. ``iteration`` (with ``run_id``) scopes the Parquet tables to that one
    partition and ``tables`` names the only tables that get a view: a reader of one iteration of a big lake (the
    rollout viewer's pages) lists and opens that partition's files alone. Without ``tables``, the views are those of
    the tables the statement names (:func:`~ragen_core.storage.statements.referenced_tables`): a query of
    ``metrics`` lists no trajectory file; when its parse tree cannot tell, or a name is still unknown, every table's.
    """
    check_limits(timeout, memory_limit)
    if iteration is not None and run_id is None:
        raise ValueError("iteration= scopes one run's partition: give run_id= too")
    lake = root if isinstance(root, DataLake) else DataLake(root)
    statement = check_read_only(sql)  # what runs is the text DuckDB's parser classified, never the raw input
    named = referenced_tables(statement) if tables is None else None
    narrowed = named is not None
    if narrowed:
        tables = tuple(name for name in lake.tables if name in named)
    attempt = 0
    while attempt < VANISHED_ATTEMPTS:
        con, files = _open(lake, run_id, broken_manifests, memory_limit, iteration, tables)  # files: those read
        try:
            return run_interruptible(con, statement, params, timeout)
        except duckdb.Error as exc:
            if narrowed and isinstance(exc, duckdb.CatalogException):  # a name the tree did not show: every view
                narrowed, tables = False, None
                continue
            attempt += 1
            changed = _changed(files)  # a writer removed or replaced a file the views read: list again
            if changed and attempt < VANISHED_ATTEMPTS:
                continue
            if changed:  # DuckDB reports a listed file that is gone as a pattern it may not expand, or worse
                raise VanishedFileError(changed[0]) from exc
            translated = _translate(exc, lake)
            if translated is None:
                raise
            raise translated from exc
        finally:
            try:
                con.close()
            except duckdb.Error:  # still busy with a query that a stop left behind: it closes when that ends
                pass
    raise AssertionError("unreachable: the last attempt returns or raises")
