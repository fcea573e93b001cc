"""Two lakes, or two analyses' numbers, compared bit for bit: the evidence of a re-stamp
(:mod:`ragen_core.findings.restamp`). Floats are compared by their IEEE-754 bytes, so one ULP, a sign of zero or a
NaN's payload shows; rows are matched by their table's key, so a dropped or duplicated row shows; runs are matched by
what they are in their finding's sweep, since a point's id carries a hash of the code that ran it."""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

# The one declared list of what may differ between two runs that computed the same numbers: wall-clock times, the
# rates derived from them and the moments rows were written. Nothing else is ever excluded from a comparison.
TIMING_METRICS = ("time/", "perf/")  # metric-name prefixes: stage seconds, tokens per second, the update's cost
# per table: columns holding a moment of writing, and "column.field" for a field of a list of structs (the seconds a
# tool env's tool ran)
TIMING_COLUMNS = {"events": ("created_at",), "turns": ("tool_calls.duration_s",)}
TIMING_NUMBERS = re.compile(r"(^|/|_)(seconds|minutes|per_minute)(_|$)|^time/")  # analysis keys (filtering, diversity)

# The tables compared row by row, each by its key (schemas/tables.py): what a finding's numbers are made from.
TABLES = ("metrics", "trajectories", "turns", "events", "evaluations")


class ComparisonError(RuntimeError):
    """Two lakes that cannot be compared (a column of the old lake missing from the new one, runs of another
    probe)."""


def _canonical(value: Any) -> Any:
    """A value whose equality is bitwise: floats as their IEEE-754 bytes (so -0.0 != 0.0 and one ULP shows)."""
    if isinstance(value, float):
        return ("f", struct.pack("<d", value))
    if isinstance(value, list | tuple):
        if value and all(type(item) is int for item in value):
            return tuple(value)
        return tuple(_canonical(item) for item in value)
    if isinstance(value, dict):
        return tuple((key, _canonical(item)) for key, item in sorted(value.items()))
    return value


@dataclass
class TableDiff:
    """How two versions of one table differ: rows on one side only, and cells that differ (a few shown)."""

    table: str
    old_rows: int
    new_rows: int
    only_old: list[tuple] = field(default_factory=list)
    only_new: list[tuple] = field(default_factory=list)
    cells: list[tuple[tuple, str, Any, Any]] = field(default_factory=list)  # key, column, old, new
    differing_cells: int = 0
    # columns only the new lake holds (a column the new code added): listed, never compared, no difference
    new_columns: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not (self.only_old or self.only_new or self.differing_cells)

    def summary(self) -> str:
        if self.equal:
            added = f" (new columns, not compared: {', '.join(self.new_columns)})" if self.new_columns else ""
            return f"{self.table}: {self.old_rows} rows equal{added}"
        parts = []
        if self.only_old:
            parts.append(f"{len(self.only_old)} row(s) only in the old lake (first {self.only_old[0]})")
        if self.only_new:
            parts.append(f"{len(self.only_new)} row(s) only in the new lake (first {self.only_new[0]})")
        if self.differing_cells:
            key, column, old, new = self.cells[0]
            parts.append(f"{self.differing_cells} cell(s) differ (first {column} at {key}: {old!r} -> {new!r})")
        return f"{self.table}: " + "; ".join(parts)


def compare_tables(
    name: str, old: pa.Table, new: pa.Table, key: Sequence[str], skip: Iterable[str] = (), shown: int = 5
) -> TableDiff:
    """Every row of ``old`` and ``new`` matched by ``key`` and compared column by column, bitwise (floats by their
    bytes), but for the columns in ``skip``. A key that occurs twice on one side is a difference too. Every column of
    ``old`` must be in ``new`` (a :class:`ComparisonError` names the missing ones); a column only ``new`` holds (the
    new code stores something more) is listed in :attr:`TableDiff.new_columns` and not compared. A ``column.field`` of
    ``skip`` leaves that field of each struct of a list column out of the comparison."""
    skipped = {column for column in skip if "." not in column}
    fields: dict[str, set[str]] = {}  # a list column -> the fields of its structs left out
    for dotted in (column for column in skip if "." in column):
        column, item = dotted.split(".", 1)
        fields.setdefault(column, set()).add(item)
    columns = [c for c in old.column_names if c not in skipped]
    dropped = [c for c in columns if c not in new.column_names]
    if dropped:
        raise ComparisonError(
            f"{name}: the new lake lacks the old lake's columns {dropped} ({old.column_names} vs {new.column_names})"
        )
    diff = TableDiff(name, old.num_rows, new.num_rows)
    diff.new_columns = [c for c in new.column_names if c not in skipped and c not in old.column_names]
    sides = []
    for table in (old, new):
        rows: dict[tuple, dict[str, Any]] = {}
        for row in table.select(columns).to_pylist():
            for column, items in fields.items():
                if isinstance(row.get(column), list):
                    row[column] = [{k: v for k, v in i.items() if k not in items} for i in row[column]]
            ident = tuple(row[k] for k in key)
            if ident in rows:  # a duplicated key: the row counts twice, which is never equal
                ident = (*ident, f"duplicate #{sum(1 for r in rows if r[: len(key)] == ident)}")
            rows[ident] = row
        sides.append(rows)
    olds, news = sides
    diff.only_old = sorted((k for k in olds if k not in news), key=repr)
    diff.only_new = sorted((k for k in news if k not in olds), key=repr)
    for ident in sorted((k for k in olds if k in news), key=repr):
        a, b = olds[ident], news[ident]
        for column in columns:
            if _canonical(a[column]) != _canonical(b[column]):
                diff.differing_cells += 1
                if len(diff.cells) < shown:
                    diff.cells.append((ident, column, a[column], b[column]))
    return diff


