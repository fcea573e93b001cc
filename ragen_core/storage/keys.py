"""Every row counts once, by its key: no two rows of a partition that readers count share their table's key.

The record of published parts (:mod:`ragen_core.storage.parts`) keeps files the lake did not publish out of the
readers, and a byte-for-byte copy is refused whatever a record says (``reader.check_no_copies``).
A copy in other bytes (a part read and written again, gzip-compressed, under a new part name) with a forged entry in
the record, or one recorded by ``ragen upgrade-lake`` after the records were deleted, passes both; its rows repeat
the keys of the part it copies. The tables of :data:`UNIQUE_KEYED` give each row a key of its own (the writers'
contracts refuse a batch that repeats one, and every partition's batches hold disjoint keys), so readers check it:

- **the Python readers** (``DataLake.read_table``: the trainer, ``ragen export``, ``ragen retrain --from``,
  ``ragen runs compact``) read every row of a partition anyway and check all of them (:func:`check_unique_keys`),
  inside one file as well as across its files;
- **the DuckDB views** (``ragen sql``, ``ragen runs``, the rollout viewer) read no row before the query does. The
  footer of each part file, which they read already, gives each key column's least and greatest value
  (:func:`key_bounds`); two files of a partition can share a key only when their ranges overlap in every key column
  (:func:`overlapping`). The lake's own parts never do (a partition's train rows, and its validation rows of each
  env, lie in parts of their own), so a view reads the key columns only of the files that overlap or have no
  statistics, and checks those exactly (:func:`check_files`). Measured on the lake benchmark's 1,000,000 turns (400
  files, 2 CPUs): checking every key in DuckDB took 0.12 s per query of ``turns``, as long as a whole ``SELECT
  count(*) FROM turns``; the bounds take 0.04-0.07 ms a file, from the footers the views read anyway, and no file of
  that lake overlaps another. A part file that repeats a key of its own rows is caught by the Python readers
  (0.02 s on 100,000 trajectories, 3% of reading them; 0.06 s on 500,000 turns, 19%), not by the views.

A repeated key raises :class:`DuplicateKeyError`, naming the files that hold it and what to do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ragen_core.storage.files import LakeError, parquet_errors, read_parquet, read_table_file
from schemas.tables import TableSpec
from schemas.versions import UPGRADES, UpgradeRegistry

UNIQUE_KEYED = ("trajectories", "turns", "metrics", "evaluations")  # tables whose every row has a key of its own

# per key column of a table, (least, greatest) value in one part file, None where its footer does not say; a file
# without rows has the empty tuple
Bounds = tuple[tuple[Any, Any] | None, ...]

_FILE = "__part_file"


class DuplicateKeyError(LakeError):
    """Rows of one partition that share their table's key: readers would count a row twice."""


def key_bounds(spec: TableSpec, metadata: pq.FileMetaData) -> Bounds:
    """Each key column's least and greatest value in a part file, from its footer's statistics (None for a column
    that a row group has no statistics of, or that is not stored under its name)."""
    if metadata.num_rows == 0:
        return ()
    leaves = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    return tuple(_column_bounds(metadata, leaves.get(name)) for name in spec.key)


def _column_bounds(metadata: pq.FileMetaData, index: int | None) -> tuple[Any, Any] | None:
    if index is None:
        return None
    low = high = None
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_min_max:
            return None
        low = stats.min if low is None or _before(stats.min, low) else low
        high = stats.max if high is None or _before(high, stats.max) else high
    return None if low is None else (low, high)


def _before(left: Any, right: Any) -> bool:
    return type(left) is type(right) and left < right


def may_share(left: Bounds, right: Bounds) -> bool:
    """Whether two files of a partition can hold a row of the same key: their ranges overlap in every key column
    (a column without bounds, or of values that do not compare, separates nothing)."""
    if not left or not right:
        return False
    for a, b in zip(left, right, strict=True):
        if a is not None and b is not None and (_before(a[1], b[0]) or _before(b[1], a[0])):
            return False
    return True


def overlapping(bounds: Mapping[Path, Bounds]) -> list[Path]:
    """The files of one partition (with their :func:`key_bounds`) that may share a key with another (sorted)."""
    paths = sorted(bounds)
    suspects: set[Path] = set()
    for index, path in enumerate(paths):
        for other in paths[index + 1 :]:
            if may_share(bounds[path], bounds[other]):
                suspects |= {path, other}
    return sorted(suspects)


def check_files(spec: TableSpec, files: Sequence[Path], upgrades: UpgradeRegistry = UPGRADES) -> None:
    """Read the key columns of ``files`` (one partition's) and check them with :func:`check_unique_keys`."""
    if spec.name in UNIQUE_KEYED and files:
        check_unique_keys(spec, [(path, key_columns(path, spec, upgrades)) for path in files])


