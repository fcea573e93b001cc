"""Compaction: merge a run's part files into one file per (table, iteration), atomically for readers.

Only committed iterations are compacted: their partitions receive no more writes, so nothing can be published into
a partition while it is merged. One partition, in this order (:func:`compact_partition`):

1. recover: finish or neutralise an earlier compaction of the partition that stopped half-way (below);
2. write the marker ``.compaction.json`` = ``{"merged": "part-compacted-<digest>.parquet", "replaces": [...],
   "rows": <n>}`` (atomic); the digest is of the replaced names, so a redo picks the same name;
3. write the merged file: rows of the replaced files in reader order, in the current schema, under a hidden
   temporary name, fsync, record its name and size among the partition's published parts
   (:mod:`ragen_core.storage.parts`), then one rename to its final name. **This rename is the commit point**;
4. delete the replaced files, then take them out of the record.

Readers list the part files, then read the marker, and skip what the marker replaces only when the listing holds
the merged file (:mod:`ragen_core.storage.reader`). So a crash

- before or during 2, or during 3 before the rename: the merged file is absent, the marker (if any) is inert, the
  old parts are the visible set; a hidden ``.part-compacted-*.tmp-*`` file may remain, recovery deletes it;
- after the rename, before or during 4: the merged file is visible and hides every replaced file still present;
  recovery deletes them.

Either way readers see every row exactly once. Before anything is read or deleted, the run's folders and every
marker are held to the layout (:mod:`ragen_core.storage.layout`): a marker naming anything but plain part files of
its own folder, or one whose merged file holds fewer rows than the files it would hide, stops the compaction of the
whole run, naming the marker, with nothing deleted; so does a part file whose rows are not its folder's, or a link
in place of a folder. The marker is kept afterwards: it names only files that no longer
exist, and the next compaction of the partition (after its recovery step) overwrites it. A reader that listed
files just before a compaction deleted them finds them gone; the lake's readers then list that partition again
(``DataLake.read_table``, ``catalog.query``: :class:`~ragen_core.storage.files.VanishedFileError`), and a replaced
file that is gone when the marker is checked counts as absent. Compactions and removals of one run hold an
exclusive lock (``_locks/<run_id>.lock``, released by the OS if the process dies); a compaction also holds the run's
writer lock, so it never runs beside a command that writes the run (an extension reopens the last committed
iteration, which a compaction may have merged).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from ragen_core.storage.files import (
    LakeError,
    atomic_write_json,
    atomic_write_parquet,
    fsync_dir,
)
from ragen_core.storage.lake import DataLake
from ragen_core.storage.layout import compaction_marker
from ragen_core.storage.locks import RunLockedError, acquire, lock_path, read_holder, release, run_lock
from ragen_core.storage.names import validate_run_id
from ragen_core.storage.parts import MERGED_PREFIX, merged_name, record_parts
from ragen_core.storage.reader import read_marker, read_part, superseded, trusted_parts
from ragen_core.storage.storecopy import store_copy
from ragen_core.storage.trust import (
    check_real_folder,
    iteration_folders,
    part_files,
    partition_of,
)
from ragen_core.storage.versioning import layout_state
from schemas.tables import TableSpec


@dataclass(frozen=True)
class PartitionCompaction:
    """One merged partition: how many files it had, how many rows, and the merged file's name."""

    table: str
    iteration: int
    files_before: int
    rows: int
    merged: str


@dataclass
class CompactionReport:
    """What :func:`compact_run` did: merged partitions, and (table, iteration) left alone because uncommitted."""

    run_id: str
    compacted: list[PartitionCompaction] = field(default_factory=list)
    skipped_uncommitted: list[tuple[str, int]] = field(default_factory=list)

    @property
    def files_removed(self) -> int:
        return sum(c.files_before - 1 for c in self.compacted)


def recover_partition(lake: DataLake, spec: TableSpec, folder: Path) -> None:
    """Finish a compaction of ``folder`` that passed its commit point, or clear the leftovers of one that did not.
    The marker is checked first (:mod:`ragen_core.storage.layout`): only plain part names of this folder, and only
    when the merged file holds exactly the rows of those still present (:func:`_check_merged_holds`), are deleted."""
    check_real_folder(folder, "partition folder")
    for leftover in folder.glob(f".{MERGED_PREFIX}*.tmp-*"):
        leftover.unlink(missing_ok=True)
    marker = read_marker(folder)
    if marker is not None and (folder / marker["merged"]).is_file():
        present = {p.name for p in part_files(folder)}
        hidden_names = superseded(folder, present | {marker["merged"]})
        hidden = [name for name in marker["replaces"] if name in hidden_names]  # in the marker's (merge) order
        if hidden:
            _check_merged_holds(lake, spec, folder, marker, hidden)
        delete_replaced(folder, hidden)


def _check_merged_holds(lake: DataLake, spec: TableSpec, folder: Path, marker: dict, present: list[str]) -> None:
    """Before a replaced file is deleted for good, its rows must be in the merged file, not just as many of them (a
    forged merged file of the right size would otherwise take them with it). A compaction writes the replaced files'
    rows in the marker's order and deletes them in that order, so those still present are the marker's last names
    and their rows, in the current schema, the merged file's last rows; anything else raises, naming the marker."""
    replaces = marker["replaces"]
    marker_path = compaction_marker(folder)
    merged = read_part(folder / marker["merged"], spec, lake.upgrades)
    tail = pa.concat_tables([read_part(folder / name, spec, lake.upgrades) for name in present])
    tail = tail.cast(spec.arrow_schema)
    if replaces[len(replaces) - len(present) :] != present or not _same_rows(
        merged.slice(merged.num_rows - tail.num_rows), tail
    ):
        raise LakeError(
            f"compaction marker {str(marker_path)!r} names {marker['merged']!r} as the merged file of {present}, but "
            "it does not hold their rows; nothing was deleted: it was changed by hand or planted; move it out of "
            "the data root, then try again"
        )