def run_labels(lake_root: Path) -> dict[str, str]:
    """run id -> a label that names the same run in another probe's lake. A sweep point's id carries a hash of the
    code fingerprint (``<finding>-quick-<variant>-<hash>-p<i>``), so points are named by their sweep without the
    hash and their index; every other run (a bootstrap, whose id is a hash of what it is built from) by its kind and
    its place among the runs of that kind in the order they were made (the probe makes them one after another)."""
    from ragen_core.storage import query

    rows = query(lake_root, "SELECT run_id, kind, sweep_id, sweep_point FROM runs ORDER BY created_at, run_id")
    labels, made = {}, {}
    for row in rows.to_pylist():
        sweep = row["sweep_id"]
        if sweep is not None and row["sweep_point"] is not None:
            labels[row["run_id"]] = f"{re.sub(r'-[0-9a-f]{8}$', '', sweep)}#p{row['sweep_point']}"
        else:
            made[row["kind"]] = made.get(row["kind"], 0) + 1
            labels[row["run_id"]] = f"{row['kind']}#{made[row['kind']]}"
    if len(set(labels.values())) != len(labels):
        raise ComparisonError(f"{lake_root}: two runs share a label; the probe's lake holds runs of another probe")
    return labels


def stored_columns(root: Path | Any, table: str) -> set[str] | None:
    """The columns the part files of ``table`` hold in the lake at ``root`` (a data root or a ``DataLake``; None:
    it has no such file). A query returns the current schema's columns whatever the files hold (a column added
    since is null in an older file), so the old lake of a re-stamp is compared on what it stored, never on the
    nulls of a column its code did not have."""
    import pyarrow.parquet as pq

    from ragen_core.storage import DataLake

    lake = root if isinstance(root, DataLake) else DataLake(root)
    files = lake.partition_files(table)
    return set().union(*(pq.read_schema(path).names for path in files)) if files else None


def _lake_table(lake_root: Path, table: str, labels: dict[str, str]) -> pa.Table:
    """A table of the lake, the columns its files store (:func:`stored_columns`), with every run id replaced by its
    label (and, for metrics, the timing rows left out)."""
    from ragen_core.storage import query

    sql = f"SELECT * FROM {table}"  # noqa: S608  (a name from TABLES, never from a user)
    if table == "metrics":
        sql += " WHERE NOT (" + " OR ".join("starts_with(name, ?)" for _ in TIMING_METRICS) + ")"
    data = query(lake_root, sql, params=list(TIMING_METRICS) if table == "metrics" else None)
    stored = stored_columns(lake_root, table)
    if stored is not None:
        data = data.select([c for c in data.column_names if c in stored])
    if "run_id" in data.column_names:
        ids = [labels.get(r, r) for r in data.column("run_id").to_pylist()]
        data = data.set_column(data.column_names.index("run_id"), "run_id", pa.array(ids, pa.string()))
    return data


def compare_lakes(old_root: Path, new_root: Path, tables: Sequence[str] = TABLES) -> list[TableDiff]:
    """Every table of ``tables`` of the two lakes, row by row and bit by bit (:func:`compare_tables`), runs matched by
    :func:`run_labels`, the timing keys (:data:`TIMING_METRICS`, :data:`TIMING_COLUMNS`) left out; each lake as its
    files store it (:func:`stored_columns`), so a column the new code added is listed, not compared."""
    from schemas.tables import TABLES as SPECS

    old_labels, new_labels = run_labels(old_root), run_labels(new_root)
    diffs = []
    for table in tables:
        old = _lake_table(old_root, table, old_labels)
        new = _lake_table(new_root, table, new_labels)
        diffs.append(compare_tables(table, old, new, SPECS[table].key, TIMING_COLUMNS.get(table, ())))
    return diffs


def relabelled(value: Any, labels: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {labels.get(k, k): relabelled(v, labels) for k, v in value.items()}
    if isinstance(value, list):
        return [relabelled(v, labels) for v in value]
    return labels.get(value, value) if isinstance(value, str) else value


def compare_numbers(old: Any, new: Any, path: str = "", shown: int = 5) -> list[str]:
    """Where two analyses' numbers differ (bitwise for floats; NaN equals NaN of the same bytes), as ``path: old ->
    new`` lines, the keys matching :data:`TIMING_NUMBERS` left out."""
    found: list[str] = []

    def walk(a: Any, b: Any, where: str) -> None:
        if len(found) >= shown:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            kept = {k for k in (*a, *b) if not TIMING_NUMBERS.search(str(k))}
            for k in sorted(kept, key=str):
                if k not in a or k not in b:
                    found.append(f"{where}/{k}: only on one side")
                else:
                    walk(a[k], b[k], f"{where}/{k}")
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                found.append(f"{where}: {len(a)} -> {len(b)} items")
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                walk(x, y, f"{where}[{i}]")
        elif _canonical(a) != _canonical(b) and not (_is_nan(a) and _is_nan(b)):
            found.append(f"{where}: {a!r} -> {b!r}")

    walk(old, new, path)
    return found


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


__all__ = [
    "TABLES",
    "TIMING_COLUMNS",
    "TIMING_METRICS",
    "TIMING_NUMBERS",
    "ComparisonError",
    "TableDiff",
    "compare_lakes",
    "compare_numbers",
    "compare_tables",
    "relabelled",
    "run_labels",
    "stored_columns",
]