def key_columns(path: Path, spec: TableSpec, upgrades: UpgradeRegistry = UPGRADES) -> pa.Table:
    """The key columns of a part file: read alone, or from the whole file in the current schema when an older
    schema version stored them under other names."""
    with parquet_errors(path):
        stored = pq.read_schema(path).names
    if all(name in stored for name in spec.key):
        return read_parquet(path, list(spec.key))
    return read_table_file(path, spec, upgrades).select(list(spec.key))


def check_unique_keys(spec: TableSpec, parts: Sequence[tuple[Path, pa.Table]]) -> None:
    """No two rows of ``parts`` (one partition's part files, each with its rows, key columns included) share the
    table's key; a key held twice raises :class:`DuplicateKeyError` naming the files that hold it. The keys are
    told apart as one integer each (:func:`_packed`); the files are found only when one repeats."""
    if spec.name not in UNIQUE_KEYED or not parts:
        return
    keys = list(spec.key)
    schema = spec.arrow_schema  # built anew on each access
    types = pa.schema([schema.field(name) for name in keys])
    tables = [_keys_of(path, table, types) for path, table in parts]
    rows = pa.concat_tables(tables)
    packed = _packed(rows, keys)
    if packed is not None and packed.size < 2:
        return
    if packed is not None:
        packed.sort()
        if not np.any(packed[1:] == packed[:-1]):
            return
    files = np.repeat(np.arange(len(tables), dtype=np.int32), [table.num_rows for table in tables])
    counted = rows.append_column(_FILE, pa.array(files)).group_by(keys)
    counted = counted.aggregate([(_FILE, "min"), (_FILE, "max"), ([], "count_all")])
    repeated = counted.filter(pc.greater(counted["count_all"], 1))
    if repeated.num_rows:
        _refuse(spec, [path for path, _ in parts], repeated)


def _keys_of(path: Path, table: pa.Table, types: pa.Schema) -> pa.Table:
    """The key columns of a file's rows in the table's types; a file that stores them otherwise raises, naming it."""
    try:
        return table.select(types.names).cast(types)
    except (KeyError, pa.ArrowException) as exc:
        raise LakeError(
            f"part file {str(path)!r} does not hold the key columns {types.names} in the table's types ({exc}); it "
            "was changed by hand or planted: move it out of the data root, then try again"
        ) from exc


_PACKED_LIMIT = 2**62  # a key packs into one int64 while the product of its columns' spans stays below it


def _packed(rows: pa.Table, keys: list[str]) -> np.ndarray | None:
    """Each row's key as one integer, the same for two rows exactly when their keys are (mixed radix: per column
    its rank among the column's values, or its offset from the least one); None when the spans overflow an int64.
    Grouping the key columns themselves took 2-3 times as long (500,000 turns: 0.15 s)."""
    code = np.zeros(rows.num_rows, np.int64)
    span = 1
    for name in keys:
        column = rows[name]
        if pa.types.is_integer(column.type):
            values = column.to_numpy().astype(np.int64)
            low = int(values.min()) if values.size else 0
            values, size = values - low, (int(values.max()) - low + 1 if values.size else 1)
        else:
            distinct = pc.unique(column)
            values, size = pc.index_in(column, value_set=distinct).to_numpy().astype(np.int64), len(distinct)
        if size == 1:
            continue  # one value (the partition's run and iteration): it tells no two rows apart
        if span * size >= _PACKED_LIMIT:
            return None
        code += values * span
        span *= size
    return code


def _refuse(spec: TableSpec, paths: list[Path], repeated: pa.Table) -> None:
    files = sorted(set(repeated[f"{_FILE}_min"].to_pylist()) | set(repeated[f"{_FILE}_max"].to_pylist()))
    named = [paths[index] for index in files]
    example = tuple(repeated.slice(0, 1).select(list(spec.key)).to_pylist()[0].values())
    held = (
        f"rows of the same key in table {spec.name!r} ({repeated.num_rows} key(s) of ({', '.join(spec.key)}) held by "
        f"more than one row, e.g. {example}): readers would count them twice"
    )
    if len(named) == 1:  # the lake never writes such a file: its contracts refuse a batch that repeats a key
        raise DuplicateKeyError(
            f"part file {str(named[0])!r} holds {held}; it was changed by hand or planted: move it out of the data "
            "root, then try again"
        )
    newest = max(named, key=_modified)
    raise DuplicateKeyError(
        f"part files {' and '.join(repr(str(path)) for path in named)} hold {held} (a copy of a part, re-encoded or "
        f"not, whatever the records of published parts say); move the copy out of the data root (the newest of them "
        f"is {newest.name!r}), then try again"
    )


def _modified(path: Path) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1