def _same_rows(left: pa.Table, right: pa.Table) -> bool:
    """Whether two tables hold the same rows in the same order (NaN equal to NaN, chunking and metadata ignored)."""
    if left.num_rows != right.num_rows or left.column_names != right.column_names:
        return False
    return json.dumps(left.to_pylist(), default=repr) == json.dumps(right.to_pylist(), default=repr)


def delete_replaced(folder: Path, names: list[str]) -> None:
    """Step 4: delete the files the merged file replaced (absent ones are fine: a redo after a crash), then take
    them out of the partition's record of published parts."""
    for name in names:
        (folder / name).unlink(missing_ok=True)
    fsync_dir(folder)
    if names:
        record_parts(folder, {}, names)


def compact_partition(lake: DataLake, spec: TableSpec, folder: Path) -> PartitionCompaction | None:
    """Merge the visible part files of one partition folder into one (steps 1-4 above); None when there is at most
    one file."""
    recover_partition(lake, spec, folder)
    files = sorted(trusted_parts(part_files(folder), spec, layout_state(lake.root)[1]))
    if len(files) < 2:
        return None
    merged = pa.concat_tables([read_part(f, spec, lake.upgrades) for f in files])
    # the current schema, with its version and column descriptions in the metadata
    merged = merged.cast(spec.arrow_schema).replace_schema_metadata(spec.arrow_schema.metadata)
    names = [f.name for f in files]
    name = merged_name(names)
    atomic_write_json(compaction_marker(folder), {"merged": name, "replaces": names, "rows": merged.num_rows})
    fsync_dir(folder)
    # the commit point: one rename, the merged file recorded as published just before it
    atomic_write_parquet(folder / name, merged, lambda size: record_parts(folder, {name: size}))
    fsync_dir(folder)
    delete_replaced(folder, names)
    return PartitionCompaction(spec.name, _iteration_of(folder), len(files), merged.num_rows, name)


def compact_run(lake: DataLake, run_id: str, tables: list[str] | None = None) -> CompactionReport:
    """Compact every committed iteration of ``run_id`` in ``tables`` (default: every Parquet table)."""
    validate_run_id(run_id)
    specs = [lake.spec(t) for t in tables] if tables else [s for s in lake.tables.values() if s.source == "parquet"]
    committed = set(lake.committed_iterations(run_id))
    report = CompactionReport(run_id)
    try:
        with run_lock(lake, run_id), _sole_writer(lake, run_id):
            for spec in specs:  # the whole run's layout, markers and keys checked before anything changes
                lake.read_table(spec.name, run_id)  # the read path refuses a key held twice (storage.keys)
            _compact_tables(lake, run_id, specs, committed, report)
            lake.publish_rewrite(run_id)  # a data root in a bucket: every partition's rewrite, committed at once
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise LakeError(
            f"cannot compact run {run_id!r}: {exc.strerror or exc}{where}; the data root must be "
            "writable (readers still see every row exactly once)"
        ) from exc
    return report


@contextmanager
def _sole_writer(lake: DataLake, run_id: str) -> Iterator[None]:
    """Hold the run's writer lock while its files are merged (a run with a folder of its own). A run being written
    (trained, resumed, extended: an extension reopens its last committed iteration) refuses the compaction, naming
    its writer; a command that would write the run while it is compacted is refused at its start, before it
    changes anything (:mod:`ragen_core.storage.locks`)."""
    if not lake.run_dir(run_id).is_dir() and store_copy(lake.root) is None:  # a bucket's run: always its lease
        yield
        return
    try:
        lock = acquire(lake.root, run_id)
    except RunLockedError:
        holder = read_holder(lock_path(lake.root.resolve(), run_id)) or {}
        raise RunLockedError(
            f"cannot compact run {run_id!r} now: it is being written by pid {holder.get('pid')} on host "
            f"{holder.get('host')} (`{holder.get('command')}`); run `ragen runs compact {run_id}` again once that "
            "command has finished"
        ) from None
    try:
        yield
    finally:
        release(lock)


def _compact_tables(
    lake: DataLake, run_id: str, specs: list[TableSpec], committed: set[int], report: CompactionReport
) -> None:
    """Compact every committed partition of the run in ``specs`` (the run lock held), adding to ``report``."""
    for spec in specs:
        check_real_folder(lake.table_dir(spec.name), "table folder")
        run_folder = lake.run_partition_dir(spec.name, run_id)  # the run's own folder, never a pattern
        for iteration, folder in list(iteration_folders(run_folder)):
            if iteration not in committed:
                report.skipped_uncommitted.append((spec.name, iteration))
                continue
            result = compact_partition(lake, spec, folder)
            if result is not None:
                report.compacted.append(result)


def _iteration_of(folder: Path) -> int:
    return partition_of(compaction_marker(folder))[1]
